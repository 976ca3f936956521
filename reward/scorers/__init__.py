"""Rule-based scorers and `default_compute_score`, which picks one by `data_source`.

The data_source names are verl's, so parquet files made by verl's preprocess scripts
score the same way here. Keyword arguments (the reward manager passes on the keys of
`reward_model.reward_kwargs` it does not use itself) go to each scorer that takes them,
so `method=flexible` or `lenient=true` for gsm8k does not break the math rows of a mixed
data set; a key that no scorer takes is an error.

roll_crossthinkqa, roll_code and roll_ifeval reproduce ROLL's rule reward workers
(CrossThinkQARuleRewardWorker, CodeSandboxRewardWorker, GeneralRuleRewardWorker), and
roll_detection its DetectionRewardWorker; ROLL picks them by each domain's `worker_cls` and
rows by their `tag`, so they are not registered here by data_source.
"""

from __future__ import annotations

import inspect

from . import arithmetic, gsm8k, math

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "math", "HuggingFaceH4/MATH-500")
ARITHMETIC_SOURCES = ("arithmetic",)

_SCORERS = {
    **{name: gsm8k.compute_score for name in GSM8K_SOURCES},
    **{name: math.compute_score for name in MATH_SOURCES},
    **{name: arithmetic.compute_score for name in ARITHMETIC_SOURCES},
}


def _keyword_options(scorer) -> frozenset[str]:
    """The keyword arguments a scorer takes besides the response and the ground truth."""
    params = list(inspect.signature(scorer).parameters.values())[2:]
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


_OPTIONS = {scorer: _keyword_options(scorer) for scorer in set(_SCORERS.values())}


def known_data_sources() -> list[str]:
    return list(_SCORERS)


def check_score_kwargs(kwargs) -> None:
    """Raise TypeError naming every key of `kwargs` that no default scorer takes."""
    unknown = sorted(set(kwargs) - set().union(*_OPTIONS.values()))
    if unknown:
        takes = "; ".join(
            f"{scorer.__module__.rsplit('.', 1)[-1]}: {', '.join(sorted(options)) or 'none'}"
            for scorer, options in sorted(_OPTIONS.items(), key=lambda item: item[0].__module__)
        )
        raise TypeError(
            f"reward_model.reward_kwargs: no default scorer takes {', '.join(map(repr, unknown))}; "
            f"the options they take: {takes}. Remove the key, or score with a custom_reward_function that takes it."
        )


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Score one response with the scorer registered for `data_source`.

    Each key of `kwargs` goes to the scorer when it takes it (e.g. `method="flexible"`
    or `lenient=True` for gsm8k) and is left out for scorers that do not; a key no
    scorer takes raises TypeError. `extra_info` is accepted for the common
    reward-function signature and not used by these scorers.
    """
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise ValueError(
            f"no default scorer for data_source {data_source!r}; known data sources: "
            f"{', '.join(_SCORERS)}. Set custom_reward_function.path (and .name) to score others."
        )
    check_score_kwargs(kwargs)
    options = _OPTIONS[scorer]
    return scorer(solution_str, ground_truth, **{k: v for k, v in kwargs.items() if k in options})


__all__ = ["arithmetic", "check_score_kwargs", "default_compute_score", "gsm8k", "known_data_sources", "math"]
