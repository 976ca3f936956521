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

What does not: ROLL's environments are GEM gym environments that make their own task on
`reset(seed)`, and its env managers size the batch in environment groups
(num_env_groups x group_size episodes). hybrid's episodes start from dataset rows
(data.train_files, rollout_batch_size prompts x num_return_sequences_in_group), each with an
environment answering chat turns (skyrl-gym's BaseTextEnv contract), so those keys are refused.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.environments import ENV_KWARGS, MULTI_TURN, check_environment
from hybrid.dialects.table import Context, Refusal, Rule, custom, ignore, refuse

MANAGERS = ("train_env_manager", "val_env_manager")
TRAJECTORY_MANAGER = "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager"
ENV_DRIVEN = (
    "ROLL's environment-driven rollout (each episode's task comes from env.reset(seed), the batch is "
    "num_env_groups x group_size episodes); hybrid's episodes start from dataset rows "
    "(data_args.file_name), rollout_batch_size prompts x num_return_sequences_in_group"
)
TEMPLATES = (
    "ROLL's env manager renders each observation into a prompt with these templates; hybrid's "
    "environments return the chat messages themselves (init(prompt), step(...)['observations'])"
)
MAPPED = "env_type, max_steps, max_tokens_per_step, env_config.*, env_manager_cls, max_env_step_concurrent"


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


def _whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Refusal(f"a whole number >= 1 ({what})")
    return value


def _max_steps(value: Any, ctx: Context) -> dict[str, Any]:
    turns = _whole(value, "actions, that is model turns, per episode")
    return {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.max_assistant_turns": turns}


MAX_NEW_TOKENS = "actor_infer.generating_args.max_new_tokens"


def _agentic(ctx: Context) -> bool:
    return any(key.startswith("custom_envs.") for key in ctx.given)


def _tokens_per_step(value: Any, ctx: Context) -> dict[str, Any]:
    # ROLL's env manager caps each turn at min(max_tokens_per_step, generating_args.max_new_tokens, what is left)
    turn = _whole(value, "tokens per model turn")
    cap = ctx.get(MAX_NEW_TOKENS, None)
    turn = min(turn, cap) if isinstance(cap, int) and not isinstance(cap, bool) else turn
    return {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.max_tokens_per_turn": turn}


def _max_new_tokens(value: Any, ctx: Context) -> dict[str, Any]:
    """actor_infer.generating_args.max_new_tokens: the response budget (RLVR); in the agentic
    pipeline a cap on each turn, which custom_envs' max_tokens_per_step rule applies."""
    if not _agentic(ctx):
        return {"data.max_response_length": value}
    if any(key.endswith(".max_tokens_per_step") and key.startswith("custom_envs.") for key in ctx.given):
        return {}
    return {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.max_tokens_per_turn": _whole(value, "tokens per model turn")}


def _env_type(value: Any, ctx: Context) -> dict[str, Any]:
    hint = f"ROLL's GEM environment {value!r} (gym reset/step) is not in hybrid"
    return {f"{MULTI_TURN}.enable": True, f"{MULTI_TURN}.env_class": check_environment(value, hint)}


def _env_config(value: Any, ctx: Context) -> dict[str, Any]:
    tag = _tag(ctx)
    env = ctx.get(f"custom_envs.{tag}.env_type", None)
    if not isinstance(env, str) or not env:
        raise Refusal(f"needs custom_envs.{tag}.env_type: the settings go to that environment's section")
    leaf = ctx.key[len(f"custom_envs.{tag}.env_config.") :]
    return {f"{ENV_KWARGS}.{env}.{leaf}": value}


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
            "N -> enable=true, max_assistant_turns=N",
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
            "a hybrid environment name (or path/to/env.py:ClassName) -> multi_turn.env_class",
            "ROLL's GEM environments (sokoban, frozen_lake, webshop, ...) are refused: hybrid's environments "
            "answer chat turns from dataset rows",
        ),
        custom(
            f"{section}.env_config.*",
            (f"{ENV_KWARGS}.<env_type>.<key>",),
            _when_used(_env_config),
            "same names below env_kwargs.<env_type>",
            "the environment's own section of env_kwargs",
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
        custom(f"{section}.agent_system_template", (), _when_used(_templates), "null accepted", TEMPLATES),
        custom(f"{section}.agent_template", (), _when_used(_templates), "null accepted", TEMPLATES),
        custom(
            "custom_envs.*",
            (),
            _when_used(_other_env_key),
            "other keys refused in a section that is read; a section no env manager lists is accepted unread",
        ),
    )


def _manager_rules(manager: str) -> tuple[Rule, ...]:
    return (
        custom(f"{manager}.tags", (), _tags, "selects the custom_envs sections that are read"),
        ignore(f"{manager}.max_env_num_per_worker", "ROLL's environment workers; hybrid steps environments in threads"),
        ignore(f"{manager}.worker_cls", "ROLL's environment workers"),
        ignore(f"{manager}.llm_proxy.*", "ROLL's route to the policy; hybrid's environments answer the policy's turns"),
        refuse(f"{manager}.format_penalty", "hybrid's environments score the format themselves", accept=(0, 0.0)),
        refuse(f"{manager}.*", ENV_DRIVEN),
    )


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
        refuse("render_save_dir", "hybrid renders no environment frames", accept=(None,)),
        refuse(
            "reward_normalization.method",
            "hybrid does not normalise environment rewards before the advantage estimator",
            accept=("identity",),
        ),
        ignore("reward_normalization.grouping", "read only with reward_normalization.method, which is refused"),
        ignore(
            "batch_adjust_mode",
            "hybrid's batch is always rollout_batch_size x num_return_sequences_in_group "
            "trajectories; nothing to adjust",
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
