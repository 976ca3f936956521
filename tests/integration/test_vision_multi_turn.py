"""Multi-turn episodes with images (workers/rollout/multi_turn_images.py): one GRPO step of the
tiny random Qwen2.5-VL (tests/integration/vision_helpers.py) on the Hugging Face engine, whose
prompts carry an image inline (an `image_url` part with a data URI, as SkyRL's geometry3k data)
and whose environment (vision_helpers.ImageStepEnv, as VisGym's) answers each of the first
two model turns with an image of its own.

Checked against transformers itself: the old log-probs the actor computed for each whole
multi-image sequence equal a direct forward of the checkpoint's model given the trajectory's
images, whose multimodal positions transformers computes itself (mm_token_type_ids); every
observation token, image tokens included, has mask 0; each image's token count is the
processor's for that image alone."""

from __future__ import annotations

import pytest
import torch

from tests.integration.checkpoint_helpers import run_config
from tests.integration.vision_helpers import (
    OBSERVATION_SIZES,
    image_message,
    random_image,
    tiny_qwen25_vl_dir,
)

pytestmark = pytest.mark.integration

MT = "actor_rollout_ref.rollout.multi_turn"
PROMPT_SIZE = (8, 8)  # 1 image token (4-pixel patches merged 2 x 2)


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory, default_model_dir) -> str:
    return tiny_qwen25_vl_dir(tmp_path_factory, default_model_dir)


@pytest.fixture(scope="module")
def episode_files(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("vl_mt_data")
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [image_message(f"What is {i} + {i}?", random_image(*PROMPT_SIZE, seed=i))],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i},
        }
        for i in range(4)
    ]
    files = {}
    for split in ("train", "val"):
        files[split] = root / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), files[split])
    return files


def _image_tokens(processor, size) -> int:
    """The placeholder count the processor gives one image of `size` pixels, alone."""
    grid = processor.image_processor(images=[random_image(*size, seed=0)], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod()) // processor.image_processor.merge_size**2


def test_episode_with_an_image_per_step(vl_dir, episode_files, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from hybrid.multimodal import vision_processor
    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer, as_typed
    from reward.loader import load_reward_manager
    from workers.device import current_device

    cfg = run_config(
        vl_dir,
        episode_files,
        tmp_path / "out",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.rollout.load_format=dummy",
        "trainer.total_training_steps=1",
        "data.return_raw_chat=true",
        "data.max_response_length=96",
        f"{MT}.enable=true",
        f"{MT}.env_class=tests.integration.vision_helpers:ImageStepEnv",
        f"{MT}.max_assistant_turns=3",
        f"{MT}.max_tokens_per_turn=4",
    )
    tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    processor = vision_processor(cfg.actor_rollout_ref.model)
    train_dl, val_dl = build_dataloaders(cfg, tokenizer, processor)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    trainer = PPOTrainer(as_typed(cfg), tokenizer, train_dl, val_dl, reward_fn, reward_fn)
    seen = []
    try:
        trainer.init_workers()
        actor = trainer.actor_rollout_wg.worker.actor
        compute = actor.compute_log_prob

        def recording(data, *args, **kwargs):
            log_probs, entropy = compute(data, *args, **kwargs)
            seen.append((data, log_probs))
            return log_probs, entropy

        actor.compute_log_prob = recording
        trainer.fit()
    finally:
        trainer.shutdown()

    data, actor_log_probs = seen[0]
    ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
    responses, response_mask = data.batch["responses"], data.batch["response_mask"].bool()
    assert len(data) == 8 and data.batch["position_ids"].shape[1:] == (4, ids.shape[1])
    image_token = processor.config.image_token_id
    per_image = [_image_tokens(processor, size) for size in (PROMPT_SIZE, *OBSERVATION_SIZES)]
    assert per_image == [1, 4, 2]
    for i in range(len(data)):
        # Every episode ran 3 model turns with 2 observations, each with its image.
        assert data.non_tensor_batch["multi_turn_turns"][i] == 3
        grids = data.non_tensor_batch["multi_modal_inputs"][i]["image_grid_thw"]
        assert [int(g.prod()) // 4 for g in grids] == per_image
        assert int((ids[i] == image_token).sum()) == sum(per_image)
        in_response = responses[i] == image_token
        assert int(in_response.sum()) == sum(per_image[1:]) and not (in_response & response_mask[i]).any()
    # The images inside the response move the positions after them: plain continuation (prompt's
    # last position + 1 per token, a text rollout's) would be other positions.
    width = data.batch["prompts"].shape[1]
    continued = data.batch["position_ids"][:, 1:, width - 1 : width] + torch.arange(1, responses.shape[1] + 1)
    assert not torch.equal(
        data.batch["position_ids"][:, 1:, width:][response_mask.unsqueeze(1).expand_as(continued)],
        continued[response_mask.unsqueeze(1).expand_as(continued)],
    )

    reference = AutoModelForImageTextToText.from_pretrained(vl_dir, dtype=torch.float32).to(current_device()).eval()
    device = reference.device
    direct = torch.zeros(responses.shape)
    with torch.no_grad():
        for i in range(len(data)):
            vision = data.non_tensor_batch["multi_modal_inputs"][i]
            row = ids[i : i + 1].to(device)
            logits = reference(
                input_ids=row,
                attention_mask=mask[i : i + 1].to(device),
                mm_token_type_ids=(row == image_token).int(),
                pixel_values=vision["pixel_values"].to(device),
                image_grid_thw=vision["image_grid_thw"].to(device),
            ).logits
            steps = logits[0, -responses.shape[1] - 1 : -1].log_softmax(-1)
            direct[i] = steps.gather(-1, responses[i].to(device).unsqueeze(-1)).squeeze(-1).cpu()
    assert response_mask.sum() == 8 * 12  # 3 turns of 4 sampled tokens each
    torch.testing.assert_close(actor_log_probs[response_mask], direct[response_mask], rtol=0, atol=1e-5)
