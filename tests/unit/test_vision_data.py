"""Vision-language prompts (hybrid/multimodal.py, workers/vision.py): a dataset row with images
-> input ids, pixel values, image grids and the (4, L) multimodal position ids, checked against
hand-computed values for the tiny processor of tests/integration/vision_helpers.py (4-pixel
patches merged 2 x 2: an H x W image is an (H/4) x (W/4) patch grid, a quarter as many tokens);
the rollout's response positions; the settings refused at start."""

from __future__ import annotations

import io
import types

import pytest
import torch

from tests.integration.vision_helpers import (
    CHAT_TEMPLATE,
    image_processor,
    random_image,
    tiny_qwen25_vl_config,
    vision_tokenizer,
)


@pytest.fixture(scope="module")
def processor(default_model_dir):
    from transformers import Qwen2_5_VLProcessor

    from hybrid.multimodal import _image_only

    tokenizer = vision_tokenizer(default_model_dir)
    built = _image_only(Qwen2_5_VLProcessor)(
        image_processor=image_processor(), tokenizer=tokenizer, video_processor=None, chat_template=CHAT_TEMPLATE
    )
    built.config = tiny_qwen25_vl_config(tokenizer)
    return built


def _prompts(processor, max_len: int = 48):
    from hybrid.multimodal import VisionPrompts

    data = types.SimpleNamespace(image_key="images", max_prompt_length=max_len)
    return VisionPrompts(processor, data, processor.tokenizer.pad_token_id, {})


def _ids(processor, text: str) -> list[int]:
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_row_with_two_images(processor):
    """An 8 x 8 image (2 x 2 patches: 1 token) and a 16 x 24 one (4 x 6 patches: 6 tokens)."""
    small, large = random_image(8, 8, seed=1), random_image(16, 24, seed=2)
    prompt = [{"role": "user", "content": "<image>and<image>sum?"}]
    row = {"images": [small, {"bytes": _png(large)}], "prompt": prompt}
    out = _prompts(processor).encode(row, prompt, "", full_prompt=True)
    assert "images" not in row and out["multi_modal_data"]["image"][1].size == (24, 16)
    grid = out["multi_modal_inputs"]["image_grid_thw"]
    assert grid.tolist() == [[1, 2, 2], [1, 4, 6]]
    # 3 channels x 2 frames x 4 x 4 pixels per patch; 4 + 24 patches.
    assert out["multi_modal_inputs"]["pixel_values"].shape == (28, 96)

    head = "<|im_start|>user\n<|vision_start|>"
    middle = "<|vision_end|>and<|vision_start|>"
    tail = "<|vision_end|>sum?<|im_end|>\n<|im_start|>assistant\n"
    pad = "<|image_pad|>"
    assert out["full_prompts"] == head + pad + middle + pad + tail  # the chat template's text, before expansion
    expected = _ids(processor, head + pad + middle + pad * 6 + tail)
    n = len(expected)
    assert out["input_ids"][-n:].tolist() == expected and out["attention_mask"].tolist() == [0] * (48 - n) + [1] * n
    assert out["input_ids"][: 48 - n].tolist() == [processor.tokenizer.pad_token_id] * (48 - n)
    assert out["raw_prompt_ids"] == _ids(processor, head + pad + middle + pad + tail)  # vLLM expands these itself

    # By hand: text counts on; an image's tokens sit at (start, start + row, start + column) in
    # the merged grid and the text after it resumes at start + max(rows, columns).
    a, m = len(_ids(processor, head)), len(_ids(processor, middle))
    b = a + 1 + m  # the small image is one token at position a, the text after it resumes at a + 1
    t, h, w = list(range(a)), list(range(a)), list(range(a))
    t, h, w = t + [a], h + [a], w + [a]
    text = list(range(a + 1, b))
    t, h, w = t + text, h + text, w + text
    t, h, w = t + [b] * 6, h + [b, b, b, b + 1, b + 1, b + 1], w + [b, b + 1, b + 2] * 2
    rest = list(range(b + 3, b + 3 + n - len(t)))
    vision = torch.tensor([t + rest, h + rest, w + rest])
    positions = out["position_ids"]
    assert positions.shape == (4, 48)
    assert positions[0].tolist() == [0] * (48 - n) + list(range(n))
    assert torch.equal(positions[1:, 48 - n :], vision) and not positions[1:, : 48 - n].any()


