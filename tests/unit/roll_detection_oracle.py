"""ROLL's detection verifier, as the oracle of tests/unit/test_roll_detection.py: the pure
functions and classes of ROLL's detection_reward_worker.py, pulled by name with ast from the
peer mirror at a pinned commit (none of ROLL's worker, Ray or model code), or, where the
mirror is absent (CI), from the same extract kept in tests/data/ (its header names the source
path and commit; `extract()` rebuilds it, and the test checks the two agree when it can).

ROLL imports pycocotools' mask module for one call, maskUtils.iou on [x, y, w, h] boxes; this
environment has no pycocotools, so `bbox_iou` stands in for it, written from pycocotools'
maskApi.c bbIou (the same double arithmetic, loop by loop).
"""

from __future__ import annotations

import ast
import copy
import datetime
import itertools
import json
import logging
import os
import re
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional, Union

import numpy as np

MIRROR = Path("/work/.mirror/alibaba+ROLL/repo")
COMMIT = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
SOURCE = "roll/pipeline/rlvr/rewards/detection_reward_worker.py"
EXTRACT = Path(__file__).resolve().parents[1] / "data" / "roll_detection_oracle.py.txt"
NAMES = (
    "_isArrayLike",
    "COCO",
    "COCOeval",
    "Params",
    "compute_iou",
    "greedy_match_by_iou_max_iou_first",
    "greedy_match_by_iou_max_label_first",
    "extract_bbox",
    "convert_bbox_to_coco_format",
    "extract_answer_content",
    "normalize_bbox_by_real_size",
    "DetectionVerifier",
)
HEADER = (
    f"# Extracted from alibaba/ROLL {SOURCE} at commit {COMMIT} (Apache License 2.0),\n"
    "# by tests/unit/roll_detection_oracle.py extract(): the oracle of tests/unit/test_roll_detection.py\n"
)


def mirror_source() -> str | None:
    """ROLL's file at the pinned commit, or None without the mirror."""
    if not MIRROR.exists():
        return None
    out = subprocess.run(
        ["git", "-C", str(MIRROR), "show", f"{COMMIT}:{SOURCE}"], capture_output=True, text=True, check=False
    )
    return out.stdout if out.returncode == 0 else None


def extract(source: str) -> str:
    """The definitions in NAMES, verbatim, in file order, under HEADER."""
    tree = ast.parse(source)
    found = {
        node.name: ast.get_source_segment(source, node)
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in NAMES
    }
    missing = sorted(set(NAMES) - set(found))
    if missing:
        raise ValueError(f"{SOURCE} at {COMMIT} has no {missing}")
    return HEADER + "\n\n".join(found[name] for name in found) + "\n"


def bbox_iou(dt, gt, iscrowd):
    """pycocotools.mask.iou for [x, y, w, h] boxes (maskApi.c bbIou): [] when either side is empty."""
    if len(dt) == 0 or len(gt) == 0:
        return []
    dt, gt = np.asarray(dt, dtype=np.double), np.asarray(gt, dtype=np.double)
    out = np.zeros((len(dt), len(gt)))
    for g, G in enumerate(gt):
        ga = G[2] * G[3]
        for d, D in enumerate(dt):
            da = D[2] * D[3]
            w = min(D[2] + D[0], G[2] + G[0]) - max(D[0], G[0])
            if w <= 0:
                continue
            h = min(D[3] + D[1], G[3] + G[1]) - max(D[1], G[1])
            if h <= 0:
                continue
            i = w * h
            u = da if iscrowd[g] else da + ga - i
            out[d, g] = i / u
    return out


class _MaskUtils:
    iou = staticmethod(bbox_iou)


def load() -> dict:
    """The oracle's namespace: ROLL's definitions with the module-level names they read."""
    source = mirror_source()
    code = extract(source) if source is not None else EXTRACT.read_text()
    quiet = logging.getLogger("roll_detection_oracle")
    namespace = {
        "copy": copy,
        "datetime": datetime,
        "itertools": itertools,
        "json": json,
        "logging": logging,
        "os": os,
        "re": re,
        "time": time,
        "defaultdict": defaultdict,
        "Dict": dict,
        "List": list,
        "Optional": Optional,
        "Tuple": tuple,
        "Union": Union,
        "np": np,
        "maskUtils": _MaskUtils,
        "logger": quiet,
        "get_logger": lambda: quiet,
    }
    exec(compile(code, f"ROLL:{SOURCE}@{COMMIT[:12]}", "exec"), namespace)
    return namespace
