"""Prompts with images for vision-language policies, in verl's form (its RLHFDataset with a
processor): the data's `data.image_key` column (verl's default `images`) holds each row's
images, and every `<image>` in the prompt's messages marks where one goes. Here:

* `load_processor` (workers/vision_messages.py): the checkpoint's processor (AutoProcessor;
  without torchvision, the same parts minus the video processor). Videos are refused
  (hybrid/preflight.py).
* `VisionPrompts.encode`: one row -> the chat template applied by the processor, the images
  turned into `pixel_values`/`image_grid_thw` (`multi_modal_inputs`, verl's column), the
  prompt ids with each image's placeholder expanded (left padded to data.max_prompt_length),
  the (4, L) multimodal position ids (workers/vision.py), and verl's `multi_modal_data`
  ({"image": [PIL images]}) and `raw_prompt_ids` (one placeholder per image, what a vLLM
  engine expands itself).

Images are PIL images, dicts with `bytes` (parquet's image struct), `image` or `path`, or file
paths; each is converted to RGB. A row without an image column may carry its images inline, as
OpenAI-style content parts (`image` / `image_url` with a data URI: SkyRL's examples;
workers/vision_messages.py `message_images`). The processor resizes them (its min/max pixels), as
qwen_vl_utils' fetch_image would before it; a prompt too long for data.max_prompt_length is
refused rather than truncated (a cut would leave image features without placeholders).
"""

from __future__ import annotations

import copy
import re

import numpy as np
import torch

from hybrid.core_algos import estimator_spec
from workers.rollout.engine import engines_with
from workers.vision import is_vision_model, mrope_position_ids, rope_index, unsupported_vision_model

# load_processor, process_image (and _image_only) live with the message helpers the workers use too.
from workers.vision_messages import _image_only, has_image_parts, load_processor, message_images, process_image  # noqa: F401

_PLACEHOLDER = re.compile("(<image>|<video>)")


def vision_processor(model):
    """The processor of `actor_rollout_ref.model` when it is a vision-language checkpoint loaded
    whole (not language_model_only), else None: the prompts are then text."""
    from transformers import AutoConfig

    if model.language_model_only:
        return None
    hf_config = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    return load_processor(model.path, model.trust_remote_code) if is_vision_model(hf_config) else None


def build_messages(prompt, images: list, where: str = "") -> list[dict]:
    """verl's RLHFDataset._build_messages: each string content split at `<image>` into
    [{"type": "text"}, {"type": "image"}, ...] parts, the images taken in order."""
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if not (isinstance(prompt, list) and all(isinstance(m, dict) and "content" in m for m in prompt)):
        raise ValueError(f"{where}a prompt with images must be a list of chat messages, got {type(prompt).__name__}")
    messages = copy.deepcopy(prompt)
    used = 0
    for message in messages:
        content = message["content"]
        if not images or not isinstance(content, str):
            continue
        parts = []
        for segment in (s for s in _PLACEHOLDER.split(content) if s):
            if segment == "<video>":
                raise ValueError(f"{where}<video> placeholders are not supported (images only)")
            if segment == "<image>":
                if used >= len(images):
                    raise ValueError(f"{where}the prompt has more <image> placeholders than the row's {len(images)}")
                parts.append({"type": "image", "image": images[used]})
                used += 1
            else:
                parts.append({"type": "text", "text": segment})
        message["content"] = parts
    if used != len(images):
        raise ValueError(f"{where}the row has {len(images)} image(s) and its prompt {used} <image> placeholder(s)")
    return messages


class VisionPrompts:
    """Rows -> the processor's inputs for one dataset (`config`: the typed `data` section;
    `processor.config`: the checkpoint's config, which load_processor keeps there as verl does)."""

    def __init__(self, processor, config, pad_token_id: int, chat_kwargs: dict):
        self.processor = processor
        self.index = rope_index(processor.config)
        self.image_key = config.image_key
        self.max_prompt_length = config.max_prompt_length
        self.pad_token_id = pad_token_id
        self.chat_kwargs = chat_kwargs

    def _process(self, row: dict, prompt, where: str):
        images = [process_image(img, where) for img in (row.get(self.image_key) or [])]
        if images:
            messages = build_messages(prompt, images, where)
        elif has_image_parts(prompt):  # images inline in the messages (SkyRL's examples)
            messages, images = message_images(prompt, where)
        else:
            messages = prompt
        text = self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_kwargs
        )
        inputs = self.processor(text=[text], images=images or None, return_tensors="pt")
        return images, text, inputs

    def length(self, row: dict, prompt, where: str) -> int:
        return int(self._process(row, prompt, where)[2]["input_ids"].shape[1])

    def encode(self, row: dict, prompt, where: str, full_prompt: bool = False) -> dict:
        """The model's fields of one row (`full_prompt`: the rendered chat text too, verl's
        `full_prompts`, data.return_full_prompt); `row` loses its image column."""
        images, text, inputs = self._process(row, prompt, where)
        row.pop(self.image_key, None)
        ids, mask = inputs["input_ids"][0], inputs["attention_mask"][0]
        if len(ids) > self.max_prompt_length:
            raise ValueError(
                f"{where}the prompt with its image tokens is {len(ids)} tokens, longer than data.max_prompt_length="
                f"{self.max_prompt_length}; a prompt with images is not truncated (it would cut image tokens): raise "
                f"data.max_prompt_length or set data.filter_overlong_prompts=true"
            )
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.cat([torch.full((pad,), self.pad_token_id, dtype=torch.long), ids.long()])
        attention_mask = torch.cat([torch.zeros(pad, dtype=torch.long), mask.long()])
        grid = inputs.get("image_grid_thw")
        vision = {"pixel_values": inputs["pixel_values"], "image_grid_thw": grid} if images else {}
        fields = {"full_prompts": text} if full_prompt else {}
        return fields | {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": mrope_position_ids(self.index, input_ids, attention_mask, grid if images else None),
            "raw_prompt_ids": self.processor.tokenizer.encode(text, add_special_tokens=False),
            "multi_modal_inputs": vision,
            "multi_modal_data": {"image": images},
        }


