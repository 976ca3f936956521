"""LoRA on the actor (and the critic) through peft, and the merged weights everything outside
training sees.

`actor_rollout_ref.model.lora_rank > 0` wraps the actor in a peft LoRA model before FSDP2
shards it: only the adapters train, the base weights stay frozen. The reference policy is
that same module with its adapters disabled, so no second copy of the base model is held.
The rollout engine and the merged Hugging Face folder never see adapters: they get
`base + (B @ A) * scaling` under the base model's own parameter names (peft's
`base_model.model.` prefix and `.base_layer` infix removed). Only linear layers are
supported; a target that peft wraps differently (an embedding, a convolution) is refused
at wrap time, naming the module. `critic.model.lora_rank > 0` wraps the value model the same
way, with no peft task type (SkyRL's critic LoRA): under all-linear its value head gets an
adapter too, the head's own weights frozen; checkpoints and exports merge it the same way.

`actor_rollout_ref.model.lora_adapter_path` starts LoRA from a saved peft adapter instead
(verl's key): its adapter_config.json decides rank, alpha and targets, as in verl, and
`lora_rank` must be 0 or the adapter's rank.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from workers.device import for_collective

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import ModelConfig

PEFT_PREFIX = "base_model.model."
ADAPTER = "default"


def _plain(value: Any) -> Any:
    """Config sequences (target/exclude module lists) as the Python lists peft expects."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]


def build_lora_config(model_config: ModelConfig, causal_lm: bool = True):
    """peft's LoraConfig from a model section with lora_rank > 0 (`actor_rollout_ref.model`,
    or `critic.model` with `causal_lm=False`: no task type, so peft wraps the value model as it
    is and, under all-linear, adapts its value head too, as SkyRL's critic LoRA does)."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        r=int(model_config.lora_rank),
        lora_alpha=float(model_config.lora_alpha),
        target_modules=_plain(model_config.target_modules),
        exclude_modules=_plain(model_config.exclude_modules),
        # No dropout: the merged weights must compute what the trained module computes.
        lora_dropout=0.0,
        bias="none",
        task_type=TaskType.CAUSAL_LM if causal_lm else None,
    )


def adapter_folder_problem(path: str, lora_rank: int) -> str | None:
    """Why `path` cannot start LoRA training here (None when it can): checked at start."""
    config_file = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(config_file):
        return "no adapter_config.json there; point it at a folder written by peft's save_pretrained"
    with open(config_file) as handle:
        saved = json.load(handle)
    if saved.get("peft_type", "LORA") != "LORA":
        return f"the adapter is peft_type={saved['peft_type']!r}; only LoRA adapters can be trained on"
    if saved.get("use_dora"):
        return "a DoRA adapter cannot be merged as base + B @ A for the engine; use a plain LoRA adapter"
    rank = saved.get("r")
    if lora_rank > 0 and rank != lora_rank:
        return (
            f"the adapter's rank r={rank} differs from actor_rollout_ref.model.lora_rank={lora_rank}; "
            f"set lora_rank=0 (the adapter's rank is used) or lora_rank={rank}"
        )
    return None


def load_lora_adapter(module: torch.nn.Module, path: str) -> torch.nn.Module:
    """`module` with the saved adapter at `path`, trainable (verl: PeftModel.from_pretrained)."""
    from peft import PeftConfig, PeftModel

    config = PeftConfig.from_pretrained(path)
    # No dropout: the merged weights must compute what the trained module computes.
    config.lora_dropout = 0.0
    return PeftModel.from_pretrained(module, path, adapter_name=ADAPTER, is_trainable=True, config=config)


def apply_lora(module: torch.nn.Module, model_config: ModelConfig, causal_lm: bool = True) -> torch.nn.Module:
    """Wrap `module` with LoRA adapters (before FSDP), new ones or the saved adapter at
    `lora_adapter_path`; the base weights stop requiring grad. `causal_lm=False`: the critic's
    value model (build_lora_config)."""
    from peft import get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    if model_config.lora_adapter_path is not None:
        print(f"loading the LoRA adapter at {model_config.lora_adapter_path}")
        peft_model = load_lora_adapter(module, model_config.lora_adapter_path)
    else:
        peft_model = get_peft_model(module, build_lora_config(model_config, causal_lm))
    unsupported = [
        f"{name} ({type(mod).__name__})"
        for name, mod in peft_model.named_modules()
        if isinstance(mod, LoraLayer) and not isinstance(mod, LoraLinear)
    ]
    if unsupported:
        section = "actor_rollout_ref.model" if causal_lm else "critic.model"
        raise ValueError(
            f"{section}.target_modules selects layers LoRA here cannot merge: "
            f"{', '.join(unsupported[:5])}; "
            f"only linear layers are supported; narrow target_modules or add them to exclude_modules"
        )
    return peft_model


def is_peft_model(module: torch.nn.Module) -> bool:
    return hasattr(module, "disable_adapter") and hasattr(module, "peft_config")


def hf_name(peft_key: str) -> str:
    """The base model's parameter name for a key of the peft model's state dict."""
    name = peft_key[len(PEFT_PREFIX) :] if peft_key.startswith(PEFT_PREFIX) else peft_key
    return name.replace(".base_layer.", ".")


def is_adapter_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


def merge_lora_weight(base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """peft's merge for a linear layer, in fp32: base + (B @ A) * scaling."""
    return base.float() + (lora_b.float() @ lora_a.float()) * float(scaling)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    # A host-resident shard (offload_policy) goes to the device before NCCL gathers it.
    return for_collective(tensor).full_tensor() if isinstance(tensor, DTensor) else tensor


class MergedLoraWeight:
    """A base weight and its adapter, merged only when gathered: every rank gathers the
    three sharded tensors in the same order (each gather is a collective)."""

    def __init__(self, base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float):
        self.base, self.lora_a, self.lora_b, self.scaling = base, lora_a, lora_b, float(scaling)

    def numel(self) -> int:
        return self.base.numel()

    @torch.no_grad()
    def full(self, dtype: torch.dtype) -> torch.Tensor:
        return merge_lora_weight(_full(self.base), _full(self.lora_a), _full(self.lora_b), self.scaling).to(dtype)


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in model.named_modules() if isinstance(mod, LoraLayer)}


def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor | MergedLoraWeight]:
    """The peft model's state as the base model's state dict, adapters merged lazily."""
    layers = lora_layers(model)
    out: dict[str, torch.Tensor | MergedLoraWeight] = {}
    for key, tensor in model.state_dict().items():
        if is_adapter_key(key):
            continue  # consumed by the merge of its base weight
        if key.endswith(".base_layer.weight"):
            layer = layers[key[: -len(".base_layer.weight")]]
            out[hf_name(key)] = MergedLoraWeight(
                tensor, layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight, layer.scaling[ADAPTER]
            )
        else:
            out[hf_name(key)] = tensor
    return out


def scaling_by_module(model: torch.nn.Module) -> dict[str, float]:
    """Each adapted module's scaling (alpha / r, or alpha / sqrt(r) with rsLoRA), by peft key prefix."""
    return {name: float(layer.scaling[ADAPTER]) for name, layer in lora_layers(model).items()}


def adapter_config_dict(model: torch.nn.Module) -> dict:
    """peft's adapter_config.json content for the active adapter."""
    config = model.peft_config[ADAPTER]
    data = config.to_dict()
    for key, value in list(data.items()):
        if isinstance(value, set):
            data[key] = sorted(value)
        elif hasattr(value, "value"):  # enums (task_type, peft_type)
            data[key] = value.value
    return data