def _png(image) -> bytes:
    out = io.BytesIO()
    image.convert("L").save(out, format="PNG")  # grayscale: process_image converts to RGB
    return out.getvalue()


def test_too_long_prompt_is_refused(processor):
    prompt = [{"role": "user", "content": "<image>What?"}]
    with pytest.raises(ValueError) as err:
        _prompts(processor, max_len=10).encode({"images": [random_image(16, 24, 0)]}, prompt, "data file f row 3: ")
    assert str(err.value) == (
        "data file f row 3: the prompt with its image tokens is 19 tokens, longer than data.max_prompt_length=10; "
        "a prompt with images is not truncated (it would cut image tokens): raise data.max_prompt_length or set "
        "data.filter_overlong_prompts=true"
    )


def test_build_messages_as_verl():
    from hybrid.multimodal import build_messages

    one, two = object(), object()
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>a <image>b"}]
    assert build_messages(prompt, [one, two])[1]["content"] == [
        {"type": "image", "image": one},
        {"type": "text", "text": "a "},
        {"type": "image", "image": two},
        {"type": "text", "text": "b"},
    ]
    assert prompt[1]["content"] == "<image>a <image>b"  # the row's own messages are left as they were
    with pytest.raises(ValueError, match=r"^r: the row has 2 image\(s\) and its prompt 1 <image> placeholder\(s\)$"):
        build_messages([{"role": "user", "content": "<image>x"}], [one, two], "r: ")
    with pytest.raises(ValueError, match=r"^r: the prompt has more <image> placeholders than the row's 1$"):
        build_messages([{"role": "user", "content": "<image><image>x"}], [one], "r: ")


