"""Where the ROLL dialect's roles run and how much each step trains: device_mapping read into
verl's placement (colocated, engines apart, in turn or streamed by async_generation_ratio) and
ROLL's optimizer-step batch (per_device_train_batch_size x gradient_accumulation_steps x ranks)
read as verl's mini batch of prompts. The role key prefixes the ROLL rules share live here too.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from hybrid.dialects.asynchronous import ceil, engines_apart, in_turn_apart, streamed
from hybrid.dialects.roll_episodes import samples_per_prompt, train_prompts
from hybrid.dialects.table import Context, Refusal, hybrid_default, show

ARR = "actor_rollout_ref"
ACTOR = f"{ARR}.actor"
ROLLOUT = f"{ARR}.rollout"
REF = f"{ARR}.ref"

TRAINING_GROUP = (
    "hybrid runs the critic in the training group, on actor_train's devices; give it actor_train's device_mapping"
)

# ---------------------------------------------------------------- devices


def parse_devices(value: Any) -> list[int]:
    """A ROLL device_mapping: a list of ids, or a string such as `list(range(0,8))`."""
    if isinstance(value, (list, tuple)):
        ids = list(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*list\(\s*range\(\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?(?:,\s*(-?\d+)\s*)?\)\s*\)\s*", value)
        if m:
            bounds = [int(x) for x in m.groups() if x is not None]
            ids = list(range(*bounds))
        else:
            try:
                ids = list(ast.literal_eval(value))
            except (ValueError, SyntaxError, TypeError):
                raise Refusal("not a device list (write [0,1,...] or list(range(a,b)))") from None
    else:
        raise Refusal("not a device list (write [0,1,...] or list(range(a,b)))")
    if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise Refusal("a device list must hold device ids >= 0")
    return ids


def _nodes(ids: list[int], ctx: Context) -> tuple[int, int]:
    """(nodes, devices per node) of a device list: ROLL's ids are global, num_gpus_per_node a node."""
    per_node = ctx.get("num_gpus_per_node")
    nodes = len({i // per_node for i in ids})
    if len(ids) % nodes:
        raise Refusal(f"{len(ids)} devices over {nodes} nodes of {per_node}: hybrid needs the same number on each node")
    return nodes, len(ids) // nodes


def _placement(ids: list[int], ctx: Context) -> dict[str, Any]:
    nodes, per_node = _nodes(ids, ctx)
    return {"trainer.nnodes": nodes, "trainer.n_gpus_per_node": per_node}


def _infer_placement(ctx: Context) -> str:
    """How actor_infer's devices relate to actor_train's: same, apart, overlap, or unknown."""
    train, infer = ctx.get("actor_train.device_mapping", None), ctx.get("actor_infer.device_mapping", None)
    if train is None or infer is None:
        return "unknown"
    try:
        train_ids, infer_ids = set(parse_devices(train)), set(parse_devices(infer))
    except Refusal:
        return "unknown"  # the device_mapping rule reports it
    if train_ids == infer_ids:
        return "same"
    return "overlap" if train_ids & infer_ids else "apart"


def _device_mapping(value: Any, ctx: Context) -> dict[str, Any]:
    ids = parse_devices(value)
    if ctx.key == "actor_train.device_mapping":
        return _placement(ids, ctx)
    train = ctx.get("actor_train.device_mapping", None)
    if train is None:
        raise Refusal("hybrid places every role relative to actor_train; give actor_train.device_mapping too")
    train_ids = sorted(parse_devices(train))
    if ctx.key == "reference.device_mapping" and train_ids != sorted(ids):
        # The reference only computes log-probs of the initial policy: hybrid computes them in the
        # training group, the same values; devices given to the reference alone stay unused.
        return {}
    if ctx.key != "actor_infer.device_mapping":
        if train_ids != sorted(ids):
            raise Refusal(f"{TRAINING_GROUP} (actor_train.device_mapping={show(train)})")
        return _placement(ids, ctx)
    relation = _infer_placement(ctx)
    if relation == "same":
        return _placement(ids, ctx)  # colocated: the fused engine generates and trains in turn
    if relation == "overlap":
        if set(ids) < set(train_ids) and _ratio(ctx) == 0:
            # ROLL generates on these devices, then trains on all of actor_train's, in turn (the rest
            # of them idle while it generates, or host a reward model). Colocated on every training
            # device, hybrid samples the same responses from more engines: only the speed differs.
            print(
                f"note: actor_infer.device_mapping={show(value)} is part of actor_train's devices; hybrid "
                f"colocates its engines on all {len(train_ids)} of them (the same generation, on more engines)"
            )
            return _placement(train_ids, ctx)
        raise Refusal(
            f"shares some of actor_train's devices (actor_train.device_mapping={show(train)}) but not all: hybrid runs "
            f"the engines either on the training devices (the same device_mapping, or a part of it with "
            f"async_generation_ratio=0: colocated, generation and training in turn) or on devices of their own (a "
            f"disjoint one: asynchronous training)"
        )
    nodes, per_node = _nodes(ids, ctx)
    return {**engines_apart(nodes, per_node), **_schedule(ctx)}


def _ratio(ctx: Context) -> float:
    """async_generation_ratio, checked as ROLL checks it."""
    ratio = ctx.get("async_generation_ratio")
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or ratio < 0:
        raise Refusal(f"async_generation_ratio must be a number >= 0 (here {show(ratio)})", shared=True)
    if 0 < ratio < 1:
        raise Refusal(
            f"ROLL's RLVR pipeline requires async_generation_ratio >= 1 when it is asynchronous (0 is synchronous); "
            f"here {ratio}",
            shared=True,
        )
    if not float(ratio).is_integer() and any(k.startswith(("custom_envs.", "train_env_manager.")) for k in ctx.given):
        raise Refusal(
            f"ROLL's agentic pipeline reads async_generation_ratio as a whole number of steps; here {ratio}",
            shared=True,
        )
    return ratio


def _schedule(ctx: Context) -> dict[str, Any]:
    """The schedule of engines on devices of their own, from async_generation_ratio: 0, in turn
    (ROLL's synchronous pipeline); r > 0, streamed (ROLL's asynchronous one, see roll_rules.py)."""
    ratio = _ratio(ctx)
    if ratio == 0:
        return in_turn_apart()
    train = train_prompts(ctx)
    if ctx.has("actor_train.training_args.per_device_train_batch_size") or ctx.has(
        "actor_train.training_args.gradient_accumulation_steps"
    ):
        mini, _ = _mini_batch("actor_train", ctx)
    else:
        mini = hybrid_default(f"{ACTOR}.ppo_mini_batch_size")
    if train % mini:
        raise Refusal(
            f"with async_generation_ratio={ratio}, a ROLL step trains rollout_batch_size={train} prompts, and hybrid's "
            f"fully asynchronous step takes whole mini batches of groups ({mini} prompts here); rollout_batch_size "
            f"must be a multiple of the mini batch",
            shared=True,
        )
    # ROLL bounds the prompts in flight only by its budget: (1 + ratio) batches beyond the ones trained.
    return streamed(ahead=ratio, bound=ceil(ratio), require_batches=train // mini, in_flight=ceil((1 + ratio) * train))


def _async_generation_ratio(value: Any, ctx: Context) -> dict[str, Any]:
    relation = _infer_placement(ctx)
    if relation == "apart":
        return _schedule(ctx)
    if _ratio(ctx) == 0 or relation == "overlap":
        return {}  # colocated and synchronous, or the device_mapping rule reports the overlap
    raise Refusal(
        "hybrid generates ahead of training only with the engines on devices of their own: give actor_infer a "
        "device_mapping disjoint from actor_train's (ROLL's agentic pipeline requires that too; its RLVR pipeline "
        "only warns when they share devices)"
    )


def _world(ctx: Context) -> int:
    """actor_train's data-parallel size: its devices / ulysses_size (ROLL's FSDP2 strategy sets
    dp_size = world_size // cp_size, cp being the Ulysses group), what its optimizer-step batch
    per_device_train_batch_size x gradient_accumulation_steps is multiplied by."""
    if ctx.has("actor_train.device_mapping"):
        devices = len(parse_devices(ctx.get("actor_train.device_mapping")))
    else:
        devices = hybrid_default("trainer.nnodes") * hybrid_default("trainer.n_gpus_per_node")
    ulysses = ctx.get("actor_train.model_args.ulysses_size", 1) or 1
    return devices // ulysses if isinstance(ulysses, int) and devices % ulysses == 0 else devices


# ---------------------------------------------------------------- batches


def _mini_batch(role: str, ctx: Context) -> tuple[int, str]:
    """verl's mini batch (prompts) from ROLL's optimizer-step batch (samples)."""
    per_device = ctx.get(f"{role}.training_args.per_device_train_batch_size")
    accumulation = ctx.get(f"{role}.training_args.gradient_accumulation_steps")
    world = _world(ctx)
    n = samples_per_prompt(ctx)
    samples = per_device * accumulation * world
    what = (
        f"per_device_train_batch_size {per_device} x gradient_accumulation_steps {accumulation} x "
        f"{world} data-parallel ranks = {samples} samples per optimizer step"
    )
    if samples % n:
        raise Refusal(
            f"{what}, not a whole number of groups of num_return_sequences_in_group={n}; hybrid's "
            f"mini batch is counted in prompts (whole groups)",
            shared=True,
        )
    return samples // n, what


def _batches(role: str, mini_key: str, micro_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        mini, _ = _mini_batch(role, ctx)
        out = {mini_key: mini}
        if ctx.key.endswith("per_device_train_batch_size"):
            out[micro_key] = value
        return out

    return convert


def _betas(role: str, verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        return {verl_key: [ctx.get(f"{role}.training_args.adam_beta1"), ctx.get(f"{role}.training_args.adam_beta2")]}

    return convert
