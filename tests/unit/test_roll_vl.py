"""ROLL's vision-language RLVR example (examples/qwen2_5-vl-3B-rlvr_fsdp2): its YAML composes, and
its data path: rows with images routed to domains by data_source (ROLL's VLM pipeline), each
detection row's reward_model settings and the size of the image the model saw reaching
DetectionRewardWorker's scorer (reward/row_fields.py, reward/scorers/roll_detection.py), the
math rows scored by the math scorer, in one batch built as run_ppo builds it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hybrid.dialects import translate_argv
from reward.domain_scorers import DomainScorers
from reward.row_fields import UNSEEN
from reward.scorers import roll_detection
from tests.integration.roll_helpers import write_example
from tests.integration.vision_helpers import (
    CHAT_TEMPLATE,
    image_processor,
    random_image,
    tiny_qwen25_vl_config,
    vision_tokenizer,
)

EXAMPLE = "examples/qwen2_5-vl-3B-rlvr_fsdp2/rlvr_fsdp2_offload.yaml"
DETECTION_TAGS = ["v3det_train", "object365_train", "coco_val_multi_test"]


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


def test_the_example_composes_with_the_detection_worker_mapped(tmp_path):
    path = write_example(tmp_path, EXAMPLE)
    got = dict(o.split("=", 1) for o in translate_argv(["--roll-config", str(path)]))
    assert got["data.domain_scorers.cv_detection"] == "'roll_detection'"
    assert got["data.domain_scorers.math"] == "'math'"
    assert got["data.domain_tags.cv_detection"] == "[" + ",".join(f"'{t}'" for t in DETECTION_TAGS) + "]"
    assert got["data.domain_tags.math"] == "['mm_math','megabench_math']"
    assert (got["data.domain_quotas.math"], got["data.domain_quotas.cv_detection"]) == ("0.5", "0.5")
    assert got["data.reward_fn_key"] == "'domain'" and got["data.prompt_key"] == "'prompt'"
    assert got["actor_rollout_ref.actor.freeze_module_prefix"] == "['model.visual']"
    assert got["actor_rollout_ref.rollout.name"] == "'vllm'"  # refused when the checkpoint is a VLM, at start
    assert "data.image_key" not in got  # verl's default, images: the column of ROLL's data


def _answer(boxes) -> str:
    return (
        "\n<answer>\n" + json.dumps([{"bbox_2d": b, "label": "cat"} for b in boxes]).replace('"', "'") + "\n</answer>"
    )


def _rows(tmp_path):
    """2 detection rows (a 16 x 24 image: the tiny processor keeps it, grid 1 x 4 x 6 patches of 4
    pixels), 3 math rows, and one row of an unlisted data_source. Their tag and domain columns
    name the other domain: ROLL's VLM pipeline reads neither (the tag is the data_source)."""
    image = tmp_path / "img.png"
    random_image(16, 24, seed=3).save(image)
    truth = "<answer>[{'bbox_2d': [0, 0, 1000, 500], 'label': 'cat'}]</answer>"
    ratio = {"iou_max_label_first": 1.0}

    def detection(source, normalized, format_ratio):
        parm = {"det_verifier_normalized": normalized, "det_reward_ratio": ratio}
        reward = {"ground_truth": truth, "verifier_parm": parm, "format_ratio": format_ratio, "accuracy_ratio": 1.0}
        return {"data_source": source, "reward_model": reward, "tag": "mm_math", "domain": "math"}

    def math(source):
        reward = {"ground_truth": "\\boxed{4}", "format_ratio": 0.0}
        return {"data_source": source, "reward_model": reward, "tag": "v3det_train", "domain": "cv_detection"}

    rows = [
        detection("v3det_train", True, 0.1),
        detection("object365_train", False, 1.0),
        math("mm_math"),
        math("megabench_math"),
        math("mm_math"),
        math("chart_qa"),
    ]
    for row in rows:
        row.update(images=[str(image)], prompt=[{"role": "user", "content": "<image>Find the cat."}])
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_mixed_batch_is_routed_by_data_source_and_each_detection_row_scored_with_its_own_fields(tmp_path, processor):
    from hybrid.config import load_config, validate_config
    from hybrid.run import build_dataloaders
    from protocol.data_proto import DataProto
    from reward.loader import load_reward_manager

    tokenizer = processor.tokenizer
    cfg = load_config(
        [
            f"data.train_files={_rows(tmp_path)}",
            "data.val_files=null",
            "data.max_prompt_length=64",
            "data.train_batch_size=5",
            "data.shuffle=false",
            "actor_rollout_ref.actor.ppo_mini_batch_size=5",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
            "data.reward_fn_key=domain",
            "data.domain_quotas.cv_detection=0.4",
            "data.domain_quotas.math=0.6",
            "data.domain_tags.cv_detection=[" + ",".join(DETECTION_TAGS) + "]",
            "data.domain_tags.math=[mm_math,megabench_math]",
            "data.default_domain=math_rule",
            "data.domain_scorers.cv_detection=roll_detection",
            "data.domain_scorers.math=math",
        ]
    )
    validate_config(cfg)
    train_dl, _ = build_dataloaders(cfg, tokenizer, processor)
    [batch] = list(train_dl)  # 5 rows of the two quota domains; chart_qa's row is math_rule, not drawn
    assert list(batch["domain"]) == ["cv_detection"] * 2 + ["math"] * 3
    assert list(batch["data_source"]) == ["v3det_train", "object365_train", "mm_math", "megabench_math", "mm_math"]
    # 16 x 24 pixels: 4 x 6 patches of 4 pixels, times the patch size again
    assert [seen for seen in batch["images_seen"]] == [{"model_type": "qwen2_5_vl", "sizes": [[16, 24]]}] * 5

    # Responses in the pixels of the 16 x 24 image: [0, 0, 12, 8] is [0, 0, 500, 500] on ROLL's 0..1000
    # scale, IoU 1/2 with the true [0, 0, 1000, 500]: only the 0.5 threshold of 11 matches, accuracy
    # 0.5 / 11 (iou_max_label_first alone, no completeness weight). Unnormalised it misses (IoU 96 / 5e5).
    responses = [_answer([[0, 0, 12, 8]])] * 2 + ["so \\boxed{4}", "\\boxed{5}", "no box"]
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in responses]
    width = max(map(len, ids))
    prompts, mask = batch["input_ids"], batch["attention_mask"]
    data = DataProto.from_single_dict(
        {
            "prompts": prompts,
            "responses": torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids]),
            "attention_mask": torch.cat(
                [mask, torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])], dim=-1
            ),
            **{k: batch[k] for k in ("domain", "reward_model", "images_seen")},
        }
    )
    scores = load_reward_manager(cfg, tokenizer, num_examine=0)(data).sum(dim=-1).tolist()
    normalized = float(np.float16((0.5 / 11) * (1 / 1.1) + 1.0 * (0.1 / 1.1)))  # format 1 (ratio 0.1)
    raw = float(np.float16(0.0 * 0.5 + 1.0 * 0.5))  # row 2: not normalised, format ratio 1.0
    assert scores == pytest.approx([normalized, raw, 1.0, 0.0, 0.0], abs=0)
    # the same as the scorer called with the row's settings and the image size by hand
    row0 = batch["reward_model"][0]
    direct = roll_detection.compute_score(
        responses[0], row0["ground_truth"], row0["verifier_parm"], row0["format_ratio"], 1.0, image_hw=(16, 24)
    )
    assert direct["score"] == scores[0] and direct["acc"] == pytest.approx(0.5 / 11)


