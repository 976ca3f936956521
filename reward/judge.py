"""A generative reward model's prompt and verdict: `render` fills the judge's prompt template
with a trajectory's prompt, response and reference answer; `parse_verdict` reads the score
back from the text the judge wrote.

The rules for a verdict (reward_model.judge):
- the score is the first group of `verdict_pattern` (a regular expression): a number, or with
  `verdict_labels` a word looked up there (any case: {"yes": 1, "no": 0}); every match in the
  verdict is read, and when they disagree the verdict is ambiguous (a judge that writes
  "Score: 0 ... Score: 1" has not decided, and taking either would reward the trick);
- a value that is not a finite number, or lies outside [min_score, max_score], is invalid;
- an unparsable, ambiguous or invalid verdict scores `invalid_score` and says why
  (`status`), so the trainer counts it instead of stopping the run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# The placeholders a template may use; any other brace text is left as it is, so templates
# can show JSON or LaTeX without escaping.
PLACEHOLDERS = ("prompt", "response", "ground_truth")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")

OK, UNPARSABLE, AMBIGUOUS, OUT_OF_RANGE, TIMEOUT, ERROR = (
    "ok",
    "unparsable",
    "ambiguous",
    "out_of_range",
    "timeout",
    "error",
)
STATUSES = (OK, UNPARSABLE, AMBIGUOUS, OUT_OF_RANGE, TIMEOUT, ERROR)


@dataclass(frozen=True)
class Verdict:
    score: float
    status: str  # one of STATUSES
    text: str = ""


def render(template: str, prompt: str, response: str, ground_truth) -> str:
    """The template with {prompt}, {response} and {ground_truth} filled in, in one pass (a
    response that itself contains "{ground_truth}" is not expanded again)."""
    values = {"prompt": prompt, "response": response, "ground_truth": "" if ground_truth is None else str(ground_truth)}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def compile_pattern(pattern: str) -> re.Pattern:
    """`verdict_pattern` compiled; a pattern without a group is refused (the score is group 1)."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(
            f"reward_model.judge.verdict_pattern={pattern!r} is not a regular expression: {error}"
        ) from None
    if compiled.groups < 1:
        raise ValueError(
            f"reward_model.judge.verdict_pattern={pattern!r} has no group: put the score in parentheses, "
            r"e.g. 'Score:\s*(\d+)'"
        )
    return compiled


def parse_verdict(
    text: str,
    pattern: re.Pattern,
    min_score: float,
    max_score: float,
    invalid_score: float,
    labels: dict[str, float] | None = None,
) -> Verdict:
    """The score a verdict gives, or `invalid_score` with the reason it is not usable."""
    lookup = {str(k).lower(): float(v) for k, v in labels.items()} if labels else None
    values = []
    for match in pattern.finditer(text):
        found = match.group(1)
        if lookup is not None:
            if found is None or found.lower() not in lookup:
                return Verdict(invalid_score, UNPARSABLE, text)
            values.append(lookup[found.lower()])
            continue
        try:
            values.append(float(found))
        except (TypeError, ValueError):
            return Verdict(invalid_score, UNPARSABLE, text)
    if not values:
        return Verdict(invalid_score, UNPARSABLE, text)
    if len(set(values)) > 1:
        return Verdict(invalid_score, AMBIGUOUS, text)
    value = values[0]
    if not math.isfinite(value) or not min_score <= value <= max_score:
        return Verdict(invalid_score, OUT_OF_RANGE, text)
    return Verdict(value, OK, text)
