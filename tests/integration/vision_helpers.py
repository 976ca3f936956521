"""A tiny random Qwen2.5-VL checkpoint for the vision-language tests: a 2-layer, hidden-64
language model and a 1-block vision tower with 4-pixel patches merged 2x2 (an image of
H x W pixels gives (H/4)(W/4) patches and a quarter as many image tokens).

No Qwen-VL tokenizer or processor is available offline here, so the tokenizer is SmolLM2's
with Qwen's vision tokens added (<|vision_start|>, <|vision_end|>, <|image_pad|>,
<|video_pad|>) and a Qwen-style chat template that renders image parts as
<|vision_start|><|image_pad|><|vision_end|>; the image processor is transformers'
Qwen2VLImageProcessorPil with patch 4, merge 2 and at most 64 x 64 pixels. The folder holds
them as a Qwen2.5-VL folder does (tokenizer files, preprocessor_config.json,
chat_template.jinja); hybrid.multimodal.load_processor builds the processor from it."""

from __future__ import annotations

import os

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def vision_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=8 * 8, max_pixels=64 * 64
    )


def tiny_qwen25_vl_config(tokenizer):
    from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig

    ids = {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in zip(("start", "end", "image", "video"), VISION_TOKENS)
    }
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},  # head 32: 16 frequencies
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=16,
        fullatt_block_indexes=[0],
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["start"],
        vision_end_token_id=ids["end"],
        tie_word_embeddings=True,
    )


def build_tiny_qwen25_vl_dir(out_dir, default_model_dir, seed: int = 0) -> str:
    import torch
    from transformers.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

    tokenizer = vision_tokenizer(default_model_dir)
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(tiny_qwen25_vl_config(tokenizer)).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    image_processor().save_pretrained(out_dir)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    return str(out_dir)


_BUILT: dict[str, str] = {}


def tiny_qwen25_vl_dir(tmp_path_factory, default_model_dir) -> str:
    """The tiny checkpoint, built once per test session (per pytest base temp folder) and shared
    by the vision test files, which only read it: each build costs ~5 s."""
    base = str(tmp_path_factory.getbasetemp())
    if base not in _BUILT:
        _BUILT[base] = build_tiny_qwen25_vl_dir(tmp_path_factory.mktemp("qwen25_vl"), default_model_dir)
    return _BUILT[base]


def random_image(height: int, width: int, seed: int):
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def data_uri(image) -> str:
    """A PNG data URI, as SkyRL's examples put images into messages (image_url parts)."""
    import base64
    import io

    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def image_message(text: str, image) -> dict:
    """An OpenAI-style user message with text and an image (VisGym's make_image_message)."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_uri(image)}}],
    }


OBSERVATION_SIZES = ((16, 16), (8, 16))  # the images an ImageStepEnv shows after turns 1 and 2


class ImageStepEnv:
    """A multi-turn environment whose every observation carries an image (as VisGym's, whose
    observations are rendered frames): after model turn k it shows an image of
    OBSERVATION_SIZES[k - 1] pixels (seeded by the row and the turn), for 3 model turns;
    the reward is the model turn count, on the last turn."""

    def __init__(self, env_config=None, extras=None):
        self.extras = dict(extras or {})
        self.turns = 0

    def init(self, prompt):
        return prompt, {}

    def step(self, action: str):
        self.turns += 1
        done = self.turns >= 3
        index = int((self.extras.get("extra_info") or {}).get("index", 0))
        observations = []
        if not done:
            height, width = OBSERVATION_SIZES[self.turns - 1]
            image = random_image(height, width, seed=100 * index + self.turns)
            observations = [image_message(f"Step {self.turns}. Look:", image)]
        return {"observations": observations, "reward": float(self.turns) if done else 0.0, "done": done}

    def close(self):
        pass

    def get_metrics(self):
        return {"steps": self.turns}
