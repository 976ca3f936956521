"""Arithmetic scoring: 1.0 when the last number in the response is the integer answer.

SmolLM2-135M tends to answer "3 + 5 = 8", so the last number is the answer it gave. A
final number with a fraction part (`2.5`) is not an integer and scores 0; `8.0` counts
as 8. Thousands separators (`1,234`) are read as one number.
"""

from __future__ import annotations

import re
from fractions import Fraction

# A minus sign counts only where it cannot be the operator of "5-3" (no digit before it).
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)")
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "</s>")


def extract_last_integer(solution_str: str) -> int | None:
    """The last number of the text as an int; None when there is none or it is fractional."""
    text = solution_str
    for token in _END_TOKENS:
        text = text.replace(token, " ")
    found = _NUMBER.findall(text)
    if not found:
        return None
    value = Fraction(found[-1].replace(",", ""))
    if value.denominator != 1:
        return None
    return int(value)


def compute_score(solution_str: str, ground_truth) -> float:
    answer = extract_last_integer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if answer == int(str(ground_truth).strip()) else 0.0
