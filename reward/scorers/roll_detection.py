"""ROLL's object-detection reward (DetectionRewardWorker, DetectionVerifier) as a scorer.

The same numbers as ROLL's roll/pipeline/rlvr/rewards/detection_reward_worker.py, read from it:

- Boxes are read from the text inside the first `<answer>...</answer>` (lower-cased): a
  list `[{'bbox_2d': [x1, y1, x2, y2], 'label': name}, ...]` in JSON after `'` -> `"`,
  `\\` dropped and `[[`/`]]` folded; a list cut short is closed after its last whole `},`.
  An item counts with 4 numbers, x1 <= x2, y1 <= y2 and a string label (confidence is not
  read); a repeated box counts once. No box: accuracy 0.
- Format is 1 when the response has `\\n<answer>\\n` and exactly one `\\n</answer>` and its
  answer holds a box.
- Accuracy is the verifier's final score: a mix (`det_reward_ratio`) of two greedy IoU
  matchings and COCO's mAP, mAP@.5, mAP@.75 (every box scored 1.0), each times
  0.6 ** |#predicted - #true|. The IoU score of a matching at a threshold is
  mean IoU * (1 - c) + completeness * c, c = det_reward_ratio.iou_completeness, averaged
  over the 11 thresholds .5 .. .95, .99 (ROLL's DET_IOU_THRESHOLD=average, its default)
  or taken at one. ROLL's "max IoU first" matching pairs the last unmatched prediction
  with the last unmatched true box while the best remaining IoU reaches the threshold,
  scoring that best IoU when the pair's labels agree (its loop variables are overwritten
  by the search loops): reproduced as is.
- Qwen2.5-VL answers in pixels of the resized image; with det_verifier_normalized, ROLL
  maps predicted boxes to 0..1000 by that size (`image_hw`, from image_grid_thw * patch).
- The reward is accuracy * a / (a + f) + format * f / (a + f) (a, f: the row's
  accuracy_ratio, default 1.0, and format_ratio, default 0.1), in float16 as ROLL's.

In a run (data.domain_scorers.<domain>=roll_detection, the ROLL dialect's mapping of
DetectionRewardWorker) each row's `verifier_parm`, `format_ratio` and `accuracy_ratio` come
from its reward_model and `images_seen` from the dataset (ROW_FIELDS, reward/row_fields.py):
ROLL normalises by the first image's size only when the processor is Qwen2.5-VL's (its
processor class name starts with Qwen2_5), here when the policy's model_type is qwen2_5_vl.
DET_IOU_THRESHOLD=dynamic (the training step's share of the run) is refused at start
(`check_start`): the step does not reach the scorer.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

IOU_THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99)
RATIO_KEYS = ("iou_max_label_first", "iou_max_iou_first", "iou_completeness", "map", "map50", "map75")
# keys of a row's verifier_parm that ROLL's DetectionVerifier takes; the worker overwrites the
# step, image and training ones itself, image_path and verifier_style are not read
VERIFIER_KEYS = frozenset(
    ("is_training", "step", "total_steps", "image_path", "image_grid_thw", "verifier_style", "logger")
    + ("det_verifier_normalized", "det_reward_ratio")
)
# the row's fields a run passes (reward/row_fields.py): reward_model keys, and the images' sizes
ROW_FIELDS = ("verifier_parm", "format_ratio", "accuracy_ratio", "images_seen")
# ROLL normalises predicted boxes only for Qwen2.5-VL's processor (absolute pixel coordinates)
PIXEL_BOX_MODEL_TYPES = frozenset({"qwen2_5_vl"})
SIZE_PENALTY_BASE = 0.6
# COCO's bbox evaluation: IoU thresholds .5:.05:.95 and 101 recall points (np.linspace as COCO
# builds them: the values compared are those), areas in [0, 1e5 ** 2], at most 100 boxes
COCO_IOUS = np.linspace(0.5, 0.95, 10)
COCO_RECALLS = np.linspace(0.0, 1.0, 101)
COCO_MAX_AREA = 1e5**2
COCO_MAX_DETS = 100
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_text(text: str) -> str:
    """The stripped content of the first <answer>...</answer>, or ''."""
    match = _ANSWER.search(text)
    return match.group(1).strip() if match else ""


def _is_box(item) -> bool:
    if not (isinstance(item, dict) and "bbox_2d" in item and "label" in item):
        return False
    box = item["bbox_2d"]
    return (
        isinstance(box, list)
        and len(box) == 4
        and all(isinstance(v, (int, float)) for v in box)
        and box[0] <= box[2]
        and box[1] <= box[3]
        and isinstance(item["label"], str)
    )


def parse_boxes(text: str) -> list[dict] | None:
    """The boxes of an answer (see the module docstring), or None when there is none."""
    if not text or not text.strip():
        return None
    text = text.replace("[[", "[").replace("]]", "]")
    if not text.endswith("]"):
        text = text.rsplit("},", 1)[0] + "}]"
    try:
        items = json.loads(text.replace("'", '"').replace("\\", ""))
    except ValueError:  # json's errors, and recursion on deep nesting is not expected from a model
        return None
    if not isinstance(items, list):
        return None
    boxes, seen = [], set()
    for item in items:
        if _is_box(item) and tuple(item["bbox_2d"]) not in seen:
            seen.add(tuple(item["bbox_2d"]))
            boxes.append(item)
    return boxes or None


def iou(a, b) -> float:
    """IoU of two [x1, y1, x2, y2] boxes; 0 when they do not overlap."""
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    if x2 <= x1 or y2 <= y1:
        return 0.0
    inter = (x2 - x1) * (y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter) / union


def match_iou_first(pred: list[dict], true: list[dict], threshold: float) -> list[float]:
    """The scores of ROLL's "max IoU first" matching (see the module docstring)."""
    table = np.array([[iou(p["bbox_2d"], t["bbox_2d"]) for t in true] for p in pred])
    n_pred, n_true, scores = len(pred), len(true), []
    while n_pred and n_true:
        best = table[:n_pred, :n_true].max()
        if best < threshold:
            break
        n_pred, n_true = n_pred - 1, n_true - 1
        same = pred[n_pred]["label"].lower() == true[n_true]["label"].lower()
        scores.append(best if same else 0.0)
    return scores


