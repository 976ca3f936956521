"""Rule-based scorers and `default_compute_score`, which picks one by `data_source`.

The data_source names are verl's, so parquet files made by verl's preprocess scripts
score the same way here.
"""

from __future__ import annotations

from . import arithmetic, gsm8k, math

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "math", "HuggingFaceH4/MATH-500")
ARITHMETIC_SOURCES = ("arithmetic",)

_SCORERS = {
    **{name: gsm8k.compute_score for name in GSM8K_SOURCES},
    **{name: math.compute_score for name in MATH_SOURCES},
    **{name: arithmetic.compute_score for name in ARITHMETIC_SOURCES},
}


def known_data_sources() -> list[str]:
    return list(_SCORERS)


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Score one response with the scorer registered for `data_source`.

    `kwargs` go to that scorer (e.g. `method="flexible"` for gsm8k); `extra_info` is
    accepted for the common reward-function signature and not used by these scorers.
    """
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise ValueError(
            f"no default scorer for data_source {data_source!r}; known data sources: "
            f"{', '.join(_SCORERS)}. Set custom_reward_function.path (and .name) to score others."
        )
    return scorer(solution_str, ground_truth, **kwargs)


__all__ = ["arithmetic", "default_compute_score", "gsm8k", "known_data_sources", "math"]
