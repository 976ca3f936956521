"""The SFT trainer's configuration: one frozen dataclass per section of `sft_trainer.yaml`.

Field names are verl's SFT keys (verl/trainer/config/sft_trainer.yaml), declared in the same
language as the PPO config (protocol/config_schema.py): each key's type and value rule on its
field, keys hybrid has no feature for accepted only at the value that needs none (`Fixed`),
rules across keys in `SFTConfig.check`. `load_sft_config` composes the yaml with command-line
overrides (unknown keys name the nearest real one, as for PPO) and `typed_sft_config` turns
the tree into the checked object, listing every problem at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hybrid.config.loading import compose_checked
from hybrid.config.schema import Device, Loggers, ResumeMode
from hybrid.config.validate import raise_problems, resolved_container
from protocol.config_schema import (
    Annotated,
    Fixed,
    Fraction,
    NonNegative,
    OneOf,
    OptionalPositiveInt,
    Paths,
    Positive,
    PositiveInt,
    Problems,
    build_section,
    fmt,
    valid,
)
from workers.config.fields import FSDP, MIXED_PRECISION
from workers.config.model import CheckpointConfig, WrapPolicyConfig

SFT_CONFIG_NAME = "sft_trainer"


def _truncations() -> tuple[str, ...]:
    return ("error", "left", "right")


def _schedulers() -> tuple[str, ...]:
    return ("cosine", "wsd")


def _dtypes() -> tuple[str, ...]:
    return ("fp32",)


_MASTER_DTYPE = (
    ("bf16", "hybrid keeps fp32 master weights; set model.fsdp_config.mixed_precision=bf16 to compute in bf16"),
    ("fp16", "hybrid keeps fp32 master weights and computes in bf16 or fp32 (model.fsdp_config.mixed_precision)"),
)


_OWN_DATASET = "hybrid's SFT trainer reads its own dataset; custom classes are not loaded"
_NO_SHM = "data files are read once at start; copying them to /dev/shm gains nothing"


@dataclass(frozen=True)
class MultiturnConfig:
    enable: bool
    messages_key: str
    tools_key: str
    enable_thinking_key: str


@dataclass(frozen=True)
class CustomClsConfig:
    path: Annotated[str | None, Fixed((None,), _OWN_DATASET)]
    name: Annotated[str | None, Fixed((None,), _OWN_DATASET)]


@dataclass(frozen=True)
class SFTDataConfig:
    train_batch_size: PositiveInt
    micro_batch_size: OptionalPositiveInt
    micro_batch_size_per_gpu: PositiveInt
    train_files: Paths
    val_files: Paths | None
    train_max_samples: int
    val_max_samples: int
    prompt_key: str
    response_key: str
    prompt_dict_keys: tuple[str, ...] | None
    response_dict_keys: tuple[str, ...] | None
    multiturn: MultiturnConfig
    max_length: PositiveInt
    truncation: Annotated[str, OneOf(_truncations)]
    balance_dp_token: Annotated[
        bool, Fixed((False,), "every rank's loss is already weighted by its share of the global token count")
    ]
    chat_template: str | None
    custom_cls: CustomClsConfig
    use_shm: Annotated[bool, Fixed((False,), _NO_SHM)]
    apply_chat_template_kwargs: dict[str, Any]

    @property
    def micro_batch(self) -> int:
        """verl's deprecated `micro_batch_size` wins when set, as in verl."""
        return self.micro_batch_size if self.micro_batch_size is not None else self.micro_batch_size_per_gpu


@dataclass(frozen=True)
class SFTFSDPConfig:
    model_dtype: Annotated[str, OneOf(_dtypes, unsupported=_MASTER_DTYPE)]
    mixed_precision: Annotated[str, MIXED_PRECISION]
    wrap_policy: WrapPolicyConfig
    cpu_offload: bool  # FSDP2's CPUOffloadPolicy (GPU only; parameters, gradients and the optimizer step on the host)
    offload_params: bool  # verl: the argument cpu_offload passes; FSDP2's offload policy always moves parameters


@dataclass(frozen=True)
class SFTModelConfig:
    partial_pretrain: str
    use_shm: bool
    fsdp_config: SFTFSDPConfig
    external_lib: str | tuple[str, ...] | None
    enable_gradient_checkpointing: bool
    trust_remote_code: bool
    lora_rank: Annotated[int, NonNegative(" (0: full fine-tuning)")]
    lora_alpha: Annotated[float, Positive()]
    target_modules: str | tuple[str, ...]
    use_liger: bool
    strategy: Annotated[str, FSDP]

    # What workers/lora.apply_lora reads beyond verl's SFT keys: no exclusions, no saved adapter.
    exclude_modules = None
    lora_adapter_path = None

    @property
    def is_lora(self) -> bool:
        return self.lora_rank > 0


@dataclass(frozen=True)
class SFTOptimConfig:
    lr: Annotated[float, NonNegative()]
    betas: tuple[float, ...]
    weight_decay: Annotated[float, NonNegative()]
    lr_warmup_steps_ratio: Annotated[float, Fraction()]
    warmup_steps_ratio: Annotated[float | None, Fraction()]
    clip_grad: Annotated[float, Positive()]
    lr_scheduler: Annotated[str, OneOf(_schedulers)]

    @property
    def warmup_ratio(self) -> float:
        return self.warmup_steps_ratio if self.warmup_steps_ratio is not None else self.lr_warmup_steps_ratio


