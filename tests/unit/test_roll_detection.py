"""ROLL's detection reward (reward/scorers/roll_detection.py) against ROLL's own functions
(tests/unit/roll_detection_oracle.py: DetectionVerifier, COCOeval, the matchings, extract_bbox,
run as ROLL wrote them) on random answers in ROLL's format, well and badly formed, and the
worker's mix of accuracy and format (compute_rewards) written out by hand."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest

from reward.scorers import roll_detection
from tests.unit import roll_detection_oracle

ROLL = roll_detection_oracle.load()
LABELS = ("cat", "Dog", "car", "person")
ENV_THRESHOLDS = (None, "average", "0.5", "0.75", "0.99", "0.42", "abc", "dynamic")


def _box(rng: random.Random, near=None) -> list:
    if near is not None and rng.random() < 0.7:
        box = [v + rng.randint(-4, 4) for v in near]
        return [min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])]
    x, y = rng.randint(0, 60), rng.randint(0, 60)
    box = [x, y, x + rng.randint(0, 30), y + rng.randint(0, 30)]
    if rng.random() < 0.1:
        box = [v + 0.5 * rng.randint(0, 3) for v in box]  # floats
    if rng.random() < 0.03:
        box = [v * 4000 for v in box]  # area above COCO's 1e10 range: ignored
    return box


def _item(rng: random.Random, box, label) -> dict:
    item = {"bbox_2d": box, "label": label}
    if rng.random() < 0.5:
        item["confidence"] = round(rng.random(), 2)
    roll = rng.random()
    if roll < 0.04:
        item["bbox_2d"] = box[:3]  # three numbers
    elif roll < 0.08:
        item["bbox_2d"] = [box[2], box[1], box[0], box[3]]  # x1 > x2 when the box has width
    elif roll < 0.1:
        item["label"] = 3
    elif roll < 0.12:
        del item["label"]
    return item


def _text(rng: random.Random, items: list) -> str:
    text = json.dumps(items)
    roll = rng.random()
    if roll < 0.3:
        text = text.replace('"', "'")
    elif roll < 0.35:
        text = "[" + text + "]"  # [[...]]
    elif roll < 0.45:
        text = text[: rng.randint(0, len(text))]  # cut short
    elif roll < 0.5:
        text = text.replace("{", "{\\", 1)
    elif roll < 0.53:
        text = "no boxes here"
    elif roll < 0.56:
        text = json.dumps({"bbox_2d": [1, 2, 3, 4], "label": "cat"})
    return text


def _wrap(rng: random.Random, text: str) -> str:
    roll = rng.random()
    if roll < 0.55:
        return f"<think>look</think>\n<answer>\n{text}\n</answer>"
    if roll < 0.7:
        return f"<answer>{text}</answer>"
    if roll < 0.8:
        return f"\n<answer>\n{text}\n</answer>\n<answer>\n[]\n</answer>"
    if roll < 0.9:
        return f"  \n<answer>\n{text}\n</answer>\n</answer>"
    return text


def _case(rng: random.Random) -> dict:
    truth = [(_box(rng), rng.choice(LABELS)) for _ in range(rng.randint(1, 5))]
    preds = []
    for _ in range(rng.randint(0, 7)):
        near, label = rng.choice(truth)
        preds.append((_box(rng, near), label.upper() if rng.random() < 0.2 else rng.choice((label, *LABELS))))
    if preds and rng.random() < 0.15:
        preds.append(preds[0])  # a repeated box
    truth_items = [{"bbox_2d": b, "label": lab} for b, lab in truth]
    ratio = {k: rng.choice((0.0, 0.3, 1.0, rng.random())) for k in roll_detection.RATIO_KEYS if rng.random() < 0.85}
    if ratio and rng.random() < 0.1:
        ratio[rng.choice(list(ratio))] = rng.choice((1.5, -0.2))
    return {
        "response": _wrap(rng, _text(rng, [_item(rng, b, lab) for b, lab in preds])),
        "truth": "<answer>" + (json.dumps(truth_items) if rng.random() < 0.95 else "[]") + "</answer>",
        "ratio": ratio,
        "normalized": rng.random() < 0.3,
        "grid": [(1, 28 * rng.randint(2, 40), 28 * rng.randint(2, 40))] if rng.random() < 0.8 else None,
        "format_ratio": rng.choice((0.1, 0.0, 0.5)),
        "accuracy_ratio": rng.choice((1.0, 0.7)),
        "step": rng.randint(0, 100),
    }


def _roll_reward(case: dict, env: str | None, monkeypatch) -> tuple[dict, float, float]:
    """ROLL's verifier outputs and the worker's float16 reward (compute_rewards' formula)."""
    if env is None:
        monkeypatch.delenv("DET_IOU_THRESHOLD", raising=False)
    else:
        monkeypatch.setenv("DET_IOU_THRESHOLD", env)
    verifier = ROLL["DetectionVerifier"](
        is_training=True,
        step=case["step"],
        total_steps=100,
        image_grid_thw=case["grid"],
        det_verifier_normalized=case["normalized"],
        det_reward_ratio=copy.deepcopy(case["ratio"]),
    )
    fmt = verifier.verify_format(case["response"])
    parts = verifier.verify_accuracy(case["response"], case["truth"])
    a, f = case["accuracy_ratio"], case["format_ratio"]
    reward = parts["final_score"] * (a / (a + f)) + fmt * (f / (a + f))
    return parts, fmt, float(np.float16(reward))


def test_random_cases_match_roll(monkeypatch):
    rng = random.Random(20261126)
    checked_parts = 0
    for i in range(300):
        case = _case(rng)
        env = ENV_THRESHOLDS[i % len(ENV_THRESHOLDS)]
        parts, fmt, reward = _roll_reward(case, env, monkeypatch)
        ours = roll_detection.compute_score(
            case["response"],
            case["truth"],
            verifier_parm={"det_verifier_normalized": case["normalized"], "det_reward_ratio": case["ratio"]},
            format_ratio=case["format_ratio"],
            accuracy_ratio=case["accuracy_ratio"],
            image_hw=None if case["grid"] is None else case["grid"][0][1:],
            step_ratio=case["step"] / 100,
        )
        where = (i, case)
        assert ours["score"] == reward, where
        assert ours["format"] == fmt, where
        assert ours["acc"] == pytest.approx(parts["final_score"], abs=1e-12), where
        if "pure_map_score" in ours:
            checked_parts += 1
            for key in ("size_penalty", "pure_iou_score_max_iou", "pure_iou_score_max_label") + tuple(
                f"pure_map{s}_score" for s in ("", "50", "75")
            ):
                assert ours[key] == pytest.approx(parts[key], abs=1e-12), (key, where)
        else:
            assert parts["final_score"] == 0.0 and parts["pure_map_score"] == 0.0, where
    assert checked_parts > 100  # most cases reach the scoring, not only the early returns


def test_parsing_and_matching_match_roll():
    rng = random.Random(7)
    for _ in range(300):
        case = _case(rng)
        text = roll_detection.answer_text(case["response"].strip()).lower()
        assert text == ROLL["extract_answer_content"](case["response"].strip()).lower()
        ours, theirs = roll_detection.parse_boxes(text), ROLL["extract_bbox"](text)
        assert ours == theirs, text
        truth = roll_detection.parse_boxes(roll_detection.answer_text(case["truth"]).lower())
        if not ours or not truth:
            continue
        for threshold in (0.0, 0.5, 0.7, 0.99):
            for ours_fn, roll_fn in (
                (roll_detection.match_iou_first, "greedy_match_by_iou_max_iou_first"),
                (roll_detection.match_label_first, "greedy_match_by_iou_max_label_first"),
            ):
                expected = [m["iou"] for m in ROLL[roll_fn](ours, truth, threshold)]
                assert ours_fn(ours, truth, threshold) == expected, (roll_fn, ours, truth, threshold)


def test_coco_map_beyond_100_boxes_and_ignored_areas():
    # COCO keeps the first 100 boxes; a true box over 1e10 in area is ignored (no category left: -1)
    truth = [{"bbox_2d": [0, 0, 10, 10], "label": "a"}, {"bbox_2d": [20, 20, 30, 30], "label": "a"}]
    pred = [{"bbox_2d": [40 + i, 40, 50 + i, 50], "label": "a"} for i in range(100)] + truth
    verifier = ROLL["DetectionVerifier"](is_training=True, step=0, total_steps=1, det_reward_ratio={})
    assert roll_detection.coco_map(pred, truth) == tuple(verifier.pack_for_map_score(pred, truth).values())
    assert roll_detection.coco_map(truth[::-1], truth) == (1.0, 1.0, 1.0)
    huge = [{"bbox_2d": [0, 0, 200000, 200000], "label": "a"}]
    assert roll_detection.coco_map(huge, huge) == tuple(verifier.pack_for_map_score(huge, huge).values())
    assert roll_detection.coco_map(huge, huge) == (-1.0, -1.0, -1.0)


def test_hand_computed_reward():
    # one true box, one prediction of the same label: IoU (8 x 10) / (10 x 10 + 10 x 10 - 80) = 2/3,
    # under 0.5 .. 0.99 only 0.5 .. 0.65 match (4 of 11); with only iou_max_label_first weighted and no
    # completeness weight: accuracy 2/3 * 4/11; format 1; reward (8/33 + 0.1) / 1.1 in float16
    response = "\n<answer>\n[{'bbox_2d': [2, 0, 12, 10], 'label': 'Cat'}]\n</answer>"
    truth = "<answer>[{'bbox_2d': [0, 0, 10, 10], 'label': 'cat'}]</answer>"
    out = roll_detection.compute_score(
        response, truth, verifier_parm={"det_reward_ratio": {"iou_max_label_first": 1.0}}, iou_threshold="average"
    )
    assert out["acc"] == pytest.approx(8 / 33)
    assert out["format"] == 1.0
    assert out["score"] == float(np.float16((8 / 33) / 1.1 + 0.1 / 1.1))


def test_refusals():
    with pytest.raises(ValueError, match="has no verifier_parm"):
        roll_detection.compute_score("<answer>[]</answer>", "<answer>[]</answer>")
    with pytest.raises(ValueError, match=r"does not take: \['det_ratio'\]"):
        roll_detection.compute_score("x", "y", verifier_parm={"det_ratio": {}})
    with pytest.raises(ValueError, match="accuracy_ratio \\+ format_ratio is 0"):
        roll_detection.compute_score("x", "y", verifier_parm={}, accuracy_ratio=0.0, format_ratio=0.0)
    response = "\n<answer>\n[{'bbox_2d': [0, 0, 10, 10], 'label': 'cat'}]\n</answer>"
    with pytest.raises(ValueError, match="DET_IOU_THRESHOLD=dynamic needs the training step ratio"):
        roll_detection.compute_score(response, response, verifier_parm={}, iou_threshold="dynamic")


def test_committed_extract_is_rolls_code():
    source = roll_detection_oracle.mirror_source()
    if source is None:
        pytest.skip("no ROLL mirror here: the oracle runs from the committed extract")
    assert roll_detection_oracle.EXTRACT.read_text() == roll_detection_oracle.extract(source)
