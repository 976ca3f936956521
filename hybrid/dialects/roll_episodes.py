"""ROLL's agentic episodes in hybrid's units (the ROLL dialect; roll_agentic.py has the rules):
env managers whose environments make their task from a seed become seed rows
(hybrid/env_seeds.py), ROLL's trajectory batches become batches of groups, and ROLL's agentic
reward normalisation is read with adv_estimator and whiten_advantages (roll_convert's
_advantage calls agentic_advantage). roll_agentic.py's docstring describes the mapping.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.environments import ENV_KWARGS
from hybrid.dialects.table import Context, Refusal
from hybrid.env_seeds import make_spec

ENV_DRIVEN = (
    "ROLL's environment-driven rollout (each episode's task comes from env.reset(seed), the batch is "
    "num_env_groups x group_size episodes); hybrid's episodes start from dataset rows "
    "(data_args.file_name), rollout_batch_size prompts x num_return_sequences_in_group"
)
ROLLOUT = "actor_rollout_ref.rollout"
# hybrid's environments that read ROLL's per-section settings from env_kwargs.tags.<tag> (grid_game.py)
GRID_GAMES = ("sokoban", "frozen_lake")
TAGS = f"{ENV_KWARGS}.tags"
# Settings that are lookup tables: Hydra's override grammar cannot quote keys such as "." or "0", so a
# table travels as a list of [key, value] pairs (reward/environments/grid_game.py reads both forms).
TABLES = ("grid_lookup", "grid_vocab", "action_lookup", "map_lookup")
# ROLL's EnvManagerConfig defaults (roll/pipeline/agentic/agentic_config.py) and BaseConfig's seed.
MANAGER_DEFAULTS = {"num_env_groups": 128, "group_size": 1, "tags": ["SimpleSokoban"], "num_groups_partition": [128]}
EPISODE_KEYS = tuple(MANAGER_DEFAULTS)
ROLL_SEED = 42


def _whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Refusal(f"a whole number >= 1 ({what})")
    return value


def _agentic(ctx: Context) -> bool:
    return any(key.startswith("custom_envs.") for key in ctx.given)


def _manager_envs(ctx: Context, manager: str) -> list[Any]:
    tags = _manager_value(ctx, manager, "tags")
    return [ctx.get(f"custom_envs.{tag}.env_type", None) for tag in ([tags] if isinstance(tags, str) else tags)]


def env_driven(ctx: Context, manager: str = "train_env_manager") -> bool:
    """Whether the env manager's episodes come from seeds: any of its group keys given and every
    environment it lists makes its task from a seed (hybrid's grid games). Otherwise its tags only
    select the custom_envs sections read, and the episodes start from the data files' rows."""
    given = any(ctx.has(f"{manager}.{key}") for key in EPISODE_KEYS)
    return given and all(env in GRID_GAMES for env in _manager_envs(ctx, manager))


def _manager_value(ctx: Context, manager: str, key: str) -> Any:
    full = f"{manager}.{key}"
    return ctx.get(full) if ctx.has(full) else MANAGER_DEFAULTS[key]


def group_size(ctx: Context, manager: str = "train_env_manager") -> int:
    return _whole(_manager_value(ctx, manager, "group_size"), f"{manager}.group_size")


def _batch_groups(ctx: Context, key: str, manager: str) -> int:
    """ROLL's agentic batch (trajectories) in hybrid's units: groups of group_size, one row each."""
    value = ctx.get(key, None)
    size = group_size(ctx, manager)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Refusal(f"{key}={value!r}: a whole number of trajectories >= 1 (ROLL's agentic batch)")
    if value % size:
        raise Refusal(
            f"{key}={value} trajectories is not a whole number of groups of {manager}.group_size={size} "
            f"(ROLL asserts it; hybrid samples each seed row group_size times)"
        )
    return value // size


def train_prompts(ctx: Context) -> int:
    """The training batch in prompts (data.train_batch_size): rollout_batch_size prompts (RLVR), or
    rollout_batch_size / group_size seed rows (agentic, env-driven)."""
    if env_driven(ctx):
        return _batch_groups(ctx, "rollout_batch_size", "train_env_manager")
    return ctx.effective("rollout_batch_size", "data.train_batch_size")


def samples_per_prompt(ctx: Context) -> int:
    """Samples per prompt (rollout.n): num_return_sequences_in_group, or the env groups' group_size."""
    if env_driven(ctx):
        return group_size(ctx)
    return ctx.effective("num_return_sequences_in_group", f"{ROLLOUT}.n")


def _train_batch(value: Any, ctx: Context) -> dict[str, Any]:
    return {"data.train_batch_size": train_prompts(ctx)}


def _val_batch(value: Any, ctx: Context) -> dict[str, Any]:
    if not env_driven(ctx, "val_env_manager"):
        return {"data.val_batch_size": value}
    groups = _batch_groups(ctx, "val_batch_size", "val_env_manager")
    envs = _manager_value(ctx, "val_env_manager", "num_env_groups") * group_size(ctx, "val_env_manager")
    if value % envs:
        raise Refusal(
            f"val_batch_size={value} is not divisible by val_env_manager's num_env_groups x group_size = {envs} "
            f"(ROLL asserts it)"
        )
    return {"data.val_batch_size": groups}


def _groups(ctx: Context, manager: str) -> list[tuple[str, str, int]]:
    """[(environment, tag, number of groups)] as ROLL's make_env_configs splits num_env_groups."""
    tags = _manager_value(ctx, manager, "tags")
    tags = [tags] if isinstance(tags, str) else tags
    partition = _manager_value(ctx, manager, "num_groups_partition")
    total = _whole(_manager_value(ctx, manager, "num_env_groups"), f"{manager}.num_env_groups")
    if not isinstance(partition, list) or not all(isinstance(n, int) and n >= 0 for n in partition):
        raise Refusal(f"{manager}.num_groups_partition: a list of group counts, one per tag")
    pairs = [(tag, count) for tag, count in zip(tags, partition, strict=False) if count]
    if sum(count for _, count in pairs) != total:
        raise Refusal(
            f"{manager}.num_groups_partition={partition} over tags {tags} gives "
            f"{sum(c for _, c in pairs)} groups, not num_env_groups={total} (ROLL asserts they are equal)"
        )
    out = []
    for tag, count in pairs:
        env = ctx.get(f"custom_envs.{tag}.env_type", None)
        if not isinstance(env, str) or not env:
            raise Refusal(f"{manager}.tags: no custom_envs.{tag}.env_type (its episodes need an environment)")
        out.append((env, tag, count))
    return out


def _episodes(manager: str):
    """The env manager's group keys -> the seed rows (data.train_files / val_files) and rollout.n."""

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        other = "val_env_manager" if manager == "train_env_manager" else "train_env_manager"
        if not env_driven(ctx, manager):
            if ctx.key.endswith(".tags"):
                return {}
            envs = sorted({str(env) for env in _manager_envs(ctx, manager) if env not in GRID_GAMES})
            raise Refusal(
                f"{ENV_DRIVEN}; episodes from seeds need environments that make their task from one "
                f"({', '.join(GRID_GAMES)}), not {', '.join(envs)}"
            )
        if ctx.has(f"{other}.tags") and not env_driven(ctx, other):
            raise Refusal(
                f"{manager}'s episodes come from seeds and {other}'s from the data files' rows; hybrid's "
                f"environments are named one way for both (give {other} seeded environments and its groups)"
            )
        seed = ctx.get("seed", ROLL_SEED)
        n = group_size(ctx, manager)
        groups = _groups(ctx, manager)
        if manager == "val_env_manager":
            rows = _batch_groups(ctx, "val_batch_size", manager)
            return {"data.val_files": make_spec(groups, rows, seed + 1), f"{ROLLOUT}.val_kwargs.n": n}
        steps = ctx.get("max_steps", None)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise Refusal(f"needs max_steps >= 1: hybrid makes the seed rows for that many steps (got {steps!r})")
        rows = steps * _batch_groups(ctx, "rollout_batch_size", manager)
        return {"data.train_files": make_spec(groups, rows, seed), f"{ROLLOUT}.n": n}

    return convert


def is_agentic(ctx: Context) -> bool:
    """An agentic pipeline file (custom_envs given): its rewards are normalised by reward_normalization."""
    return _agentic(ctx)


def _norm_types(ctx: Context) -> tuple[Any, Any]:
    """reward_normalization's (mean type, std type), as RewardNormalizationConfig derives them from method
    and grouping when norm_mean_type / norm_std_type are not given."""
    method = ctx.get("reward_normalization.method", "identity")
    grouping = str(ctx.get("reward_normalization.grouping", "batch") or "").lower()
    scope = "batch" if grouping == "batch" else "group"
    derived = {
        "identity": (None, None),
        "mean": (scope, None),
        "mean_std": (scope, scope),
        "asym_clip": (scope, scope),
    }.get(method, (None, None))
    mean = ctx.get("reward_normalization.norm_mean_type", None) or derived[0]
    std = ctx.get("reward_normalization.norm_std_type", None) or derived[1]
    return mean, std


def agentic_advantage(ctx: Context) -> dict[str, Any]:
    """adv_estimator with reward_normalization and whiten_advantages in ROLL's agentic pipeline
    (roll/pipeline/agentic/utils.py): each episode's score is normalised (grouping traj_group_id:
    within its group of group_size episodes, the seed row here), grpo and reinforce both take
    that as every token's return (gamma 1), then whiten_advantages whitens over the batch
    (hybrid's algorithm.whiten_advantages, after the estimator and before advantage_clip)."""
    est, whiten = ctx.get("adv_estimator"), ctx.get("whiten_advantages")
    mean, std = _norm_types(ctx)
    grouping = ctx.get("reward_normalization.grouping", "batch")
    method = ctx.get("reward_normalization.method", "identity")
    combo = (
        f"adv_estimator={est}, reward_normalization (grouping={grouping}, method={method}: mean {mean}, std {std}), "
        f"whiten_advantages={whiten}"
    )
    if est == "gae":
        if mean is not None or std is not None:
            raise Refusal(f"{combo}: no key to normalise rewards before GAE", shared=True)
        return {"algorithm.adv_estimator": "gae"}
    if est not in ("grpo", "reinforce"):
        raise Refusal(f"{combo}: the agentic estimators mapped are grpo, reinforce and gae", shared=True)
    if mean == "group" and grouping != "traj_group_id":
        raise Refusal(
            f"{combo}: hybrid's groups are the episodes of one seed row (grouping: traj_group_id)", shared=True
        )
    if mean == "group" and samples_per_prompt(ctx) == 1:
        raise Refusal(
            f"{combo}: with groups of one episode (group_size 1) ROLL zeroes each normalised score, hybrid's "
            f"grpo keeps a single sample's score (verl's)",
            shared=True,
        )
    if mean == "group":
        # group-normalised episode scores as every token's advantage (hybrid's grpo), then ROLL's whitening
        return {
            "algorithm.adv_estimator": "grpo",
            "algorithm.norm_adv_by_std_in_grpo": std == "group",
            "algorithm.whiten_advantages": bool(whiten),
        }
    if mean in ("batch", None) and std in ("batch", None) and whiten:
        # whitening over the batch undoes any batch-level normalisation before it: REINFORCE++
        return {"algorithm.adv_estimator": "reinforce_plus_plus"}
    raise Refusal(
        f"{combo}: hybrid has group normalisation (-> grpo, whitened after with whiten_advantages) or whitening "
        f"of raw or batch-normalised scores (-> reinforce_plus_plus), not this combination",
        shared=True,
    )


def _read_with_estimator(value: Any, ctx: Context) -> dict[str, Any]:
    return agentic_advantage(ctx) if ctx.has("adv_estimator") else {}


__all__ = [
    "ENV_DRIVEN",
    "EPISODE_KEYS",
    "GRID_GAMES",
    "TABLES",
    "TAGS",
    "agentic_advantage",
    "env_driven",
    "group_size",
    "is_agentic",
    "samples_per_prompt",
    "train_prompts",
]
