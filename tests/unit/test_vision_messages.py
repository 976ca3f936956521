"""Images in chat messages (workers/vision_messages.py): OpenAI-style content parts as SkyRL's
geometry3k data and VisGym's observations write them (image_url data URIs, image parts,
parquet's null-filled parts and arrays) -> the messages a Qwen-VL chat template renders and
the images in order; the vLLM prompt form (one placeholder per image, workers/vision.py); a
vision-language policy on vLLM without torchvision stops at engine start in one line."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image


def _image(color, size=(4, 6)):
    return Image.new("RGB", size, color)


def _uri(image, fmt="PNG"):
    out = io.BytesIO()
    image.save(out, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(out.getvalue()).decode()


def test_image_parts_become_placeholders_and_images_in_order():
    from workers.vision_messages import has_image_parts, message_images

    red, blue = _image((255, 0, 0)), _image((0, 0, 255), size=(8, 2))
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": _uri(red)}, "text": None},  # parquet fills absent keys
                {"type": "text", "text": "and", "image_url": None},
                {"type": "image", "image": blue},
            ],
        },
    ]
    assert has_image_parts(messages) and not has_image_parts(messages[:1])
    out, images = message_images(messages)
    assert out == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]},
    ]
    assert [im.size for im in images] == [(4, 6), (8, 2)]
    assert images[0].getpixel((0, 0)) == (255, 0, 0) and images[1].getpixel((0, 0)) == (0, 0, 255)
    # Parquet gives lists as arrays: the same.
    as_arrays = [{**m, "content": np.array(m["content"], dtype=object)} if m["role"] == "user" else m for m in messages]
    assert message_images(np.array(as_arrays, dtype=object))[0] == out


@pytest.mark.parametrize(
    "part, message",
    [
        ({"type": "image_url", "image_url": {"url": "https://x/y.png"}}, "images are not downloaded"),
        ({"type": "image_url", "image_url": None}, "a content part of type 'image_url' without its 'image_url' field"),
        ({"type": "audio", "audio": "a"}, "a message content part of type 'audio' (text, image or image_url)"),
        ({"type": "image_url", "image_url": {"url": "data:image/png,abc"}}, "must be base64-encoded"),
    ],
)
def test_unreadable_parts_are_named(part, message):
    from workers.vision_messages import message_images

    with pytest.raises(ValueError, match="row 3: ") as err:
        message_images([{"role": "user", "content": [part]}], "row 3: ")
    assert message in str(err.value)


def test_vllm_prompt_has_one_placeholder_per_image():
    from workers.vision import collapse_image_tokens

    start, pad, end = 7, 9, 8
    ids = [1, start, pad, pad, pad, pad, end, 2, start, pad, end, start, pad, pad, end, 3]
    assert collapse_image_tokens(ids, pad) == [1, start, pad, end, 2, start, pad, end, start, pad, end, 3]
    assert collapse_image_tokens([1, 2], pad) == [1, 2]


def test_vllm_with_a_vision_policy_needs_torchvision_at_engine_start(monkeypatch):
    import transformers.utils

    from workers.rollout.vllm_rollout import vision_engine_check

    class Model:
        language_model_only = False

    vision = type("Config", (), {"vision_config": {}, "image_token_id": 151655})()
    text = type("Config", (), {"vision_config": None})()
    assert vision_engine_check(Model(), text) is None
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: False)
    with pytest.raises(RuntimeError) as err:
        vision_engine_check(Model(), vision)
    assert str(err.value) == (
        "actor_rollout_ref.rollout.name=vllm with a vision-language policy: vLLM's Qwen-VL models need torchvision, "
        f"which is not installed; install the torchvision build matching torch {torch.__version__}, or set "
        "actor_rollout_ref.rollout.name=hf"
    )
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: True)
    assert vision_engine_check(Model(), vision) == 151655
