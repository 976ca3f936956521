"""verl keys that hybrid's yaml does not spell the same way: keys verl moved (read under
hybrid's name), keys a verl script sets for hardware this trainer does not drive (Ascend NPU
profiler options, the transport of verl's checkpoint engine, the reward engine's GPU sleep, a
GPU-only vLLM block_size without CUDA: accepted, and reported at start in one line as having no
effect here), and `actor_rollout_ref.model.torch_dtype`.

`rewrite_overrides` runs on the command line's overrides before the key check
(hybrid/config/loading.py), so none of these keys needs a place in ppo_trainer.yaml and
`--cfg job` prints the keys they became.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hybrid.config.override_values import json_values

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR_PRECISION = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
TORCH_DTYPE = "actor_rollout_ref.model.torch_dtype"

# verl 0.9 moved the weight-sync bucket size into rollout.checkpoint_engine; hybrid's weight
# sync (workers/weight_sync.py) gathers and loads in buckets of the same size.
RENAMED = {
    f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes": f"{ROLLOUT}.update_weights_bucket_megabytes",
}

_NPU = "Ascend NPU profiler options (no NPU here: nothing is profiled through them)"
_TRANSPORT = (
    "verl's transport from trainer to engines (naive, nccl, nixl, hccl); hybrid's engine reads the "
    "trainer's weights in memory (fused worker) or from Ray's object store (asynchronous training)"
)
_REWARD_ENGINE_SLEEP = (
    "verl sleeps a GPU-served reward engine between scoring phases; hybrid's reward engine runs on "
    "CPU cores only in this version (a GPU-served reward model is refused at start), where vLLM has no sleep mode"
)
# (key pattern, why it changes nothing here)
NO_EFFECT = (
    (re.compile(r"^reward_model\.rollout\.free_cache_engine$"), _REWARD_ENGINE_SLEEP),
    (
        re.compile(
            r"^(actor_rollout_ref\.(actor|ref|rollout)|critic|reward_model)\.profiler\.tool_config\.npu(\..+)?$"
        ),
        _NPU,
    ),
    (re.compile(r"^global_profiler\.global_tool_config\.npu(\..+)?$"), _NPU),
    (
        re.compile(
            rf"^{re.escape(ROLLOUT)}\.checkpoint_engine(\.(backend|engine_kwargs|custom_backend_module)(\..+)?)?$"
        ),
        _TRANSPORT,
    ),
)
# ROLL's and verl's GPU examples set vLLM's block_size 16; vLLM's CPU attention refuses a size that is
# not a multiple of 32. It is the KV cache's paging layout, so on a machine without CUDA such a value
# is dropped (vLLM picks its CPU size) and named in the note.
VLLM_BLOCK = f"{ROLLOUT}.engine_kwargs.vllm.block_size"
_CPU_BLOCK = (
    "vLLM's KV-cache paging block for GPU attention; vLLM's CPU attention pages in multiples of 32 and "
    "picks its own size (a memory layout, not a sampling setting)"
)


def _cpu_block(key: str, value: str) -> bool:
    """Whether `key=value` is a vLLM block size that the CPU engine would refuse, on a machine without CUDA."""
    if key != VLLM_BLOCK:
        return False
    try:
        size = int(value.strip().strip("'\""))
    except ValueError:
        return False
    from workers.device import is_cuda_available

    return size % 32 != 0 and not is_cuda_available()


# profiler.tool=npu is a value the profiler sections accept (workers/config/profiler.py) and
# never profile with; reported with the keys above.
_NPU_TOOL = re.compile(
    r"^(global_profiler|(actor_rollout_ref\.(actor|ref|rollout)|critic|reward_model)\.profiler)\.tool$"
)

# model.torch_dtype (transformers' name for the dtype a model runs in; verl's own config has no
# such key, its nearest being fsdp_config.model_dtype, the dtype of the master weights, which
# hybrid keeps in fp32): the actor's and reference's compute dtype and the engine's dtype.
_DTYPES = {
    "bfloat16": ("bf16", "bfloat16"),
    "bf16": ("bf16", "bfloat16"),
    "float32": ("fp32", "float32"),
    "fp32": ("fp32", "float32"),
    "auto": ("auto", "auto"),
}


def _split(raw: str) -> tuple[str, str, str]:
    """(prefix '+', '++', '~' or '', key, value text) of a `key=value` override."""
    prefix = re.match(r"^(\+\+|\+|~)?", raw).group(0)
    key, _, value = raw[len(prefix) :].partition("=")
    return prefix, key, value


def _torch_dtype(value: str, problems: list[str]) -> list[tuple[str, str]]:
    name = value.strip().strip("'\"").removeprefix("torch.")
    if name not in _DTYPES:
        why = "; hybrid trains in bf16 or fp32 (no fp16 loss scaling)" if name in ("float16", "fp16", "half") else ""
        problems.append(f"{TORCH_DTYPE}={value}: not one of {', '.join(_DTYPES)}{why}")
        return []
    precision, engine = _DTYPES[name]
    return [(ACTOR_PRECISION, precision), (f"{ROLLOUT}.dtype", engine)]


def rewrite_overrides(overrides: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """(the overrides with the keys above rewritten or removed, one line naming the keys that
    have no effect here or None, the problems: a value torch_dtype cannot take, a rewritten key
    and the key it becomes both given with different values). hybrid/config/loading.py raises
    the problems as ConfigError (this module imports nothing of the config package)."""
    overrides, problems = json_values(overrides)  # engine_kwargs.vllm='{"key": value}'
    result: list[str] = []
    given: dict[str, list[tuple[str, str]]] = {}  # key written -> [(value, the override as given)]
    no_effect: dict[str, list[str]] = {}
    for raw in overrides:
        prefix, key, value = _split(raw)
        reason = next((why for pattern, why in NO_EFFECT if pattern.match(key)), None)
        if reason is not None:
            no_effect.setdefault(reason, []).append(key)
            continue
        if prefix == "~":
            result.append(raw)
            continue
        if _cpu_block(key, value):
            no_effect.setdefault(_CPU_BLOCK, []).append(f"{key}={value}")
            continue
        if _NPU_TOOL.match(key) and value.strip() == "npu":
            no_effect.setdefault(_NPU, []).append(f"{key}=npu")
        if key == TORCH_DTYPE:
            pairs = _torch_dtype(value, problems)
        elif key in RENAMED:
            pairs = [(RENAMED[key], value)]
        else:
            result.append(raw)
            given.setdefault(key, []).append((value.strip(), raw))
            continue
        for target, target_value in pairs:
            result.append(f"{target}={target_value}")
            given.setdefault(target, []).append((target_value, raw))
    problems += [
        f"{key} is given as {' and as '.join(raw for _, raw in sources)}: give one of them"
        for key, sources in given.items()
        if len({value for value, _ in sources}) > 1 and any(_split(raw)[1] != key for _, raw in sources)
    ]
    note = "; ".join(f"{', '.join(keys)}: {why}" for why, keys in no_effect.items())
    return result, (f"accepted with no effect on this hardware: {note}" if note else None), problems


__all__ = ["NO_EFFECT", "RENAMED", "TORCH_DTYPE", "VLLM_BLOCK", "rewrite_overrides"]
