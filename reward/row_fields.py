"""Per-row fields a domain scorer reads besides verl's four (data_source, solution_str,
ground_truth, extra_info), as ROLL's reward workers read them from each row.

ROLL's reward workers see the whole row: DetectionRewardWorker takes `verifier_parm`,
`format_ratio` and `accuracy_ratio` from the row's `reward_model` dict and the size of the
image the model saw from its `multi_modal_inputs` (image_grid_thw x the processor's patch
size). A scorer module of reward/scorers asks for such fields by listing them in its
`ROW_FIELDS`; `DomainScorers` (reward/domain_scorers.py) then passes each one by keyword:

- `images_seen`: the row's column of that name, written by the dataset for a vision-language
  policy (hybrid/data.py): `{"model_type": ..., "sizes": [[height, width], ...]}`, each image's
  size after the processor's resize (`images_seen` below); `UNSEEN` when the row has no such
  column (a text policy, or a path that does not carry the column), for the scorer to refuse.
- any other name: the row's `reward_model[name]`, not passed when the row's reward_model lacks
  it (the scorer's default applies, as ROLL's `reward_model.get(name, default)`).

Only scorers that list fields get them, so verl's scorers and user functions keep verl's call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

IMAGES_SEEN = "images_seen"  # the dataset's non-tensor column
UNSEEN = {"model_type": None, "sizes": None}  # a row without that column


def images_seen(model_type: str, patch_size: int, image_grid_thw) -> dict:
    """What a vision-language policy saw of a row's images: its model type and each image's
    (height, width) in pixels after the processor's resize, image_grid_thw's patches times the
    patch size (ROLL's DetectionRewardWorker computes the same: `h * patch_size, w * patch_size`)."""
    grid = [] if image_grid_thw is None else [[int(v) for v in row] for row in image_grid_thw.tolist()]
    return {"model_type": str(model_type), "sizes": [[h * int(patch_size), w * int(patch_size)] for _, h, w in grid]}


def row_fields(non_tensor: Mapping[str, Any], index: int) -> dict:
    """The fields of row `index` a scorer may ask for: its reward_model dict and images_seen."""
    seen = non_tensor.get(IMAGES_SEEN)
    seen = dict(UNSEEN) if seen is None else seen[index]
    return {"reward_model": non_tensor["reward_model"][index], IMAGES_SEEN: seen}


def scorer_row_kwargs(wanted: Sequence[str], fields: Mapping[str, Any] | None, where: str) -> dict:
    """The keyword arguments `wanted` (a scorer's ROW_FIELDS) from one row's `fields`."""
    if fields is None:
        raise ValueError(f"{where} reads the row's fields {list(wanted)}, but the reward manager passed none")
    reward_model = fields["reward_model"]
    out = {}
    for name in wanted:
        if name == IMAGES_SEEN:
            out[name] = fields[IMAGES_SEEN]
        elif name in reward_model:
            out[name] = reward_model[name]
    return out


__all__ = ["IMAGES_SEEN", "UNSEEN", "images_seen", "row_fields", "scorer_row_kwargs"]
