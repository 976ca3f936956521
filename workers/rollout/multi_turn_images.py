"""Multi-turn episodes with images, for vision-language policies (SkyRL's
SkyRLVLMGymGenerator, `generator.vision_language_generator=true`): the prompt's images and
every image an environment's observation carries go through the processor's chat template
into the token sequence, each image's placeholder expanded to its tokens as the processor
does, and travel with the trajectory to the engine (every turn), the log-probs and the update.

`VisionLoop` is the lock-step loop of workers/rollout/multi_turn.py (token in, token out: the
sampled ids are kept as sampled) with, per trajectory, a `VisionState`: the images so far, in
sequence order, as PIL images (what vLLM takes, `multi_modal_data`) and as the processor's
`pixel_values` / `image_grid_thw` (what transformers takes). Differences from the text loop:

* the first prompt: the data loader's tokens and images (its `multi_modal_inputs`, images
  from `data.image_key` or inline in the messages) when the environment's `init` returned the
  row's messages unchanged; else the environment's messages rendered by the processor (images
  inline as OpenAI-style `image` / `image_url` parts, as SkyRL's VisGym environment returns);
* an observation is rendered by the processor after the same fixed base conversation as the
  text loop's, and the appended slice kept: its image placeholders expanded, its images'
  pixels added to the trajectory's; observation tokens, image tokens included, have mask 0;
* the output gives each sample its own `multi_modal_inputs` (all of its trajectory's images,
  in order) and position ids of shape (4, L) from the model's own `get_rope_index` over the
  whole prompt + response sequence (workers/vision.py), where a text rollout continues the
  prompt's positions by one per token: images inside the response move the positions after them.

Step-wise samples, plain-text observations (use_conversation_multi_turn=false) and agent loops
are refused for a vision-language policy at start (hybrid/multimodal.py vision_problems).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.data_proto import DataProto
from workers.rollout.multi_turn import BASE_CONVERSATION, MultiTurnLoop, Trajectory, _chat
from workers.vision import MULTI_MODAL_INPUTS, mrope_position_ids, rope_index
from workers.vision_messages import message_images


@dataclass
class VisionState:
    """The images of one trajectory so far, in the order of their placeholders."""

    images: list = field(default_factory=list)  # PIL images (vLLM's multi_modal_data)
    pixel_values: list[torch.Tensor] = field(default_factory=list)
    grids: list[torch.Tensor] = field(default_factory=list)

    def add(self, images: list, inputs: dict) -> None:
        if images:
            self.images += images
            self.pixel_values.append(inputs["pixel_values"])
            self.grids.append(inputs["image_grid_thw"])

    def inputs(self) -> dict:
        """The trajectory's `multi_modal_inputs` (verl's per-row dict; empty without images)."""
        if not self.images:
            return {}
        return {"pixel_values": torch.cat(self.pixel_values), "image_grid_thw": torch.cat(self.grids)}

    def grid(self) -> torch.Tensor | None:
        return torch.cat(self.grids) if self.grids else None


def _same_messages(a, b) -> bool:
    """Whether two chat conversations are the same (parquet's arrays read as lists)."""

    def canonical(messages):
        return json.dumps(_plain(messages), sort_keys=True, default=repr)

    return canonical(a) == canonical(b)


def _plain(value):
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class VisionLoop(MultiTurnLoop):
    """The multi-turn loop over an engine whose `processor` is a vision-language processor
    (workers/vision_messages.py load_processor); see the module doc."""

    observation_parts = True  # observations may be lists of content parts (check_step_output)

    def __init__(self, engine):
        super().__init__(engine)
        self.processor = engine.processor
        self.index = rope_index(self.processor.config)
        base = self._render(list(BASE_CONVERSATION), generation_prompt=False)[0]
        ends = [i for i, tok in enumerate(base) if tok in self.eos_token_ids]
        if not ends:
            raise ValueError(
                "the processor's chat template does not end an assistant message with the EOS token, so "
                "observations with images cannot be appended after the model's turns"
            )
        self.base_ids = base[: ends[-1] + 1]

    def _render(self, messages, generation_prompt: bool, where: str = "") -> tuple[list[int], list, dict]:
        """(token ids with each image's placeholder expanded, the PIL images, the processor's
        pixel_values / image_grid_thw) of chat messages rendered by the processor."""
        messages, images = message_images(messages, where)
        text = self.processor.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        inputs = self.processor(text=[text], images=images or None, return_tensors="pt")
        vision = {k: inputs[k] for k in ("pixel_values", "image_grid_thw")} if images else {}
        return inputs["input_ids"][0].tolist(), images, vision

    # ------------------------------------------------------------------ the steps
    def set_prompt(self, trajectory: Trajectory, outcome, rows: list[dict], prompts: DataProto) -> None:
        if self._failed(trajectory, outcome, rows, "init"):
            return
        trajectory.vision = VisionState()
        input_ids, attention_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        row = rows[trajectory.row]
        messages = outcome.value[0] if isinstance(outcome.value, tuple) else outcome.value
        if _same_messages(messages, _chat(row["raw_prompt"])) and not self.factory.tools:
            # The data loader rendered these messages with these images (hybrid/multimodal.py).
            row_ids, row_mask = input_ids[trajectory.row], attention_mask[trajectory.row]
            trajectory.prompt_ids = row_ids[row_mask.bool()].tolist()
            loader_inputs = row.get(MULTI_MODAL_INPUTS) or {}
            loader_images = list((row.get("multi_modal_data") or {}).get("image") or [])
            trajectory.vision.add(loader_images, loader_inputs)
        else:
            where = f"{self._row_label(trajectory, rows)}: "
            trajectory.prompt_ids, images, vision = self._render(messages, True, where)
            trajectory.vision.add(images, vision)
            trajectory.prompt_rendered = True
            self._check_prompt_width(trajectory, rows, input_ids.shape[1], counted=" with its image tokens")
        if self.budget(trajectory) < 1:
            trajectory.finish = "length"

    def _model_turn(self, live: list[Trajectory], settings) -> None:
        budgets = [self.budget(t) for t in live]
        prompts = [self.turn_prompt(t) for t in live]
        turns = self.engine.generate_ids(prompts, settings, budgets, vision=[t.vision for t in live])
        texts = self.tokenizer.batch_decode([list(turn.token_ids) for turn in turns], skip_special_tokens=True)
        for trajectory, turn, budget, text in zip(live, turns, budgets, texts):
            self.apply_turn(trajectory, turn, budget, text)

    def _append_observation(self, trajectory: Trajectory, observations: list[dict]) -> None:
        ids, images, vision = self._render(list(BASE_CONVERSATION) + list(observations), True)
        if ids[: len(self.base_ids)] != self.base_ids:
            raise ValueError(
                "the processor's chat template renders the conversation before an observation differently once "
                "the observation is added; token-in-token-out needs it unchanged"
            )
        if self.append_observation_ids(trajectory, ids[len(self.base_ids) :]):
            trajectory.vision.add(images, vision)

    # ------------------------------------------------------------------ output
    def assemble(
        self, prompts: DataProto, trajectories: list[Trajectory], n: int, width: int | None = None
    ) -> DataProto:
        """The text loop's samples, each with its own images and (4, L) multimodal positions."""
        out = super().assemble(prompts, trajectories, n, width)
        ids, mask = out.batch["input_ids"], out.batch["attention_mask"]
        states = [t.vision or VisionState() for t in trajectories]
        out.batch["position_ids"] = torch.stack(
            [mrope_position_ids(self.index, ids[i], mask[i], state.grid()) for i, state in enumerate(states)]
        )
        column = np.empty(len(states), dtype=object)
        column[:] = [state.inputs() for state in states]
        out.non_tensor_batch[MULTI_MODAL_INPUTS] = column
        return out


__all__ = ["VisionLoop", "VisionState"]
