"""The `reward_model` section: the reward model worker's model, sharding and batches, which
reward manager turns scores into token-level rewards (reward/manager.py), and the reward loop
(`use_reward_loop`: workers that score each trajectory as it finishes, the reward model served
by an inference engine, `rollout`, and a generative judge's settings, `judge`)."""

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
    valid,
)
from reward.config import fold_overlong_spellings
from reward.manager import REWARD_MANAGER_REGISTRY
from workers.config.batching import MicroBatching
from workers.config.fields import FSDP
from workers.config.model import FSDPConfig
from workers.config.vllm_args import check_engine_kwargs


# Choices read from the registries when a config is checked (a plug-in may add names).
# Named functions, not lambdas: typing.get_type_hints evaluates annotations with the
# class's namespace as globals, where a lambda could not see this module's names.
def _reward_managers() -> tuple[str, ...]:
    return tuple(REWARD_MANAGER_REGISTRY)


@dataclass(frozen=True)
class RewardModelModelConfig:
    input_tokenizer: str | None
    path: str | None
    trust_remote_code: bool
    # Both values: the FSDP reward model scores padded rows, the reward engine unpadded ones;
    # the scores are the same either way (verl's switch only packs the FSDP forward).
    use_remove_padding: bool
    fsdp_config: FSDPConfig


@dataclass(frozen=True)
class RewardEngineKwargsConfig:
    vllm: dict[str, Any]


@dataclass(frozen=True)
class RewardRolloutConfig:
    """`reward_model.rollout`: the inference engine that serves the reward model in the reward
    loop (verl's keys): a sequence classifier as vLLM's pooling model, a causal LM as a judge."""

    name: Annotated[
        str,
        OneOf(
            lambda: ("vllm",),
            unsupported=(
                ("sglang", "hybrid serves the reward model with vLLM"),
                ("trtllm", "hybrid serves the reward model with vLLM"),
            ),
        ),
    ]
    dtype: Annotated[str, OneOf(lambda: ("auto", "bfloat16", "float16", "float32"))]
    gpu_memory_utilization: Annotated[float, Fraction(open_low=True)]
    cpu_kvcache_space_gb: PositiveInt  # vLLM's CPU backend takes whole GiB
    enforce_eager: bool
    cudagraph_capture_sizes: Annotated[
        tuple[int, ...] | None, Fixed((None,), "the reward engine runs eager or with vLLM's own capture sizes")
    ]
    data_parallel_size: Annotated[int, Fixed((1,), "one engine per reward-engine replica (no vLLM data parallel)")]
    expert_parallel_size: Annotated[int, Fixed((1,), "hybrid's reward engine has no expert parallelism")]
    tensor_model_parallel_size: PositiveInt
    max_num_batched_tokens: PositiveInt
    max_model_len: OptionalPositiveInt
    max_num_seqs: PositiveInt
    load_format: Annotated[
        str,
        OneOf(
            lambda: ("auto", "hf", "safetensors"),
            unsupported=(("dummy", "the reward model must be served with its own weights"),),
        ),
    ]
    engine_kwargs: RewardEngineKwargsConfig
    limit_images: Annotated[Any, Fixed((None,), "hybrid trains text-only models")]
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    disable_log_stats: bool
    skip_tokenizer_init: Annotated[
        bool, Fixed((False,), "the reward loop sends text and token ids that the engine's tokenizer must read")
    ]
    prompt_length: PositiveInt
    response_length: PositiveInt

    @property
    def engine_max_model_len(self) -> int:
        """The engine's context: max_model_len, else prompt_length + response_length (verl's)."""
        return int(self.max_model_len or self.prompt_length + self.response_length)