def test_batch_vision_inputs_in_row_order():
    from workers.vision import batch_vision_inputs, vision_model_inputs

    rows = [
        {"pixel_values": torch.full((4, 2), 1.0), "image_grid_thw": torch.tensor([[1, 2, 2]])},
        {},  # a row without an image
        {"pixel_values": torch.full((8, 2), 3.0), "image_grid_thw": torch.tensor([[1, 2, 4]])},
    ]
    out = batch_vision_inputs(rows)
    assert out["pixel_values"][:, 0].tolist() == [1.0] * 4 + [3.0] * 8
    assert out["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]
    assert batch_vision_inputs([{}, {}]) == {}
    positions = torch.arange(2 * 4 * 5).reshape(2, 4, 5)
    inputs = vision_model_inputs({"input_ids": None, "position_ids": positions}, rows)
    assert torch.equal(inputs["position_ids"], positions.transpose(0, 1))
    with pytest.raises(ValueError, match=r"needs position ids of shape \(batch, 4, length\), got \(2, 5\)"):
        vision_model_inputs({"position_ids": positions[:, 0]}, rows)


def test_response_positions_continue_every_row():
    from workers.rollout.base import assemble_rollout

    prompt_pos = torch.tensor([[[0, 0, 1], [0, 0, 1], [0, 0, 3], [0, 0, 5]]])  # (1, 4, 3)
    out = assemble_rollout(
        torch.tensor([[0, 7, 8]]),
        torch.tensor([[0, 1, 1]]),
        prompt_pos,
        [[5, 6]],
        None,
        n=1,
        response_length=2,
        pad_token_id=0,
        eos_token_ids={9},
    )
    assert out.batch["position_ids"].tolist() == [[[0, 0, 1, 2, 3], [0, 0, 1, 2, 3], [0, 0, 3, 4, 5], [0, 0, 5, 6, 7]]]


def test_vision_settings_refused_in_one_line():
    from hybrid.config import build_config
    from hybrid.multimodal import vision_problems

    ok_args = [
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.model.use_remove_padding=false",
        "algorithm.adv_estimator=grpo",
    ]
    ok = build_config(ok_args)
    assert vision_problems(ok, "qwen2_5_vl") == []
    # vLLM and multi-turn episodes are accepted (vLLM's torchvision is checked at engine start).
    episodes = ["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true"]
    assert (
        vision_problems(build_config([*ok_args, "actor_rollout_ref.rollout.name=vllm", *episodes]), "qwen2_5_vl") == []
    )
    bad = build_config(["actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=grpo"])
    assert vision_problems(bad, "qwen2_5_vl") == [
        "actor_rollout_ref.model.use_remove_padding=true: the policy is a vision-language model (qwen2_5_vl), and "
        "packed rows are not built for vision inputs (multimodal positions, the vision tower's own sequence "
        "boundaries); set it to false",
    ]
    mt = "actor_rollout_ref.rollout.multi_turn"
    step_wise = build_config([*ok_args, *episodes, f"{mt}.step_wise_trajectories=true"])
    assert vision_problems(step_wise, "qwen2_5_vl") == [
        f"{mt}.step_wise_trajectories=true: the policy is a vision-language model (qwen2_5_vl); step-wise samples "
        "do not carry images (SkyRL's vision-language generator refuses them too); set it to false"
    ]
    plain = build_config([*ok_args, *episodes, f"{mt}.use_conversation_multi_turn=false"])
    assert vision_problems(plain, "qwen2_5_vl") == [
        f"{mt}.use_conversation_multi_turn=false: the policy is a vision-language model (qwen2_5_vl); observations "
        "with images must be chat messages (SkyRL's vision-language generator requires it too); set it to true"
    ]
    assert vision_problems(ok, "llava") == [
        "actor_rollout_ref.model.path: model_type llava: hybrid trains the vision-language models qwen2_5_vl, "
        "qwen2_vl, qwen3_vl (their multimodal position ids are known); use one of those, or "
        "actor_rollout_ref.model.language_model_only=true to train the language model alone on text"
    ]


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen3_vl"])
def test_rope_index_bound_to_the_config_as_the_model_computes_it(kind):
    """Qwen2-VL and Qwen3-VL (Qwen2.5-VL is checked by hand above): the positions workers/vision.py
    computes from the config alone equal those of a model instance's own get_rope_index."""
    from transformers.models.qwen2_vl import Qwen2VLConfig, Qwen2VLModel
    from transformers.models.qwen3_vl import Qwen3VLConfig, Qwen3VLModel

    from workers.vision import mrope_position_ids, rope_index

    text = dict(vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2)
    tokens = dict(image_token_id=101, video_token_id=103, vision_start_token_id=100, vision_end_token_id=102)
    if kind == "qwen2_vl":
        rope = {"type": "mrope", "mrope_section": [4, 6, 6]}
        vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=4, spatial_merge_size=2)
        config, cls = (
            Qwen2VLConfig(text_config={**text, "rope_scaling": rope}, vision_config=vision, **tokens),
            Qwen2VLModel,
        )
    else:
        rope = {"rope_type": "default", "mrope_section": [4, 6, 6], "mrope_interleaved": True}
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4)
        vision |= dict(spatial_merge_size=2, deepstack_visual_indexes=[0])
        config = Qwen3VLConfig(
            text_config={**text, "head_dim": 32, "rope_scaling": rope}, vision_config=vision, **tokens
        )
        cls = Qwen3VLModel
    ids = torch.tensor([0, 0, 5, 6, 100] + [101] * 6 + [102, 8, 9])
    mask = (ids != 0).long()
    grid = torch.tensor([[1, 4, 6]])
    ours = mrope_position_ids(rope_index(config), ids, mask, grid)
    theirs, _ = cls(config).get_rope_index(
        ids[None], mm_token_type_ids=(ids == 101).int()[None], image_grid_thw=grid, attention_mask=mask[None]
    )
    assert torch.equal(ours[1:], theirs[:, 0])
    assert ours[1:, 2:].tolist()[1] == [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8]  # height: rows of the merged 2 x 3 grid