def match_label_first(pred: list[dict], true: list[dict], threshold: float) -> list[float]:
    """Each true box in turn takes the unmatched prediction of its label with the highest IoU
    (the first on ties), when that IoU reaches the threshold."""
    taken, scores = set(), []
    for t in true:
        label = t["label"].lower()
        options = [(i, iou(p["bbox_2d"], t["bbox_2d"])) for i, p in enumerate(pred) if i not in taken]
        options = [(i, v) for i, v in options if pred[i]["label"].lower() == label]
        if not options:
            continue
        k = int(np.argmax([v for _, v in options]))
        if options[k][1] >= threshold:
            taken.add(options[k][0])
            scores.append(options[k][1])
    return scores


def iou_score(pred: list[dict], true: list[dict], matches: list[float], completeness_weight: float) -> float:
    """Mean matched IoU over the true boxes, mixed with completeness (1 - (miss + false alarm) / 2)."""
    mean = sum(matches) / len(true) if matches else 0.0
    miss = (len(true) - len(matches)) / len(true)
    false_alarm = (len(pred) - len(matches)) / len(pred) if pred else 0.0
    completeness = 1.0 - (miss + false_alarm) / 2.0
    return mean * (1.0 - completeness_weight) + completeness * completeness_weight


def _coco_ious(pred: list[list[float]], true: list[list[float]]) -> np.ndarray:
    """pycocotools' bbox IoU (pred x true) from [x, y, w, h] boxes, as COCOeval computes it."""
    d, g = np.asarray(pred, dtype=float).reshape(-1, 4), np.asarray(true, dtype=float).reshape(-1, 4)
    w = np.minimum(d[:, None, 0] + d[:, None, 2], g[None, :, 0] + g[None, :, 2]) - np.maximum(d[:, None, 0], g[:, 0])
    h = np.minimum(d[:, None, 1] + d[:, None, 3], g[None, :, 1] + g[None, :, 3]) - np.maximum(d[:, None, 1], g[:, 1])
    inter = w * h
    union = (d[:, 2] * d[:, 3])[:, None] + (g[:, 2] * g[:, 3])[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((w > 0) & (h > 0), inter / union, 0.0)


def _coco_precision(pred: list[list[float]], true: list[list[float]]) -> np.ndarray | None:
    """COCO's interpolated precision (IoU thresholds x recall points) of one category of one
    image, every prediction scored 1.0 (kept in order); None when every true box is ignored."""
    areas = [w * h for _, _, w, h in true]
    ignored = np.array([not 0 <= a <= COCO_MAX_AREA for a in areas], dtype=bool)
    order = np.argsort(ignored, kind="mergesort")  # ignored true boxes last
    true = [true[i] for i in order]
    ignored = ignored[order]
    pred = pred[:COCO_MAX_DETS]
    ious = _coco_ious(pred, true) if pred and true else np.zeros((len(pred), len(true)))
    n_true = int(np.count_nonzero(~ignored))
    if n_true == 0:
        return None
    pred_out = np.array([not 0 <= w * h <= COCO_MAX_AREA for _, _, w, h in pred], dtype=bool)
    precision = np.zeros((len(COCO_IOUS), len(COCO_RECALLS)))
    for t, threshold in enumerate(COCO_IOUS):
        taken = np.zeros(len(true), dtype=bool)
        hit, skip = np.zeros(len(pred), dtype=bool), np.zeros(len(pred), dtype=bool)
        for d in range(len(pred)):
            best, bar = -1, min(threshold, 1 - 1e-10)
            for g in range(len(true)):
                if taken[g]:
                    continue
                if best > -1 and not ignored[best] and ignored[g]:
                    break
                if ious[d, g] < bar:
                    continue
                bar, best = ious[d, g], g
            if best > -1:
                taken[best], hit[d], skip[d] = True, True, ignored[best]
        skip |= ~hit & pred_out
        tp = np.cumsum(hit & ~skip).astype(float)
        fp = np.cumsum(~hit & ~skip).astype(float)
        recall = tp / n_true
        prec = tp / (fp + tp + np.spacing(1))
        prec = np.maximum.accumulate(prec[::-1])[::-1]  # precision made non-increasing from the right
        where = np.searchsorted(recall, COCO_RECALLS, side="left")
        inside = where < len(prec)
        precision[t, inside] = prec[where[inside]]
    return precision


def coco_map(pred: list[dict], true: list[dict]) -> tuple[float, float, float]:
    """COCO's AP@[.5:.95], AP@.5 and AP@.75 (101-point interpolation, the mean over the true
    labels) of one image, predictions of labels no true box has left out."""
    labels = list(dict.fromkeys(t["label"] for t in true))

    def xywh(box):
        return [box[0], box[1], box[2] - box[0], box[3] - box[1]]

    if not any(p["label"] in labels for p in pred):
        return 0.0, 0.0, 0.0
    per_label = [
        _coco_precision(
            [xywh(p["bbox_2d"]) for p in pred if p["label"] == label],
            [xywh(t["bbox_2d"]) for t in true if t["label"] == label],
        )
        for label in labels
    ]
    # (thresholds, recalls, labels) with -1 for a label whose true boxes are all ignored, as COCO's
    table = np.stack([-np.ones((len(COCO_IOUS), len(COCO_RECALLS))) if p is None else p for p in per_label], axis=-1)

    def mean(values):
        kept = values[values > -1]
        return float(np.mean(kept)) if kept.size else -1.0

    return mean(table), mean(table[[0]]), mean(table[[5]])


def read_ratios(det_reward_ratio) -> dict[str, float]:
    """ROLL's det_reward_ratio with a missing or out-of-[0, 1] weight read as 0."""
    given = dict(det_reward_ratio or {})
    return {k: given[k] if k in given and 0 <= given[k] <= 1 else 0.0 for k in RATIO_KEYS}


def read_iou_threshold(value: str | None) -> float | str:
    """ROLL's DET_IOU_THRESHOLD: one of IOU_THRESHOLDS, 'average' (its default, also for an
    unknown value) or 'dynamic'."""
    if value in (None, "average", "dynamic"):
        return value or "average"
    try:
        number = float(value)
    except ValueError:
        return "average"
    return number if number in IOU_THRESHOLDS else "average"


def accuracy(
    response: str,
    ground_truth: str,
    det_reward_ratio=None,
    image_hw: tuple[int, int] | None = None,
    iou_threshold: float | str = "average",
    step_ratio: float | None = None,
) -> dict[str, float]:
    """ROLL's DetectionVerifier.verify_accuracy: the final score and its parts (0 without boxes).
    `image_hw` (height, width) normalises the predicted boxes to 0..1000 when given."""
    ratios = read_ratios(det_reward_ratio)
    pred = parse_boxes(answer_text(response.strip()).lower())
    true = parse_boxes(answer_text(str(ground_truth).strip()).lower())
    if pred is None or true is None:
        return {"final_score": 0.0}
    if image_hw is not None:
        height, width = image_hw
        for p in pred:
            x1, y1, x2, y2 = p["bbox_2d"]
            p["bbox_2d"] = [int(x1 / width * 1000.0), int(y1 / height * 1000.0)] + [
                int(x2 / width * 1000.0),
                int(y2 / height * 1000.0),
            ]
    penalty = SIZE_PENALTY_BASE ** abs(len(pred) - len(true))
    if iou_threshold == "dynamic":
        if step_ratio is None:
            raise ValueError("roll_detection: DET_IOU_THRESHOLD=dynamic needs the training step ratio (step_ratio)")
        iou_threshold = 0.85 if step_ratio <= 0.1 else 0.95 if step_ratio <= 0.25 else 0.99
    thresholds = IOU_THRESHOLDS if iou_threshold == "average" else (iou_threshold,)
    weight = ratios["iou_completeness"]
    by_iou = [iou_score(pred, true, match_iou_first(pred, true, t), weight) for t in thresholds]
    by_label = [iou_score(pred, true, match_label_first(pred, true, t), weight) for t in thresholds]
    parts = {
        "pure_iou_score_max_iou": sum(by_iou) / len(by_iou) if len(by_iou) > 1 else by_iou[0],
        "pure_iou_score_max_label": sum(by_label) / len(by_label) if len(by_label) > 1 else by_label[0],
    }
    parts["pure_map_score"], parts["pure_map50_score"], parts["pure_map75_score"] = coco_map(pred, true)
    weighted = {
        "iou_max_iou_first": parts["pure_iou_score_max_iou"] * penalty,
        "iou_max_label_first": parts["pure_iou_score_max_label"] * penalty,
        "map": parts["pure_map_score"] * penalty,
        "map50": parts["pure_map50_score"] * penalty,
        "map75": parts["pure_map75_score"] * penalty,
    }
    norm = sum(float(ratios[k]) for k in weighted)
    final = sum(value * float(ratios[k]) for k, value in weighted.items()) / norm if norm > 0 else 0.0
    return {"final_score": final, "size_penalty": penalty, **parts}


def format_score(response: str) -> float:
    """ROLL's DetectionVerifier.verify_format."""
    if not (response.count("\n<answer>\n") and response.count("\n</answer>") == 1):
        return 0.0
    return float(parse_boxes(answer_text(response.strip()).lower()) is not None)


def check_start(where: str) -> None:
    """Refuse, before a run starts, what the scorer cannot do in one (see the module docstring)."""
    if read_iou_threshold(os.environ.get("DET_IOU_THRESHOLD")) == "dynamic":
        raise ValueError(
            f"{where}: DET_IOU_THRESHOLD=dynamic sets ROLL's IoU threshold from the training step, which hybrid "
            "does not pass to the scorer; set it to average (ROLL's default) or one of "
            + ", ".join(map(str, IOU_THRESHOLDS))
        )


def seen_image_hw(images_seen: dict | None) -> tuple[int, int] | None:
    """The (height, width) ROLL normalises a row's boxes by: its first image's size as the model
    saw it, for a Qwen2.5-VL policy only; None when not given (ROLL without image_grid_thw: no
    normalisation), for other models or a row without images."""
    if images_seen is None:
        return None
    if images_seen["sizes"] is None:
        raise ValueError(
            "roll_detection: the row's verifier_parm.det_verifier_normalized is set but no images_seen reached the "
            "scorer (a vision-language policy's dataset writes it: hybrid/data.py)"
        )
    if images_seen["model_type"] not in PIXEL_BOX_MODEL_TYPES or not images_seen["sizes"]:
        return None
    height, width = images_seen["sizes"][0]
    return int(height), int(width)


def compute_score(
    solution_str: str,
    ground_truth: str,
    verifier_parm: dict | None = None,
    format_ratio: float = 0.1,
    accuracy_ratio: float = 1.0,
    image_hw: tuple[int, int] | None = None,
    iou_threshold: str | None = None,
    step_ratio: float | None = None,
    images_seen: dict | None = None,
) -> dict:
    """ROLL's DetectionRewardWorker reward of one response. `verifier_parm`, `format_ratio` and
    `accuracy_ratio` are the row's reward_model fields; `image_hw` the (height, width) of the
    first image as the model saw it, given only for a Qwen2.5-VL processor (ROLL normalises
    only there), or `images_seen` (the row's, reward/row_fields.py) to take it from; `iou_threshold`
    defaults to the DET_IOU_THRESHOLD environment variable, as ROLL's."""
    if verifier_parm is None:
        raise ValueError(
            "roll_detection: the row's reward_model has no verifier_parm (ROLL's detection worker reads it)"
        )
    unknown = sorted(set(verifier_parm) - VERIFIER_KEYS)
    if unknown:
        raise ValueError(f"roll_detection: verifier_parm has keys ROLL's DetectionVerifier does not take: {unknown}")
    if accuracy_ratio + format_ratio == 0:
        raise ValueError("roll_detection: the row's accuracy_ratio + format_ratio is 0; ROLL divides by it")
    normalized = bool(verifier_parm.get("det_verifier_normalized", False))
    if images_seen is not None and image_hw is not None:
        raise ValueError("roll_detection: give image_hw or images_seen, not both")
    if normalized and image_hw is None:
        image_hw = seen_image_hw(images_seen)
    threshold = read_iou_threshold(os.environ.get("DET_IOU_THRESHOLD") if iou_threshold is None else iou_threshold)
    parts = accuracy(
        solution_str,
        ground_truth,
        det_reward_ratio=verifier_parm.get("det_reward_ratio"),
        image_hw=image_hw if normalized else None,
        iou_threshold=threshold,
        step_ratio=step_ratio,
    )
    fmt = format_score(solution_str)
    total = accuracy_ratio + format_ratio
    reward = parts["final_score"] * (accuracy_ratio / total) + fmt * (format_ratio / total)
    return {
        "score": float(np.float16(reward)),
        "acc": float(parts["final_score"]),
        "format": fmt,
        **{k: float(v) for k, v in parts.items() if k != "final_score"},
    }


__all__ = [
    "IOU_THRESHOLDS",
    "accuracy",
    "ROW_FIELDS",
    "answer_text",
    "check_start",
    "coco_map",
    "compute_score",
    "format_score",
    "iou",
    "match_iou_first",
    "match_label_first",
    "parse_boxes",
    "read_iou_threshold",
    "seen_image_hw",
]
