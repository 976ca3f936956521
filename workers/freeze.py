"""Frozen parts of the policy: parameters that keep their loaded values while the rest trains.

Two keys ask for it, both on `actor_rollout_ref.actor`:

* `freeze_vision_tower` (verl's key): the vision tower of a vision-language model
  (`model.visual` in transformers' layout, `visual` in the older one), as verl's
  get_vl_model_vision_tower finds it; a model without one is trained whole, with a line
  saying so, as verl does.
  With LoRA the tower's adapters (peft's all-linear adapts the tower's linears too) are
  frozen with it: only the language model's adapters train.
* `freeze_module_prefix` (ROLL's `model_args.freeze_module_prefix`): every parameter whose
  name starts with one of the prefixes (a comma-separated string or a list), as ROLL's
  model_providers.freeze_model does; for any model, text models too. A prefix that matches no
  parameter is refused (ROLL would train everything without a word), and so is it with LoRA.

Frozen parameters get requires_grad=False before the optimizer is built, and the optimizer
holds only the trainable ones (as for LoRA), so they have neither gradients nor optimizer
state. They still go to the rollout engine with every weight sync (unchanged values).
"""

from __future__ import annotations

import torch


def prefixes_of(value) -> list[str]:
    """ROLL's split_arg: a comma-separated string, or a list, of prefixes; None: none."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [item.strip() for item in items if item.strip()]


def vision_tower(module: torch.nn.Module):
    """verl's get_vl_model_vision_tower: `model.visual` (transformers >= 4.52) or `visual`; in a
    peft model, its base model's."""
    if hasattr(module, "get_base_model"):
        module = module.get_base_model()
    inner = getattr(module, "model", None)
    if inner is not None and hasattr(inner, "visual"):
        return inner.visual
    return getattr(module, "visual", None)


def freeze(module: torch.nn.Module, freeze_vision_tower: bool, module_prefix, is_lora: bool) -> list[str]:
    """Freeze what the two keys name in `module` (the policy, before sharding); returns the
    names of the frozen parameters."""
    prefixes = prefixes_of(module_prefix)
    if prefixes and is_lora:
        raise ValueError(
            "actor_rollout_ref.actor.freeze_module_prefix with LoRA: the adapters already leave the base model "
            "frozen (ROLL ignores freeze_module_prefix with LoRA); drop one of the two"
        )
    if freeze_vision_tower:
        tower = vision_tower(module)
        if tower is None:
            print("actor_rollout_ref.actor.freeze_vision_tower=true: the model has no vision tower; all of it trains")
        else:
            # Under LoRA (`module` a peft model) the tower's adapters freeze with it: they keep the
            # values they start with (new adapters: B = 0, so the tower computes the base model's).
            tower.requires_grad_(False)
    names = [name for name, _ in module.named_parameters()]
    for prefix in prefixes:
        if not any(name.startswith(prefix) for name in names):
            tops = sorted({name.split(".")[0] + "." for name in names})
            raise ValueError(
                f"actor_rollout_ref.actor.freeze_module_prefix: no parameter name starts with {prefix!r} (names start "
                f"with {', '.join(tops)}; e.g. {names[0]})"
            )
    for name, param in module.named_parameters():
        if any(name.startswith(prefix) for prefix in prefixes):
            param.requires_grad_(False)
    return [name for name, param in module.named_parameters() if not param.requires_grad]


__all__ = ["freeze", "prefixes_of", "vision_tower"]
