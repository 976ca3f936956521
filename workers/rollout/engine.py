"""The rollout-engine interface: what every engine does, what each declares it can do, and the registry.

An engine is registered once, here, with an `EngineSpec`: the facts the config rules, the
preflight and the workers ask (does it run tensor parallelism, agent loops, images; which
sampling keys it lacks; which package it needs; whether it can sleep on a GPU). Nothing
outside this module compares an engine's name as a string: callers ask `engine_spec(name)`.
`build_engine` imports the engine's class only when it is built, so the driver reads the
specs without importing vLLM.

Every built engine is a `RolloutEngine`:

    capabilities       EngineCapabilities: the spec's facts resolved on this process's device
                       (sleep levels are empty on CPU: vLLM's CPU build accepts sleep/wake and
                       ignores them, so the calls are skipped, on the same code path)
    engine_dtype       the dtype its weights are held in (what the weight sync casts to)
    generate_sequences(DataProto) -> DataProto             prompts -> samples (workers/rollout/base.py)
    generate_ids(prompt_ids, settings, max_tokens, vision) token-in-token-out, one turn
    update_weights(pairs)   (HF name, full tensor) pairs loaded in place, consumed lazily
    reset_caches()          forget the prefix/KV caches (their entries were computed by old weights)
    sleep(level)            free device memory: level 1 keeps the weights on the host, level 2
                            drops them (they are replaced before the next generation anyway)
    wake_up(tags)           take memory back: ("weights",) before a load, ("kv_cache",) before
                            generating, None for both

The fused worker drives these in verl 0.9.1's order (workers/colocation.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from workers.device import is_cuda_available

if TYPE_CHECKING:
    import torch

    from protocol.data_proto import DataProto

ROLLOUT_NAME_KEY = "actor_rollout_ref.rollout.name"
WEIGHTS = "weights"
KV_CACHE = "kv_cache"


@dataclass(frozen=True)
class EngineSpec:
    """One registered engine's facts. `module`/`class_name` say where its class lives (imported
    when built). `sleep_levels_on_gpu`: the sleep levels it supports on a CUDA device (none on
    CPU). `engine_kwargs_section`: the `rollout.engine_kwargs.<section>` it reads (None: it
    reads none). `unsupported_sampling`: rollout keys with no equivalent in it (refused when set
    to anything but their off value). `package`: the import name preflight checks for."""

    name: str
    module: str
    class_name: str
    description: str
    package: str | None = None
    tensor_parallel: bool = False
    agent_loops: bool = False
    images: bool = False
    sleep_levels_on_gpu: tuple[int, ...] = ()
    engine_kwargs_section: str | None = None
    # The engine starts on the checkpoint's own architecture (a multimodal checkpoint's names
    # even when only its language model trains); False: it is built from the trained class.
    checkpoint_names: bool = False
    # The engine takes `rollout.gpu_memory_utilization` of the device when it starts.
    takes_memory_share: bool = False
    # vLLM stops a sequence at max_model_len (ROLL's max_model_len_caps_response needs that).
    stops_at_max_model_len: bool = False
    unsupported_sampling: tuple[str, ...] = field(default=())

    def capabilities(self) -> EngineCapabilities:
        """The facts on this process's device."""
        return EngineCapabilities(
            name=self.name,
            sleep_levels=self.sleep_levels_on_gpu if is_cuda_available() else (),
            tensor_parallel=self.tensor_parallel,
            agent_loops=self.agent_loops,
            images=self.images,
        )

    def engine_class(self):
        import importlib

        return getattr(importlib.import_module(self.module), self.class_name)


@dataclass(frozen=True)
class EngineCapabilities:
    """What a built engine can do here. `sleep_levels` empty: sleep and wake are no-ops."""

    name: str
    sleep_levels: tuple[int, ...]
    tensor_parallel: bool
    agent_loops: bool
    images: bool

    @property
    def can_sleep(self) -> bool:
        return bool(self.sleep_levels)


def replace_capabilities(capabilities: EngineCapabilities, sleeps: bool) -> EngineCapabilities:
    """`capabilities` without sleep levels when this engine was built without sleep mode."""
    return capabilities if sleeps else dataclasses.replace(capabilities, sleep_levels=())


@runtime_checkable
class RolloutEngine(Protocol):
    capabilities: EngineCapabilities
    engine_dtype: torch.dtype

    def generate_sequences(self, prompts: DataProto) -> DataProto: ...

    def generate_ids(self, prompt_ids, settings, max_tokens, vision=None) -> list: ...

    def update_weights(self, named_tensors) -> None: ...

    def reset_caches(self) -> None: ...

    def sleep(self, level: int) -> None: ...

    def wake_up(self, tags: tuple[str, ...] | None = None) -> None: ...


ENGINES: dict[str, EngineSpec] = {}


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Add an engine (a test may register a recording one); a second spec under a name is refused."""
    if spec.name in ENGINES and ENGINES[spec.name] != spec:
        raise ValueError(f"rollout engine {spec.name!r} is already registered ({ENGINES[spec.name].module})")
    ENGINES[spec.name] = spec
    return spec


def unregister_engine(name: str) -> None:
    ENGINES.pop(name, None)


def engine_names() -> tuple[str, ...]:
    return tuple(ENGINES)


def engine_spec(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(
            f"{ROLLOUT_NAME_KEY}={name!r} is not a registered rollout engine; registered: {', '.join(ENGINES)}"
        ) from None


def engines_with(**facts) -> tuple[str, ...]:
    """Names of the registered engines whose spec has every given fact, e.g.
    `engines_with(agent_loops=True)` (for messages that say what to set instead)."""
    return tuple(name for name, spec in ENGINES.items() if all(getattr(spec, k) == v for k, v in facts.items()))


def build_engine(model_config, rollout_config, tokenizer, model_hf_config) -> RolloutEngine:
    """The engine `rollout_config.name` names, built from `actor_rollout_ref.model` and `.rollout`."""
    spec = engine_spec(rollout_config.name)
    engine = spec.engine_class()(model_config, rollout_config, tokenizer, model_hf_config)
    if not isinstance(engine, RolloutEngine):
        missing = [
            m for m in ("capabilities", "engine_dtype", "reset_caches", "sleep", "wake_up") if not hasattr(engine, m)
        ]
        raise TypeError(f"rollout engine {spec.name!r} ({spec.class_name}) lacks {', '.join(missing) or 'a method'}")
    return engine


VLLM_ENGINE = register_engine(
    EngineSpec(
        name="vllm",
        module="workers.rollout.vllm_rollout",
        class_name="VLLMRollout",
        description="vLLM in the worker's own process",
        package="vllm",
        tensor_parallel=True,
        agent_loops=True,
        images=True,
        sleep_levels_on_gpu=(1, 2),
        engine_kwargs_section="vllm",
        checkpoint_names=True,
        takes_memory_share=True,
        stops_at_max_model_len=True,
    )
)
HF_ENGINE = register_engine(
    EngineSpec(
        name="hf",
        module="workers.rollout.hf_rollout",
        class_name="HFRollout",
        description="transformers' generate",
        images=True,
        unsupported_sampling=("presence_penalty", "frequency_penalty"),
    )
)

__all__ = [
    "ENGINES",
    "HF_ENGINE",
    "VLLM_ENGINE",
    "KV_CACHE",
    "WEIGHTS",
    "EngineCapabilities",
    "EngineSpec",
    "RolloutEngine",
    "build_engine",
    "engine_names",
    "engine_spec",
    "engines_with",
    "register_engine",
    "replace_capabilities",
    "unregister_engine",
]