@dataclass(frozen=True)
class RewardJudgeConfig:
    """`reward_model.judge` (hybrid's): a generative reward model reads the prompt, the response
    and the reference answer through `prompt_template` and writes a verdict; `verdict_pattern`
    finds the score in it (reward/judge.py)."""

    base_url: str | None  # an OpenAI-compatible server instead of serving reward_model.model.path
    model: str | None  # the model name sent to base_url (default: reward_model.model.path)
    api_key_env: str | None  # the environment variable holding base_url's key
    prompt_template: str
    system_prompt: str | None
    prompt_after: str | None  # {prompt} from the decoded prompt after its last such string (ROLL's judge: "user\n")
    verdict_pattern: str
    verdict_labels: dict[str, float] | None  # words the pattern captures -> scores ({yes: 1, no: 0})
    min_score: float
    max_score: float
    invalid_score: float
    temperature: Annotated[float, NonNegative()]
    top_p: Annotated[float, Fraction(open_low=True)]
    top_k: Annotated[int, AtLeast(-1, note=" (-1: no top-k filter)")]
    timeout_s: Annotated[float, Positive()]
    stop: Annotated[tuple[str, ...] | None, AsList()]
    # Only these domains' rows are judged, the others scored by their rule scorers (null: every row).
    domains: Annotated[tuple[str, ...] | None, AsList()]


@dataclass(frozen=True)
class RewardModelConfig:
    enable: bool
    strategy: Annotated[str, FSDP]
    model: RewardModelModelConfig
    micro_batch_size: int | None
    micro_batch_size_per_gpu: OptionalPositiveInt
    max_length: OptionalPositiveInt
    use_dynamic_bsz: bool
    forward_max_token_len_per_gpu: PositiveInt
    reward_manager: Annotated[str, OneOf(_reward_managers)]
    launch_reward_fn_async: Annotated[
        bool, Fixed((False,), "rewards are computed on the driver between generation and the update")
    ]
    use_reward_loop: bool
    # verl's: the reward model on resources of its own, so the agent loops may score each
    # trajectory as it finishes; false (colocated): a served reward model scores after the batch.
    enable_resource_pool: bool
    num_workers: PositiveInt  # the reward loop's workers (Ray actors), each scoring trajectories concurrently
    rollout: RewardRolloutConfig
    judge: RewardJudgeConfig
    combine: Annotated[str, OneOf(lambda: ("sum", "rm_only"))]
    sandbox_fusion: Annotated[
        Any, Fixed((None,), "hybrid has no sandbox code execution; score code in a custom reward function")
    ]
    reward_kwargs: dict[str, Any]

    def check(self, problems: Problems) -> None:
        if self.enable and self.model.path is None and not (self.use_reward_loop and self.judge.base_url):
            problems.add("reward_model.enable=True needs reward_model.model.path (a reward model folder)")
        if self.judge.base_url and not (self.enable and self.use_reward_loop):
            problems.add(
                "reward_model.judge.base_url is read by the reward loop: set reward_model.enable=true and "
                "reward_model.use_reward_loop=true, or remove it"
            )
        if valid(self.rollout) and valid(self.rollout.engine_kwargs) and valid(self.rollout.engine_kwargs.vllm):
            check_engine_kwargs("reward_model.rollout.engine_kwargs.vllm", self.rollout.engine_kwargs.vllm, problems)
        if self.judge.prompt_after == "":
            problems.add("reward_model.judge.prompt_after='' cuts nothing: give the text to cut after, or null")
        if self.judge.min_score > self.judge.max_score:
            problems.add(
                f"reward_model.judge.min_score={self.judge.min_score} is above max_score={self.judge.max_score}"
            )

    @property
    def batching(self) -> MicroBatching:
        return MicroBatching(self.micro_batch_size_per_gpu, self.use_dynamic_bsz, self.forward_max_token_len_per_gpu)

    @property
    def manager_kwargs(self) -> dict[str, Any]:
        """`reward_kwargs` as the reward manager takes them (fold_overlong_spellings)."""
        return fold_overlong_spellings(self.reward_kwargs)
