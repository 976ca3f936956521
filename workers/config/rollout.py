"""The rollout's section (`actor_rollout_ref.rollout`): which engine, how it samples
(workers/rollout/base.sampling_settings reads these), its memory and batch limits, the
multi-turn loop's settings and validation's sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.config_schema import (
    Annotated,
    AsList,
    AtLeast,
    Fixed,
    Fraction,
    NonNegative,
    OneOf,
    OptionalPositiveInt,
    Positive,
    PositiveInt,
    Problems,
    fmt,
    valid,
)
from workers.config.batching import LogProbBatching
from workers.config.vllm_args import check_engine_kwargs
from workers.rollout.engine import ENGINES, engine_names, engines_with


@dataclass(frozen=True)
class ValKwargsConfig:
    top_k: Annotated[int, AtLeast(-1, note=" (-1: no top-k filter)")]
    top_p: Annotated[float, Fraction(open_low=True)]
    temperature: Annotated[float, NonNegative()]
    n: PositiveInt
    do_sample: bool


@dataclass(frozen=True)
class EngineKwargsConfig:
    vllm: dict[str, Any]


@dataclass(frozen=True)
class MultiTurnConfig:
    enable: bool
    max_assistant_turns: OptionalPositiveInt
    max_user_turns: OptionalPositiveInt
    max_tokens_per_turn: OptionalPositiveInt
    interaction_config_path: str | None
    tool_config_path: str | None
    max_parallel_calls: OptionalPositiveInt  # verl's: the first N tool calls of a turn run (null: all)
    max_tool_response_length: PositiveInt
    tool_response_truncate_side: Annotated[str, OneOf(lambda: ("left", "middle", "right"))]
    format: Annotated[str, OneOf(lambda: ("hermes",))]
    env_class: str | None
    env_kwargs: dict[str, Any]
    use_conversation_multi_turn: bool
    reward_placement: Annotated[str, OneOf(lambda: ("final", "turn"))]
    env_workers: PositiveInt
    env_step_timeout_s: Annotated[float, Positive()]
    tolerate_env_errors: bool
    step_wise_trajectories: bool


@dataclass(frozen=True)
class CustomAsyncServerConfig:
    path: Annotated[str | None, Fixed((None,), "hybrid drives its in-process vLLM engine itself (no server class)")]
    name: Annotated[str | None, Fixed((None,), "hybrid drives its in-process vLLM engine itself (no server class)")]


@dataclass(frozen=True)
class AgentLoopConfig:
    """`actor_rollout_ref.rollout.agent`: the agent loops of mode=async (workers/rollout/agent_loop.py)."""

    num_workers: PositiveInt
    default_agent_loop: str | None
    agent_loop_config_path: str | None
    max_trajectories_in_flight: OptionalPositiveInt
    enable_http_endpoint: bool
    http_endpoint_host: str
    http_endpoint_port: Annotated[int, Fraction(low=0, high=65535)]
    custom_async_server: CustomAsyncServerConfig
    verifiers_env: str | None  # a verifiers environment (workers/rollout/verifiers_env.py)


@dataclass(frozen=True)
class RemoteEnginesConfig:
    """`actor_rollout_ref.rollout.remote` (hybrid's; SkyRL's external_proxy_url and
    external_server_urls): rollout engines in a deployment of their own, started beforehand with
    `python -m hybrid.serve` (workers/rollout/remote_server.py), which prints both URLs.
    `proxy_url`: the router generation requests go through (the data plane); `server_urls`: each
    engine server, which gets the weight pushes, pause/resume and the version (the control
    plane). Both: generation through the proxy, control to every server. The proxy alone: the
    router also fans the control calls out to its servers. The servers alone: the trainer sends
    each generation to the server with the fewest rows in flight. Unset (null): hybrid starts
    its engines itself."""

    proxy_url: str | None
    server_urls: Annotated[tuple[str, ...] | None, AsList()]

    @property
    def enabled(self) -> bool:
        return self.proxy_url is not None or self.server_urls is not None


@dataclass(frozen=True)
class RolloutConfig(LogProbBatching):
    """`actor_rollout_ref.rollout`: the engine, its sampling settings and the multi-turn loop."""

    name: Annotated[
        str,
        OneOf(
            engine_names,
            unsupported=(("sglang", "hybrid's rollout engines are in-process vLLM and Hugging Face generate"),),
        ),
    ]
    mode: Annotated[str, OneOf(lambda: ("sync", "async"))]
    temperature: Annotated[float, NonNegative()]
    top_k: Annotated[int, AtLeast(-1, note=" (-1: no top-k filter)")]
    top_p: Annotated[float, Fraction(open_low=True)]
    do_sample: bool
    min_p: Annotated[float, Fraction()]
    repetition_penalty: Annotated[float, Positive()]
    presence_penalty: Annotated[float, Fraction(low=-2.0, high=2.0)]
    frequency_penalty: Annotated[float, Fraction(low=-2.0, high=2.0)]
    stop: Annotated[tuple[str, ...] | None, AsList()]
    stop_token_ids: tuple[Annotated[int, NonNegative()], ...] | None
    prompt_length: PositiveInt
    response_length: PositiveInt
    dtype: Annotated[str, OneOf(lambda: ("auto", "bfloat16", "float16", "float32"))]
    gpu_memory_utilization: Annotated[float, Fraction(open_low=True)]
    cpu_kvcache_space_gb: PositiveInt  # vLLM's CPU backend takes whole GiB
    ignore_eos: bool
    enforce_eager: bool
    free_cache_engine: bool
    load_format: Annotated[
        str,
        OneOf(
            lambda: ("dummy_dtensor", "dummy_hf", "dummy", "dtensor", "hf", "auto", "safetensors"),
            unsupported=(
                ("dummy_megatron", "hybrid trains with FSDP only"),
                ("megatron", "hybrid trains with FSDP only"),
            ),
        ),
    ]
    tensor_model_parallel_size: PositiveInt
    max_num_batched_tokens: PositiveInt
    max_model_len: OptionalPositiveInt
    max_model_len_caps_response: bool  # ROLL's engine: a response stops at max_model_len - its prompt (vLLM only)
    max_num_seqs: PositiveInt
    enable_chunked_prefill: bool
    seed: int
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: OptionalPositiveInt
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: PositiveInt
    n: Annotated[int, Positive()]
    # false: no rollout_log_probs kept; what reads them is refused (hybrid/config/rules_log_probs.py)
    calculate_log_probs: bool
    update_weights_bucket_megabytes: PositiveInt
    # verl: gather the FSDP parameters layer by layer for the sync instead of all at once.
    # Our sync always streams (workers/weight_sync.py), so both values mean the same here.
    layered_summon: bool
    engine_kwargs: EngineKwargsConfig
    multi_turn: MultiTurnConfig
    agent: AgentLoopConfig
    val_kwargs: ValKwargsConfig
    remote: RemoteEnginesConfig

    def check(self, problems: Problems) -> None:
        key = "actor_rollout_ref.rollout"
        spec = ENGINES.get(self.name) if valid(self.name) else None
        if self.mode == "async" and spec is not None and not spec.agent_loops:
            problems.add(
                f"{key}.mode='async' runs agent loops, which {key}.name={fmt(self.name)} ({spec.description}) does not "
                f"run; set name={'/'.join(engines_with(agent_loops=True))} or mode=sync"
            )
        if self.agent.enable_http_endpoint is True and self.mode != "async":
            problems.add(
                f"{key}.agent.enable_http_endpoint=True serves the engine to agent loops, which run with "
                f"{key}.mode='async' only; set mode=async"
            )
        check_verifiers_env(self, key, problems)
        engine_kwargs = self.engine_kwargs.vllm if valid(self.engine_kwargs) and valid(self.engine_kwargs.vllm) else {}
        if spec is None:
            return
        if engine_kwargs and spec.engine_kwargs_section is not None:
            check_engine_kwargs(f"{key}.engine_kwargs.vllm", engine_kwargs, problems)
        elif engine_kwargs:
            problems.add(
                f"{key}.engine_kwargs.vllm gives {', '.join(sorted(map(str, engine_kwargs)))} for the vLLM engine, "
                f"which {key}.name={fmt(self.name)} ({spec.description}) does not use; remove them or set "
                f"name={'/'.join(engines_with(engine_kwargs_section='vllm'))}"
            )
        for name in spec.unsupported_sampling:
            if valid(getattr(self, name)) and getattr(self, name) != 0:
                problems.add(
                    f"{key}.{name}={getattr(self, name)} has no equivalent in {key}.name={fmt(self.name)} "
                    f"({spec.description}); set it to 0 or use another engine"
                )


def check_verifiers_env(rollout: RolloutConfig, key: str, problems: Problems) -> None:
    """agent.verifiers_env runs verifiers environments through the OpenAI endpoint (the agent
    loop verifiers_env, workers/rollout/verifiers_env.py): the keys it needs, named at start (the
    packages: hybrid/preflight.py)."""
    agent = rollout.agent
    if agent.verifiers_env is None:
        return
    needs = {
        f"{key}.mode": (rollout.mode == "async", "async"),
        f"{key}.multi_turn.enable": (rollout.multi_turn.enable is True, "true"),
        f"{key}.agent.enable_http_endpoint": (agent.enable_http_endpoint is True, "true"),
    }
    for name, (ok, value) in needs.items():
        if not ok:
            problems.add(
                f"{key}.agent.verifiers_env={agent.verifiers_env!r} runs its episodes as agent loops through "
                f"the OpenAI endpoint: set {name}={value}"
            )
