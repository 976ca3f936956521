"""Vision-language policies (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) in the actor, the reference and
the Hugging Face rollout engine: which checkpoints are such models, their multimodal RoPE
position ids, and the vision inputs of a forward pass, in verl's form.

A row of a vision-language batch carries, besides its tensors, `multi_modal_inputs` (a
non-tensor column: per row a dict with the processor's `pixel_values` (patches, features)
and `image_grid_thw` (images, 3)) and position ids of shape (4, L): row 0 the text positions
(mask cumsum - 1, as for a text model), rows 1-3 the temporal/height/width positions the
model's own `get_rope_index` gives (verl binds that method to its processor; here it is bound
to the checkpoint's config). transformers' Qwen-VL language models read a (4, B, L) tensor as
exactly that: row 0 for the attention mask, rows 1-3 for the rotary embedding.

Responses continue every row by one per token after the prompt's last position (verl's
vLLM rollout does the same; workers/rollout/base.assemble_rollout). A forward pass gets the
micro-batch's images concatenated in row order: the model scatters the image features into
the image placeholder tokens in that same order.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Sequence

import torch

# model_type -> (module under transformers.models, the base model class holding get_rope_index)
VISION_MODELS = {
    "qwen2_vl": ("qwen2_vl", "Qwen2VLModel"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLModel"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLModel"),
}
VISION_INPUT_KEYS = ("pixel_values", "image_grid_thw")
MULTI_MODAL_INPUTS = "multi_modal_inputs"


def is_vision_model(hf_config) -> bool:
    """A checkpoint with a vision encoder (a `vision_config`) loaded whole."""
    return getattr(hf_config, "vision_config", None) is not None


def unsupported_vision_model(model_type: str) -> str | None:
    if model_type in VISION_MODELS:
        return None
    return (
        f"model_type {model_type}: hybrid trains the vision-language models {', '.join(sorted(VISION_MODELS))} "
        f"(their multimodal position ids are known); use one of those, or "
        f"actor_rollout_ref.model.language_model_only=true to train the language model alone on text"
    )


class _RopeIndex:
    """What the model class's get_rope_index reads from `self`: the config and its sibling
    methods (get_vision_position_ids), without building the model."""

    def __init__(self, model_cls, hf_config):
        self.config = hf_config
        self._cls = model_cls

    def __getattr__(self, name):
        attr = inspect.getattr_static(self._cls, name)
        if isinstance(attr, staticmethod):
            return attr.__func__
        return types.MethodType(getattr(self._cls, name), self)


def rope_index(hf_config) -> _RopeIndex:
    model_type = getattr(hf_config, "model_type", "?")
    problem = unsupported_vision_model(model_type)
    if problem:
        raise ValueError(problem)
    module, name = VISION_MODELS[model_type]
    cls = getattr(importlib.import_module(f"transformers.models.{module}"), name)
    return _RopeIndex(cls, hf_config)


def mrope_position_ids(
    index: _RopeIndex, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw: torch.Tensor | None
) -> torch.Tensor:
    """(4, L) position ids of one left-padded row: text positions, then the model's
    temporal/height/width positions (0 at padding)."""
    text = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0).unsqueeze(0)
    if image_grid_thw is None:
        return text.expand(4, -1).clone()
    mm_types = (input_ids == index.config.image_token_id).to(torch.int).unsqueeze(0)
    vision, _ = index.get_rope_index(
        input_ids.unsqueeze(0),
        mm_token_type_ids=mm_types,
        image_grid_thw=image_grid_thw,
        attention_mask=attention_mask.unsqueeze(0),
    )
    return torch.cat([text, vision[:, 0]], dim=0)


def batch_vision_inputs(rows: Sequence[dict], device=None) -> dict[str, torch.Tensor]:
    """The vision keyword arguments of a forward over `rows` (their multi_modal_inputs, in row
    order); empty when no row has an image."""
    parts = {key: [row[key] for row in rows if row and row.get(key) is not None] for key in VISION_INPUT_KEYS}
    if not parts["pixel_values"]:
        return {}
    return {key: torch.cat(values, dim=0).to(device) for key, values in parts.items()}


def vision_model_inputs(inputs: dict, multi_modal_inputs, device=None) -> dict:
    """`inputs` (input_ids, attention_mask, position_ids (B, 4, L)) for a vision-language
    model: position ids as the model reads them, (4, B, L), and the micro-batch's images."""
    position_ids = inputs["position_ids"]
    if position_ids.dim() != 3:
        raise ValueError(
            f"a vision-language batch needs position ids of shape (batch, 4, length), got {tuple(position_ids.shape)}"
        )
    return {**inputs, "position_ids": position_ids.transpose(0, 1), **batch_vision_inputs(multi_modal_inputs, device)}


def generation_inputs(hf_config, input_ids: torch.Tensor, multi_modal_inputs, device=None) -> dict:
    """The keyword arguments generate needs besides the ids: the images and which tokens are
    image placeholders (transformers computes the multimodal positions from them)."""
    extra = batch_vision_inputs(multi_modal_inputs, device)
    if extra:
        extra["mm_token_type_ids"] = (input_ids == hf_config.image_token_id).to(torch.int).to(device)
    return extra


def collapse_image_tokens(ids: list[int], image_token_id: int) -> list[int]:
    """`ids` with each run of image placeholder tokens (one image's, as the processor expanded
    it) cut to one: the prompt form vLLM expands itself from its multi_modal_data (verl's
    raw_prompt_ids). Images are separated by their vision start/end tokens, so runs do not merge."""
    out: list[int] = []
    for tok in ids:
        if tok != image_token_id or not out or out[-1] != image_token_id:
            out.append(tok)
    return out


def model_class(hf_config, text_class):
    """The class a role loads: transformers' image-text-to-text class for a vision-language
    checkpoint loaded whole, else `text_class` (AutoModelForCausalLM)."""
    if not is_vision_model(hf_config):
        return text_class
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText


def class_for(path: str, trust_remote_code: bool):
    """`model_class` of the checkpoint at `path`, for the causal-LM roles (actor, reference)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    return model_class(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code), AutoModelForCausalLM)


__all__ = [
    "MULTI_MODAL_INPUTS",
    "VISION_MODELS",
    "batch_vision_inputs",
    "class_for",
    "collapse_image_tokens",
    "generation_inputs",
    "is_vision_model",
    "model_class",
    "mrope_position_ids",
    "rope_index",
    "unsupported_vision_model",
    "vision_model_inputs",
]