# ---- what a vision-language run does not combine with, refused at start ------------------


def vision_checkpoint_type(model) -> str | None:
    """The model_type of `actor_rollout_ref.model` when it is a local vision-language checkpoint
    loaded whole (its config.json has a vision_config; language_model_only=false), else None."""
    import json
    import os

    full = os.path.join(os.path.expanduser(str(model.path or "")), "config.json")
    if model.language_model_only or not os.path.isfile(full):
        return None
    try:
        with open(full) as f:
            config_json = json.load(f)
    except (OSError, ValueError):
        return None  # hybrid/preflight_models.py reports the unreadable config.json itself
    if not isinstance(config_json, dict):
        return None
    return config_json.get("model_type", "?") if config_json.get("vision_config") is not None else None


MT = "actor_rollout_ref.rollout.multi_turn"


def vision_problems(config, model_type: str) -> list[str]:
    """One line per setting a vision-language policy cannot run with (yet), each naming its key."""
    arr = config.actor_rollout_ref
    problem = unsupported_vision_model(model_type)
    if problem:
        return [f"actor_rollout_ref.model.path: {problem}"]
    why = f"the policy is a vision-language model ({model_type})"
    multi_turn = arr.rollout.multi_turn
    checks = [
        (
            arr.rollout.name not in engines_with(images=True),
            f"actor_rollout_ref.rollout.name={arr.rollout.name}: {why}, and hybrid generates with images on the "
            f"engines {', '.join(engines_with(images=True))}; set actor_rollout_ref.rollout.name to one of them",
        ),
        (
            arr.ref.model.path not in (None, arr.model.path),
            f"actor_rollout_ref.ref.model.path={arr.ref.model.path}: {why}; a reference model of its own (a "
            f"distillation teacher) is not given the images; leave ref.model.path unset",
        ),
        (
            arr.model.use_remove_padding,
            f"actor_rollout_ref.model.use_remove_padding=true: {why}, and packed rows are not built for vision "
            f"inputs (multimodal positions, the vision tower's own sequence boundaries); set it to false",
        ),
        (
            bool(arr.actor.use_prefix_grouper),
            f"actor_rollout_ref.actor.use_prefix_grouper=true: {why}; prompt-once packing is not built for vision "
            f"inputs; set it to false",
        ),
        (
            arr.actor.ulysses_sequence_parallel_size > 1,
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={arr.actor.ulysses_sequence_parallel_size}: "
            f"{why}; sequence parallelism is not built for vision inputs; set it to 1",
        ),
        (
            arr.rollout.mode == "async" or config.async_mode is not None,
            f"{why}: agent loops and asynchronous training do not carry images yet; use the lock-step rollout "
            f"(rollout.mode=sync, hybrid_engine=true), single- or multi-turn",
        ),
        (
            multi_turn.enable and multi_turn.step_wise_trajectories,
            f"{MT}.step_wise_trajectories=true: {why}; step-wise samples do not carry images (SkyRL's "
            f"vision-language generator refuses them too); set it to false",
        ),
        (
            multi_turn.enable and not multi_turn.use_conversation_multi_turn,
            f"{MT}.use_conversation_multi_turn=false: {why}; observations with images must be chat messages "
            f"(SkyRL's vision-language generator requires it too); set it to true",
        ),
        (
            config.use_critic,
            f"{why}: the critic does not take images; use a critic-free estimator (algorithm.adv_estimator=grpo, "
            f"rloo, reinforce_plus_plus, ...) or critic.enable=false",
        ),
        (
            config.reward_model.enable,
            f"reward_model.enable=true: {why}, and the reward model does not take images; score with a rule reward",
        ),
        (
            estimator_spec(config.algorithm.adv_estimator).greedy_baseline,
            f"algorithm.adv_estimator={config.algorithm.adv_estimator}: {why}; its greedy baseline generation does "
            f"not carry images yet",
        ),
    ]
    return [message for bad, message in checks if bad]


__all__ = [
    "VisionPrompts",
    "build_messages",
    "load_processor",
    "process_image",
    "vision_checkpoint_type",
    "vision_problems",
    "vision_processor",
]
