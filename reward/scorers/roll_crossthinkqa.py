"""ROLL's CrossThinkQA rule (CrossThinkQARuleRewardWorker) as a scorer: multiple choice by letter.

The same numbers as ROLL's worker, read from its code (crossthinkqa_rule_reward_worker.py):

- The answer is read from the text after the last `</think>` (all of it when there is
  none): the content of the last `\\boxed{...}` (no nested braces: `[^}]+`), which also
  makes the format right; else the text after the last `answer is` (any case); else the
  whole text. The first capital letter of that answer (any `str.isupper()` character)
  must equal the first character of the ground truth; an answer with no capital letter
  is wrong.
- `reward_type` (ROLL's `rewards.<domain>.reward_type`, no default: ROLL fails without
  one) gives the rule reward:

  | right | boxed | loose | soft | strict |
  |---|---|---|---|---|
  | yes | yes | 1 | 1 | 1 |
  | yes | no | 1 | 0.5 | -1 |
  | no | yes | -1 | -0.5 | -1 |
  | no | no | -1 | -1 | -1 |

- The 3-gram repetition penalty of the whole response, thinking included (roll_rules.py),
  is added, in float16 as ROLL adds them. `acc` is 1 when the rule reward is positive
  (ROLL's `scores`).

`response_length_penalty_coef` must be 0 (ROLL's default and its examples' value): ROLL's
length term measures the padded response tensor of the batch, not the response, which a
per-response scorer cannot know.
"""

from __future__ import annotations

import re

from .roll_rules import after_last_think, float16, float16_sum, repetition_penalty, strip_special_tokens

REWARD_TYPES = ("loose", "soft", "strict")
# (right, boxed) -> rule reward per reward_type.
_REWARDS = {
    (True, True): {"loose": 1.0, "soft": 1.0, "strict": 1.0},
    (True, False): {"loose": 1.0, "soft": 0.5, "strict": -1.0},
    (False, True): {"loose": -1.0, "soft": -0.5, "strict": -1.0},
    (False, False): {"loose": -1.0, "soft": -1.0, "strict": -1.0},
}
_BOXED = re.compile(r"\\boxed\{([^}]+)\}")
_ANSWER_IS = "answer is"


def extract_answer(text: str) -> tuple[str, bool]:
    """The answer text of `text` and whether it came from a `\\boxed{}`."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1], True
    index = text.lower().rfind(_ANSWER_IS)
    if index == -1:
        return text, False
    return text[index + len(_ANSWER_IS) :], False


def is_right(answer: str, ground_truth: str) -> bool:
    """Whether the first upper-case character of `answer` is the ground truth's first character."""
    for char in answer:
        if char.isupper():
            return char == ground_truth[0]
    return False


def compute_score(
    solution_str: str,
    ground_truth: str,
    reward_type: str | None = None,
    response_length_penalty_coef: float = 0.0,
) -> dict:
    """ROLL's CrossThinkQA reward of one response (see the module docstring)."""
    if reward_type not in REWARD_TYPES:
        raise ValueError(
            f"roll_crossthinkqa: rewards.<domain>.reward_type must be one of {', '.join(REWARD_TYPES)}, "
            f"got {reward_type!r}"
        )
    if response_length_penalty_coef != 0:
        raise ValueError(
            "roll_crossthinkqa: rewards.<domain>.response_length_penalty_coef must be 0: ROLL's length term "
            "measures the batch's padded response tensor, not the response"
        )
    truth = str(ground_truth)
    if not truth:
        raise ValueError("roll_crossthinkqa: the ground truth is empty; it must start with the answer's letter")
    text = strip_special_tokens(solution_str)
    answer, boxed = extract_answer(after_last_think(text))
    right = is_right(answer, truth)
    rule_reward = _REWARDS[(right, boxed)][reward_type]
    penalty = repetition_penalty(text)
    return {
        "score": float16_sum(rule_reward, penalty),
        "acc": 1.0 if rule_reward > 0 else 0.0,
        "rule_reward": rule_reward,
        "repetition_penalty": float16(penalty),
        "format": float(boxed),
        "correct": float(right),
    }


__all__ = ["REWARD_TYPES", "compute_score", "extract_answer", "is_right"]
