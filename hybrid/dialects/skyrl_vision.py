"""SkyRL's `generator.vision_language_generator` as a rule of the SkyRL dialect.

SkyRL (skyrl/train/generators/skyrl_vlm_generator.py, SkyRLVLMGymGenerator) runs each
trajectory as an agent loop whose conversation carries images: the prompt's (OpenAI-style
`image_url` parts, as its geometry3k data writes them) and those every environment step
returns (VisGym's rendered frames); each turn the whole conversation is rendered by the
engine's processor, the model's tokens are kept as sampled, the observation tokens (image
tokens included) are masked out of the loss, and the trajectory's pixel_values /
image_grid_thw go to the trainer.

hybrid's multi-turn loop does the same for a vision-language policy (a checkpoint with a
vision_config: workers/rollout/multi_turn_images.py, docs/vision_language.md): `true` writes
no key of its own; the episode keys come from the multi-turn rules (generator.max_turns,
environment.env_class). Two differences of scheduling, not of samples: SkyRL's per-trajectory
agent loop (`generator.batched=false`) runs in hybrid's lock-step loop (its agent loops do not
carry images), so batched=false does not switch on `rollout.mode=async` here; and where no
episode runs (max_turns 1 and a single-turn scorer's env_class) the prompts with images are
hybrid's single-turn vision-language rollout. SkyRL's own checks are kept: it refuses
batched=true, step-wise trajectories and use_conversation_multi_turn=false with this generator.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.table import Context, Refusal, custom

VLM = "generator.vision_language_generator"


def vision_generator(ctx: Context) -> bool:
    """Whether the line asks for SkyRL's vision-language generator."""
    return ctx.get(VLM, False) is True


def _convert(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if not value:
        return {}
    # SkyRLVLMGymGenerator._validate_cfg
    if ctx.get("generator.batched", False) is True:
        raise Refusal("SkyRL's vision-language generator refuses generator.batched=true; set batched=false")
    if ctx.get("generator.step_wise_trajectories", False) is True:
        raise Refusal("SkyRL's vision-language generator refuses generator.step_wise_trajectories=true")
    if ctx.get("generator.use_conversation_multi_turn", True) is False:
        raise Refusal(
            "SkyRL's vision-language generator requires generator.use_conversation_multi_turn=true (observations "
            "with images are chat messages)"
        )
    return {}


VISION_RULE = custom(
    VLM,
    (),
    _convert,
    "true: the multi-turn loop (from max_turns / env_class) carries the prompt's and every observation's images "
    "for a vision-language policy; batched=true, step-wise trajectories and use_conversation_multi_turn=false "
    "refused, as SkyRL refuses them",
    "SkyRL's SkyRLVLMGymGenerator: images in the conversation rendered by the processor each turn, observation "
    "and image tokens masked; hybrid's lock-step loop builds the same samples (workers/rollout/multi_turn_images.py; "
    "on vLLM the engine needs torchvision); a text policy runs the text loop",
)

__all__ = ["VISION_RULE", "VLM", "vision_generator"]
