"""ROLL's agentic-pipeline keys (custom_envs, train_env_manager, val_env_manager and the
agentic top-level keys) as rules of the ROLL dialect, onto hybrid's
`actor_rollout_ref.rollout.multi_turn`.

What carries over: an environment section `custom_envs.<tag>` gives the per-episode limits
(`max_steps`: model turns, `max_tokens_per_step`: one turn's token budget), the environment
(`env_type`, when it names an environment hybrid has) and its constructor settings
(`env_config`, which become that environment's section of `multi_turn.env_kwargs`). Only the
sections the env managers list in `tags` are read, as in ROLL (ROLL's example files define
many); without any `tags` every section is read. hybrid has one multi_turn section for
training and validation, so two sections that disagree are reported as two keys setting one
verl key to different values.

Episodes from seeds. ROLL's environments make their own task on `reset(seed)`, and its env
managers size the batch in environment groups: `num_env_groups` groups of `group_size`
episodes, split between the `tags` by `num_groups_partition`, env config and seed equal within
a group; `rollout_batch_size` / `val_batch_size` count trajectories. When an env manager gives
those keys and every environment it lists makes its task from a seed (hybrid's `sokoban` and
`frozen_lake`, reward/environments/), its episodes become seed rows: data.train_files /
data.val_files is the spec `env-seeds:rows=R&seed=S&groups=env/tag*count,...`
(hybrid/env_seeds.py, read by the data loader; nothing is written), one row per group,
rollout.n (val_kwargs.n) = group_size, data.train_batch_size = rollout_batch_size / group_size
rows, data.val_batch_size = val_batch_size / group_size. Training gets max_steps x that many
rows, each with a fresh seed drawn from `seed`; validation val_batch_size / group_size rows from
`seed` + 1, the same boards at every validation. The row names its environment (env_class) and
tag; the tag's settings are in multi_turn.env_kwargs.tags.<tag>: env_config, and what ROLL's
env manager reads (max_steps as max_actions, max_tokens_per_step, agent_system_template,
agent_template: the grid games render their turns with them, as TrajEnvManager does). Lookup
tables (grid_lookup, grid_vocab) travel as [[key, value], ...] lists. ROLL's episode score is
the sum of the step rewards, hybrid's reward_placement=final.

Rewards: reward_normalization (grouping traj_group_id: the episodes of one seed row) with
adv_estimator grpo/reinforce and whiten_advantages map onto hybrid's estimators (agentic_advantage);
group normalisation followed by whitening has no hybrid equivalent and is refused.

What does not: other environments (GEM's webshop, ...), environments that start from dataset
rows (hybrid's own: with them the env managers' tags only select sections and the group keys are
refused), one manager from seeds and the other from rows, per-step estimators (GiGPO).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.environments import ENV_KWARGS, MULTI_TURN, check_environment
from hybrid.dialects.roll_batches import _adjust_mode
from hybrid.dialects.roll_episodes import (
    EPISODE_KEYS,
    GRID_GAMES,
    ROLLOUT,
    TABLES,
    TAGS,
    _agentic,
    _episodes,
    _read_with_estimator,
    _whole,
    env_driven,
)
from hybrid.dialects.table import Context, Refusal, Rule, custom, ignore, refuse

MANAGERS = ("train_env_manager", "val_env_manager")
TRAJECTORY_MANAGER = "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager"
TEMPLATES = (
    "ROLL's env manager renders each observation into a prompt with these templates; hybrid's "
    "environments return the chat messages themselves (init(prompt), step(...)['observations'])"
)
TEMPLATES_NOTE = (
    "the grid games render their turns with them as ROLL's TrajEnvManager does; other environments return "
    "their chat messages themselves"
)
MAPPED = (
    "env_type, max_steps, max_tokens_per_step, env_config.*, env_manager_cls, max_env_step_concurrent, "
    "agent_system_template, agent_template"
)


def _tag(ctx: Context) -> str:
    return ctx.key.split(".")[1]


def _used(ctx: Context) -> bool:
    """Whether this custom_envs section is read: listed in an env manager's tags (or no tags given)."""
    listed = [ctx.get(f"{m}.tags") for m in MANAGERS if ctx.has(f"{m}.tags")]
    if not listed:
        return True
    return any(isinstance(tags, list) and _tag(ctx) in tags for tags in listed)