@dataclass(frozen=True)
class SFTTrainerConfig:
    default_local_dir: str
    default_hdfs_dir: Annotated[str | None, Fixed((None,), "hybrid writes checkpoints to local disk only")]
    project_name: str
    experiment_name: str
    total_epochs: PositiveInt
    total_training_steps: OptionalPositiveInt
    logger: Loggers
    seed: int
    save_freq: int
    save_on_stop: bool
    test_freq: int
    nnodes: PositiveInt
    n_gpus_per_node: PositiveInt
    max_ckpt_to_keep: int | None
    resume_mode: ResumeMode
    resume_from_path: str | None
    checkpoint: CheckpointConfig
    device: Device


@dataclass(frozen=True)
class SFTConfig:
    data: SFTDataConfig
    model: SFTModelConfig
    optim: SFTOptimConfig
    ulysses_sequence_parallel_size: PositiveInt  # consecutive ranks that split each packed row (workers/ulysses.py)
    use_remove_padding: bool
    trainer: SFTTrainerConfig

    def check(self, problems: Problems, world_size: int) -> None:
        """`world_size`: the ranks torchrun started."""
        data = self.data
        betas = self.optim.betas
        if valid(betas) and (len(betas) != 2 or not all(0 <= b < 1 for b in betas)):
            problems.add(f"optim.betas={fmt(betas)} must be two numbers in [0, 1): [beta1, beta2]")
        sp = self.ulysses_sequence_parallel_size
        ranks = world_size
        if valid(sp):
            if world_size % sp:
                problems.add(
                    f"ulysses_sequence_parallel_size={sp} does not divide the {world_size} ranks started; make it "
                    f"a divisor of torchrun's --nproc_per_node x --nnodes"
                )
            ranks = max(world_size // sp, 1)  # data-parallel ranks
        if valid(data.train_batch_size, data.micro_batch_size, data.micro_batch_size_per_gpu):
            per_rank, rest = divmod(data.train_batch_size, ranks)
            if rest:
                problems.add(
                    f"data.train_batch_size={data.train_batch_size} is not divisible by the {ranks} "
                    f"data-parallel ranks; make it a multiple of {ranks}"
                )
            elif per_rank % data.micro_batch:
                key = "micro_batch_size" if data.micro_batch_size is not None else "micro_batch_size_per_gpu"
                problems.add(
                    f"data.train_batch_size={data.train_batch_size} gives {per_rank} samples per rank, not a multiple "
                    f"of data.{key}={data.micro_batch} (verl's rule: each rank runs whole micro-batches)"
                )
        if valid(data.multiturn) and not data.multiturn.enable:
            for key in ("prompt_key", "response_key"):
                if valid(getattr(data, key)) and not getattr(data, key):
                    problems.add(f"data.{key} is empty; name the parquet column")
        trainer = self.trainer
        if valid(trainer.resume_mode, trainer.resume_from_path):
            if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
                problems.add("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N folder)")
        contents = trainer.checkpoint
        if valid(contents) and valid(contents.save_contents) and "model" not in contents.save_contents:
            problems.add(
                f"trainer.checkpoint.save_contents={fmt(contents.save_contents)} must include 'model': a checkpoint "
                f"without the model cannot be resumed or merged"
            )
        if valid(self.model.use_liger) and self.model.use_liger:
            from workers.device import is_cuda_available

            if not is_cuda_available():
                problems.add("model.use_liger=true needs a CUDA GPU (liger-kernel) and none is visible; set it false")

    # RunCheckpoints (hybrid/checkpointing.py) reads the PPO trainer section's names.
    @property
    def checkpoint_view(self):
        from types import SimpleNamespace

        t = self.trainer
        view = SimpleNamespace(
            default_local_dir=t.default_local_dir,
            resume_mode=t.resume_mode,
            resume_from_path=t.resume_from_path,
            save_freq=t.save_freq,
            save_on_stop=t.save_on_stop,
            merge_on_finish=None,  # null: the last step is merged into a Hugging Face folder when saved
            max_actor_ckpt_to_keep=t.max_ckpt_to_keep,
            max_critic_ckpt_to_keep=None,
        )
        return SimpleNamespace(trainer=view)


def load_sft_config(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose `sft_trainer.yaml` with Hydra-style overrides; unknown keys raise ConfigError."""
    return compose_checked(SFT_CONFIG_NAME, overrides)


def typed_sft_config(cfg: DictConfig | dict, world_size: int | None = None) -> SFTConfig:
    """The checked, frozen SFT configuration; ConfigError lists every problem. `world_size`:
    the ranks that train (None: those torchrun started, WORLD_SIZE; 1 without torchrun)."""
    import importlib
    import os

    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    problems = Problems()
    libs = OmegaConf.select(cfg, "model.external_lib", default=None)
    for name in [libs] if isinstance(libs, str) else list(libs or []):
        try:
            importlib.import_module(str(name))
        except Exception as err:  # the user's module: any failure is theirs to see
            problems.add(f"model.external_lib: cannot import {name!r} ({type(err).__name__}: {err})")
    data, interpolated = resolved_container(cfg, problems)
    data.pop("hydra", None)
    config = build_section(SFTConfig, data, "", problems, interpolated)
    config.check(problems, int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size)
    raise_problems(problems, "SFT configuration")
    return config


__all__ = ["SFTConfig", "load_sft_config", "typed_sft_config", "SFT_CONFIG_NAME"]
