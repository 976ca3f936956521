"""GSM8K scoring: compare the final number of a response with the reference answer.

By default this gives exactly the scores of verl's `verl/utils/reward_score/gsm8k.py`, so
a run's rewards and validation accuracy compare with a verl run's:

- `method="strict"` reads the last `#### <number>` (four hashes, one space, then digits,
  `.`, `,`, an optional leading `-`); commas are removed; the text must then equal the
  ground truth exactly. `#### 18.0` for 18, `#### 3.50` for 3.5, `####12`, `#### $18`
  and `####  18` are not right answers.
- `method="flexible"` takes the last run of digits, `.`, `,` (optional leading `-`)
  anywhere in the text that is not a lone `.`, as it stands (commas kept), and compares
  it the same way: `... is 18.` reads `18.` and scores the wrong-answer score.

Only the last 300 characters of a response are read, as in verl.

`lenient=True` is this project's more forgiving reading (numbers compared by value, so
`18.0` and `18.` match 18; `$` and commas ignored; `####` with any spacing; in flexible
mode a trailing period does not belong to the number). Pass it to the default scorer
through the reward manager's keyword arguments, `reward_model.reward_kwargs.lenient=true`
on the command line; keys there that the reward manager does not use go to the scoring
function (with `method`, `format_score` and `score` the same way). Its rewards do not
compare with verl's.
"""

from __future__ import annotations

import re

# Regexes over very long responses are slow; the answer sits at the end anyway.
_CLIP_CHARS = 300
_VERL_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_VERL_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_LENIENT_STRICT = re.compile(r"####\s*\$?\s*(-?[0-9.,]+)")
_LENIENT_FLEXIBLE = re.compile(r"-?\$?[0-9][0-9.,]*|-?\.[0-9]+")


def _check_method(method: str) -> None:
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k scorer: method must be 'strict' or 'flexible', got {method!r}")


def _verl_extract(text: str, method: str) -> str | None:
    if method == "strict":
        found = _VERL_STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _VERL_FLEXIBLE.findall(text)
    answer = None
    # verl's loop: the last match that is not "" or "."; when every match is one of
    # those, the loop ends on the first match, which is then compared (and is wrong).
    for answer in reversed(found):
        if answer not in ("", "."):
            break
    return answer


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def _lenient_extract(text: str, method: str) -> str | None:
    found = (_LENIENT_STRICT if method == "strict" else _LENIENT_FLEXIBLE).findall(text)
    for candidate in reversed(found):
        cleaned = _clean(candidate)
        if cleaned not in ("", "-", "."):
            return cleaned
    return None


def extract_solution(solution_str: str, method: str = "strict", lenient: bool = False) -> str | None:
    """The final answer in `solution_str` as the text that is compared, or None."""
    _check_method(method)
    text = solution_str[-_CLIP_CHARS:]
    return _lenient_extract(text, method) if lenient else _verl_extract(text, method)


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
    lenient: bool = False,
) -> float:
    """`score` for the right answer, `format_score` for a wrong one that could be read,
    0 when none can be read (see the module docstring for `method` and `lenient`).

    A ground truth that is not a string (an int from a hand-made parquet) is compared as
    its `str()`; verl compares it as it is and never finds it equal.
    """
    answer = extract_solution(solution_str, method=method, lenient=lenient)
    if answer is None:
        return 0.0
    right = _same_number(answer, ground_truth) if lenient else answer == str(ground_truth)
    return float(score) if right else float(format_score)
