"""Per-domain scoring (`data.domain_scorers`): each row scored by the scorer its domain names.

ROLL's multi-domain RLVR runs one reward worker per domain, each scoring only its domain's
rows. Here a domain names a scorer module of reward/scorers (`math`, `gsm8k`, ...: any module
there with `compute_score(solution_str, ground_truth, ...)`), and `DomainScorers` is the
reward managers' compute_score: the value of the row's `data.reward_fn_key` column (set to
`domain` with domains: hybrid/domains.py writes each row's domain there) picks the scorer.
`data.domain_scorer_kwargs.<domain>` holds that domain's own keyword arguments (a ROLL
worker's options), the manager's passed-on reward_kwargs go to every scorer that takes them.
A scorer module's `ROW_FIELDS` names the row's own fields it reads (ROLL's per-row reward
settings, the image size the model saw: reward/row_fields.py); the reward managers pass each
row's fields (`row=`) when `reads_rows`, and its `check_start()`, when it has one, runs here,
before any model loads.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .row_fields import scorer_row_kwargs


def load_scorer(name: str, where: str) -> Callable:
    """`compute_score` of the module reward/scorers/<name>.py."""
    if not str(name).isidentifier():
        raise ValueError(f"{where}={name!r}: a scorer is named by its module in reward/scorers (math, gsm8k, ...)")
    try:
        module = importlib.import_module(f"reward.scorers.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"reward.scorers.{name}":
            raise
        raise ValueError(f"{where}={name!r}: no module reward/scorers/{name}.py") from err
    fn = getattr(module, "compute_score", None)
    if not callable(fn):
        raise ValueError(f"{where}={name!r}: reward/scorers/{name}.py has no compute_score function")
    return fn


def row_field_names(fn: Callable) -> tuple[str, ...]:
    """The row fields the scorer's module lists in ROW_FIELDS (none for most scorers)."""
    return tuple(getattr(inspect.getmodule(fn), "ROW_FIELDS", ()))


def keyword_options(fn: Callable) -> frozenset[str]:
    """The keyword arguments a scorer takes besides the response and the ground truth."""
    params = list(inspect.signature(fn).parameters.values())[2:]
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


class DomainScorers:
    """compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs) where
    `data_source` is the row's domain. Pickles as its names (the prime manager's pool)."""

    def __init__(self, scorers: Mapping[str, str], scorer_kwargs: Mapping[str, Mapping[str, Any]] | None = None):
        self.names = {str(d): str(n) for d, n in scorers.items()}
        self.kwargs = {str(d): dict(v) for d, v in (scorer_kwargs or {}).items()}
        unknown = sorted(set(self.kwargs) - set(self.names))
        if unknown:
            raise ValueError(f"data.domain_scorer_kwargs: domain(s) {', '.join(unknown)} have no data.domain_scorers")
        self.fns = {d: load_scorer(n, f"data.domain_scorers.{d}") for d, n in self.names.items()}
        self.options = {d: keyword_options(fn) for d, fn in self.fns.items()}
        self.row_fields = {d: row_field_names(fn) for d, fn in self.fns.items()}
        self.reads_rows = any(self.row_fields.values())
        for domain, fn in self.fns.items():
            check = getattr(inspect.getmodule(fn), "check_start", None)
            if check is not None:
                check(f"data.domain_scorers.{domain}={self.names[domain]}")
        for domain, kwargs in self.kwargs.items():
            extra = sorted(set(kwargs) - self.options[domain])
            if extra:
                raise ValueError(
                    f"data.domain_scorer_kwargs.{domain}: reward/scorers/{self.names[domain]}.py's compute_score "
                    f"takes no {', '.join(extra)} (it takes: {', '.join(sorted(self.options[domain])) or 'none'})"
                )

    def check_kwargs(self, kwargs: Mapping[str, Any]) -> None:
        """A passed-on reward_kwargs key must be taken by some domain's scorer."""
        unknown = sorted(set(kwargs) - set().union(*self.options.values()))
        if unknown:
            raise TypeError(
                f"reward_model.reward_kwargs: no domain scorer takes {', '.join(map(repr, unknown))}; remove it, or "
                f"give a domain's own options in data.domain_scorer_kwargs.<domain>"
            )

    def __call__(self, data_source, solution_str, ground_truth, extra_info=None, row=None, **kwargs):
        fn = self.fns.get(data_source)
        if fn is None:
            raise ValueError(
                f"no data.domain_scorers entry for domain {data_source!r}; domains with a scorer: "
                f"{', '.join(self.names)}"
            )
        options = self.options[data_source]
        passed = {k: v for k, v in kwargs.items() if k in options}
        if "extra_info" in options:
            passed["extra_info"] = extra_info
        passed.update(self.kwargs.get(data_source, {}))
        if self.row_fields[data_source]:
            where = f"data.domain_scorers.{data_source}={self.names[data_source]}"
            passed.update(scorer_row_kwargs(self.row_fields[data_source], row, where))
        return fn(solution_str, ground_truth, **passed)

    def __reduce__(self):
        return (DomainScorers, (self.names, self.kwargs))

    def __repr__(self) -> str:
        return f"DomainScorers({self.names})"


__all__ = ["DomainScorers", "keyword_options", "load_scorer", "row_field_names"]