def _when_used(convert):
    """A section's rule that writes nothing for a section no env manager lists."""

    def wrapped(value: Any, ctx: Context) -> dict[str, Any]:
        return convert(value, ctx) if _used(ctx) else {}

    return wrapped


def _grid_game(ctx: Context) -> bool:
    """Whether this section's environment is one of hybrid's grid games (settings in env_kwargs.tags.<tag>)."""
    return ctx.get(f"custom_envs.{_tag(ctx)}.env_type", None) in GRID_GAMES


def _max_steps(value: Any, ctx: Context) -> dict[str, Any]:
    turns = _whole(value, "actions, that is model turns, per episode")
    out = {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.max_assistant_turns": turns}
    return out | ({f"{TAGS}.{_tag(ctx)}.max_actions": turns} if _grid_game(ctx) else {})


MAX_NEW_TOKENS = "actor_infer.generating_args.max_new_tokens"


def _tokens_per_step(value: Any, ctx: Context) -> dict[str, Any]:
    # ROLL's env manager caps each turn at min(max_tokens_per_step, generating_args.max_new_tokens, what is left)
    turn = _whole(value, "tokens per model turn")
    cap = ctx.get(MAX_NEW_TOKENS, None)
    turn = min(turn, cap) if isinstance(cap, int) and not isinstance(cap, bool) else turn
    out = {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.max_tokens_per_turn": turn}
    # the templates' {max_response_length} is the section's own value, as ROLL renders it
    return out | ({f"{TAGS}.{_tag(ctx)}.max_tokens_per_step": value} if _grid_game(ctx) else {})


def _max_new_tokens(value: Any, ctx: Context) -> dict[str, Any]:
    """actor_infer.generating_args.max_new_tokens: in the agentic pipeline a cap on each turn, which
    custom_envs' max_tokens_per_step rule applies; the RLVR pipeline replaces it with
    sequence_length - prompt_length (RLVRConfig.__post_init__), so there it is not read."""
    if not _agentic(ctx):
        return {}
    if any(key.endswith(".max_tokens_per_step") and key.startswith("custom_envs.") for key in ctx.given):
        return {}
    return {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.max_tokens_per_turn": _whole(value, "tokens per model turn")}


def _env_type(value: Any, ctx: Context) -> dict[str, Any]:
    hint = f"ROLL's GEM environment {value!r} (gym reset/step) is not in hybrid"
    name = check_environment(value, hint)
    if env_driven(ctx) or env_driven(ctx, "val_env_manager"):
        return {f"{MULTI_TURN}.enable": True}  # each seed row names its environment (env_class column)
    return {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.env_class": name}


def _env_config(value: Any, ctx: Context) -> dict[str, Any]:
    tag = _tag(ctx)
    env = ctx.get(f"custom_envs.{tag}.env_type", None)
    if not isinstance(env, str) or not env:
        raise Refusal(f"needs custom_envs.{tag}.env_type: the settings go to that environment's section")
    prefix = f"custom_envs.{tag}.env_config."
    leaf = ctx.key[len(prefix) :]
    if env not in GRID_GAMES:
        return {f"{ENV_KWARGS}.{env}.{leaf}": value}
    top = leaf.split(".", 1)[0]
    if top in TABLES and leaf != top:
        # the whole table, from every key below it (its keys may be "." or "0": the rest of the dotted key)
        below = f"{prefix}{top}."
        pairs = [[key[len(below) :], v] for key, v in ctx.given.items() if key.startswith(below)]
        return {f"{TAGS}.{tag}.{top}": pairs}
    return {f"{TAGS}.{tag}.{leaf}": value}


def _env_manager(value: Any, ctx: Context) -> dict[str, Any]:
    if value in (None, TRAJECTORY_MANAGER):
        return {}
    raise Refusal(
        f"hybrid trains one sample per trajectory, as ROLL's TrajEnvManager ({TRAJECTORY_MANAGER}); "
        f"step-wise samples (StepEnvManager, GiGPO) and agent-native managers have no equivalent"
    )


def _step_workers(value: Any, ctx: Context) -> dict[str, Any]:
    return {f"{MULTI_TURN}.env_workers": _whole(value, "concurrent environment steps")}


def _templates(value: Any, ctx: Context) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if _grid_game(ctx):
        return {f"{TAGS}.{_tag(ctx)}.{ctx.key.rsplit('.', 1)[1]}": value}
    raise Refusal(TEMPLATES)


def _other_env_key(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None or value == {}:
        return {}  # an empty section
    raise Refusal(f"an environment setting hybrid has no key for (mapped: {MAPPED})")


def _tags(value: Any, ctx: Context) -> dict[str, Any]:
    tags = [value] if isinstance(value, str) else value
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise Refusal("a list of custom_envs section names")
    missing = [t for t in tags if not any(k.startswith(f"custom_envs.{t}.") for k in ctx.given)]
    if missing:
        raise Refusal(f"no custom_envs section for {', '.join(missing)}")
    return {}


def _section_rules() -> tuple[Rule, ...]:
    section = "custom_envs.<tag>"
    return (
        custom(
            f"{section}.max_steps",
            (f"{MULTI_TURN}.enable", f"{MULTI_TURN}.max_assistant_turns"),
            _when_used(_max_steps),
            "N -> enable=true, max_assistant_turns=N (sokoban/frozen_lake: also env_kwargs.tags.<tag>.max_actions)",
            "one ROLL step is one action, a model turn",
        ),
        custom(
            f"{section}.max_tokens_per_step",
            (f"{MULTI_TURN}.max_tokens_per_turn",),
            _when_used(_tokens_per_step),
            "same value",
            "the trajectory's budget stays sequence_length - prompt_length (data.max_response_length)",
        ),
        custom(
            f"{section}.env_type",
            (f"{MULTI_TURN}.env_class",),
            _when_used(_env_type),
            "a hybrid environment name (or path/to/env.py:ClassName) -> multi_turn.env_class; with episodes "
            "from seeds each row's env_class instead",
            "ROLL's sokoban and frozen_lake are hybrid's (reward/environments/, boards from seeds); other GEM "
            "environments (webshop, ...) are refused",
        ),
        custom(
            f"{section}.env_config.*",
            (f"{ENV_KWARGS}.<env_type>.<key>",),
            _when_used(_env_config),
            "same names below env_kwargs.<env_type>; sokoban/frozen_lake: below env_kwargs.tags.<tag> "
            "(lookup tables as [[key, value], ...])",
            "the environment's own section of env_kwargs; the grid games read each tag's own settings",
        ),
        custom(f"{section}.env_manager_cls", (), _when_used(_env_manager), "TrajEnvManager accepted"),
        refuse(
            f"{section}.agent_runner_cls",
            "ROLL's agent runners (its proxy env manager) have no counterpart; hybrid's environments answer turns",
            accept=(None,),
        ),
        custom(
            f"{section}.max_env_step_concurrent",
            (f"{MULTI_TURN}.env_workers",),
            _when_used(_step_workers),
            "same value",
            "hybrid's pool of threads that run environment steps",
        ),
        custom(
            f"{section}.use_thread_lock",
            (),
            lambda v, c: {},
            "accepted",
            "each of hybrid's environments is stepped by one thread at a time",
        ),
        custom(
            f"{section}.agent_system_template",
            (f"{ENV_KWARGS}.tags.<tag>.agent_system_template",),
            _when_used(_templates),
            "sokoban/frozen_lake: same value; null accepted; other environments refused",
            TEMPLATES_NOTE,
        ),
        custom(
            f"{section}.agent_template",
            (f"{ENV_KWARGS}.tags.<tag>.agent_template",),
            _when_used(_templates),
            "sokoban/frozen_lake: same value; null accepted; other environments refused",
            TEMPLATES_NOTE,
        ),
        custom(
            "custom_envs.*",
            (),
            _when_used(_other_env_key),
            "other keys refused in a section that is read; a section no env manager lists is accepted unread",
        ),
    )


def _manager_rules(manager: str) -> tuple[Rule, ...]:
    files = "data.train_files" if manager == "train_env_manager" else "data.val_files"
    n = f"{ROLLOUT}.n" if manager == "train_env_manager" else f"{ROLLOUT}.val_kwargs.n"
    how = (
        "seed rows: data files `env-seeds:rows=R&seed=S&groups=env/tag*count,...` (hybrid/env_seeds.py), "
        "one row per group, group_size samples of each"
    )
    episode_rules = tuple(
        custom(
            f"{manager}.{key}",
            (files, n),
            _chain(_tags, _episodes(manager)) if key == "tags" else _episodes(manager),
            how if key == "tags" else "read with tags",
            "as ROLL: the env config and seed are equal within a group; num_groups_partition splits the groups "
            "between the tags",
        )
        for key in EPISODE_KEYS
    )
    return (
        *episode_rules,
        ignore(f"{manager}.max_env_num_per_worker", "ROLL's environment workers; hybrid steps environments in threads"),
        ignore(f"{manager}.worker_cls", "ROLL's environment workers"),
        ignore(f"{manager}.llm_proxy.*", "ROLL's route to the policy; hybrid's environments answer the policy's turns"),
        ignore(
            f"{manager}.format_penalty",
            "ROLL reads it nowhere (EnvManagerConfig only declares it); the penalty applied is each environment's "
            "env_config.format_penalty",
        ),
        refuse(
            f"{manager}.group_size_redundancy",
            "ROLL runs extra environments per group and keeps the first to finish; hybrid runs each group's "
            "episodes to the end",
            accept=(0,),
        ),
        refuse(
            f"{manager}.max_traj_per_env",
            "ROLL's cap on the episodes one environment plays per step; hybrid makes one environment per episode",
            accept=(-1,),
        ),
        refuse(
            f"{manager}.*",
            "an env manager setting hybrid has no key for (mapped: num_env_groups, group_size, tags, "
            "num_groups_partition, from seeds with sokoban and frozen_lake)",
        ),
    )


def _chain(first, second):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        return first(value, ctx) | second(value, ctx)

    return convert


# Top-level variables of ROLL's example files (examples/config/traj_envs.yaml), read through
# ${...} in custom_envs; the keys that read them are translated, the variables themselves not.
_VARIABLES = (
    "max_actions_per_traj",
    "max_tokens_per_step",
    "env_manager_cls",
    "action_pattern",
    "think_action_pattern",
    "all_response_pattern",
    "sokoban_format_penalty",
    "frozen_format_penalty",
    "agent_system_template",
    "agent_template",
    "single_prompt_agent_system_template",
    "single_prompt_agent_template",
)


def _ratio_type(value: Any, ctx: Context) -> dict[str, Any]:
    if value == "token":
        return {}
    raise Refusal("hybrid's importance ratio is per token (segment ratios have no key)")


def _top_level_rules() -> tuple[Rule, ...]:
    return (
        *(
            ignore(name, "a YAML variable of ROLL's example environment files, read through custom_envs")
            for name in _VARIABLES
        ),
        ignore(
            "render_save_dir",
            "ROLL reads it nowhere beyond adding a timestamp to the path (its environments save no frames)",
        ),
        custom(
            "reward_normalization.method",
            ("algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo"),
            _read_with_estimator,
            "read with adv_estimator and whiten_advantages (see adv_estimator)",
        ),
        custom(
            "reward_normalization.grouping",
            ("algorithm.adv_estimator",),
            _read_with_estimator,
            "traj_group_id: hybrid's groups (the episodes of one seed row); batch",
        ),
        custom("reward_normalization.norm_mean_type", ("algorithm.adv_estimator",), _read_with_estimator, "as method"),
        custom("reward_normalization.norm_std_type", ("algorithm.adv_estimator",), _read_with_estimator, "as method"),
        custom(
            "batch_adjust_mode",
            ("algorithm.batch_adjust.mode",),
            _adjust_mode,
            "copy, delete, auto, random_sample: read with rollout_batch_size",
            "how ROLL's agentic pipeline brings a batch to a multiple of its workers' batches (roll_batches.py)",
        ),
        ignore("episode_reward_weight", "read only by step-wise estimators (gigpo), which are refused"),
        ignore("step_reward_weight", "read only by step-wise estimators (gigpo), which are refused"),
        ignore("step_reward_gamma", "read only by step-wise estimators (gigpo, step_reinforce), which are refused"),
        custom("ratio_type", (), _ratio_type, "token accepted"),
    )


AGENTIC_RULES = (
    *_section_rules(),
    *(rule for manager in MANAGERS for rule in _manager_rules(manager)),
    *_top_level_rules(),
)

__all__ = ["AGENTIC_RULES", "TRAJECTORY_MANAGER"]