def test_image_size_rules_and_refusals(monkeypatch):
    truth = "<answer>[{'bbox_2d': [0, 0, 1000, 500], 'label': 'cat'}]</answer>"
    parm = {"det_verifier_normalized": True, "det_reward_ratio": {"iou_max_label_first": 1.0}}
    seen = {"model_type": "qwen2_5_vl", "sizes": [[16, 24], [8, 8]]}
    scorers = DomainScorers({"det": "roll_detection"})
    row = {"reward_model": {"ground_truth": truth, "verifier_parm": parm}, "images_seen": seen}
    response = _answer([[0, 0, 12, 8]])
    # the first image's size normalises (Qwen2.5-VL); format_ratio absent from the row: ROLL's 0.1
    assert scorers("det", response, truth, row=row)["acc"] == pytest.approx(0.5 / 11)
    # Qwen2-VL / Qwen3-VL answer on 0..1000 already: ROLL does not normalise for them
    qwen3 = dict(row, images_seen={"model_type": "qwen3_vl", "sizes": [[16, 24]]})
    assert scorers("det", response, truth, row=qwen3)["acc"] == 0.0
    assert roll_detection.seen_image_hw({"model_type": "qwen2_5_vl", "sizes": []}) is None  # no image
    with pytest.raises(ValueError, match="det_verifier_normalized is set but no images_seen reached the scorer"):
        scorers("det", response, truth, row=dict(row, images_seen=dict(UNSEEN)))
    with pytest.raises(ValueError, match=r"reads the row's fields \['verifier_parm'"):
        scorers("det", response, truth)
    with pytest.raises(ValueError, match="has no verifier_parm"):
        scorers("det", response, truth, row=dict(row, reward_model={"ground_truth": truth}))
    monkeypatch.setenv("DET_IOU_THRESHOLD", "dynamic")
    with pytest.raises(ValueError, match=r"^data.domain_scorers.det=roll_detection: DET_IOU_THRESHOLD=dynamic sets"):
        DomainScorers({"det": "roll_detection"})
    monkeypatch.setenv("DET_IOU_THRESHOLD", "0.5")  # IoU 1/2 reaches 0.5: the label-first score is 1/2
    assert DomainScorers({"det": "roll_detection"})("det", response, truth, row=row)["acc"] == 0.5


