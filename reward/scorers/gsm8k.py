"""GSM8K scoring: compare the final number of a response with the reference answer.

`strict` reads only the `#### <number>` form the GSM8K prompt asks for; `flexible` takes
the last number anywhere in the text. Commas, `$` and a trailing period are stripped
before comparing, and numerically equal forms (`72`, `72.0`) match.
"""

from __future__ import annotations

import re

# Regexes over very long responses are slow; the answer sits at the end anyway.
_CLIP_CHARS = 300
_STRICT = re.compile(r"####\s*\$?\s*(-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"-?\$?[0-9][0-9.,]*|-?\.[0-9]+")


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The final answer in `solution_str` as a string without commas, or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
    else:
        found = _FLEXIBLE.findall(text)
    for candidate in reversed(found):
        cleaned = _clean(candidate)
        if cleaned not in ("", "-", "."):
            return cleaned
    return None


def _same_number(answer: str, ground_truth: str) -> bool:
    truth = _clean(str(ground_truth).strip())
    if answer == truth:
        return True
    try:
        return float(answer) == float(truth)
    except ValueError:
        # Not numbers (e.g. "1.2.3"): only the exact text above can match.
        return False


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` for the right answer, `format_score` for a wrong one in the asked-for form,
    0 when no answer can be found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if _same_number(answer, ground_truth) else float(format_score)