def test_the_reward_loop_carries_a_rows_images_seen_to_the_scorer(tokenizer):
    """reward_model.use_reward_loop scores one trajectory at a time from its row's fields
    (hybrid/reward_loop.py batch_samples, reward/reward_loop.py _one_row): images_seen is one of them."""
    from hybrid.reward_loop import batch_samples
    from protocol.data_proto import DataProto
    from reward.manager import NaiveRewardManager
    from reward.reward_loop import _one_row

    truth = "<answer>[{'bbox_2d': [0, 0, 1000, 500], 'label': 'cat'}]</answer>"
    parm = {"det_verifier_normalized": True, "det_reward_ratio": {"iou_max_label_first": 1.0}}
    ids = tokenizer(_answer([[0, 0, 12, 8]]), add_special_tokens=False)["input_ids"]
    data = DataProto.from_single_dict(
        {
            "prompts": torch.tensor([[7]]),
            "responses": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids) + 1, dtype=torch.long),
            "domain": np.array(["det"], dtype=object),
            "reward_model": np.array([{"ground_truth": truth, "verifier_parm": parm}], dtype=object),
            "images_seen": np.array([{"model_type": "qwen2_5_vl", "sizes": [[16, 24]]}], dtype=object),
        }
    )
    [sample] = batch_samples(data, "domain")
    manager = NaiveRewardManager(tokenizer, 0, DomainScorers({"det": "roll_detection"}), reward_fn_key="domain")
    scored = manager(_one_row(sample, tokenizer.eos_token_id), return_dict=True)
    assert scored["reward_extra_info"]["acc"] == [pytest.approx(0.5 / 11)]  # normalised by 16 x 24
    assert float(scored["reward_tensor"].sum()) == float(np.float16((0.5 / 11) / 1.1 + 0.1 / 1.1))
