"""ROLL's CrossThinkQA rule (reward/scorers/roll_crossthinkqa.py) and the shared pieces of ROLL's rule
workers (roll_rules.py): rewards hand-computed from the rules in ROLL's crossthinkqa_rule_reward_worker.py."""

from __future__ import annotations

import pytest

from reward.scorers import roll_crossthinkqa
from reward.scorers.roll_rules import after_last_think, float16_sum, repetition_penalty


def score(text, truth, reward_type="soft"):
    return roll_crossthinkqa.compute_score(text, truth, reward_type=reward_type)


@pytest.mark.parametrize(
    ("text", "truth", "expected"),
    [
        # boxed and right: 1 for every reward_type
        ("<think>maybe A</think>\nThe answer is \\boxed{C}.", "C", {"loose": 1.0, "soft": 1.0, "strict": 1.0}),
        # boxed and wrong
        ("Reasoning done. \\boxed{A}", "B", {"loose": -1.0, "soft": -0.5, "strict": -1.0}),
        # no boxed answer, right after the last 'answer is' (the capital T of 'The' comes before it)
        ("The answer is (B), surely.", "B", {"loose": 1.0, "soft": 0.5, "strict": -1.0}),
        # no boxed answer, no 'answer is': the first capital letter of the whole text is 'I', not D
        ("I pick d, so D.", "D", {"loose": -1.0, "soft": -1.0, "strict": -1.0}),
        # no capital letter at all: wrong
        ("the answer is b", "B", {"loose": -1.0, "soft": -1.0, "strict": -1.0}),
    ],
)
def test_rule_reward_table(text, truth, expected):
    for reward_type, reward in expected.items():
        result = score(text, truth, reward_type)
        assert result["score"] == reward, (reward_type, result)
        assert result["acc"] == (1.0 if reward > 0 else 0.0)


def test_answer_reading():
    # the last boxed answer counts; thinking before the last </think> is not read for the answer
    assert score("\\boxed{A} then \\boxed{B}", "B")["score"] == 1.0
    assert score("<think>\\boxed{A}</think>The answer is B", "B")["score"] == 0.5
    # ROLL's boxed pattern stops at the first '}': \boxed{\text{B}} reads '\text{B', whose first capital is B
    assert score("\\boxed{\\text{B}}", "B")["score"] == 1.0
    # only the ground truth's first character is compared
    assert score("\\boxed{B}", "B) Paris")["score"] == 1.0
    # 'ANSWER IS' matches case-insensitively
    assert score("FINAL ANSWER IS c or C", "C")["correct"] == 1.0


def test_repetition_penalty_thresholds():
    assert repetition_penalty("") == 0.0
    assert repetition_penalty("B B") == 0.0  # fewer words than the 3-gram
    assert repetition_penalty("B B B") == 0.0  # one 3-gram, not repeated
    assert repetition_penalty("B B B B") == -0.25  # two equal 3-grams: (1 - 1/2) * -0.5
    assert repetition_penalty("A b C a B c") == -0.125  # lower-cased: abc, bca, cab, abc -> (1 - 3/4) * -0.5
    assert repetition_penalty("a b c a b c a b c") == pytest.approx(-2 / 7)  # 7 3-grams, 3 distinct
    with pytest.raises(ValueError, match="must not be positive"):
        repetition_penalty("a b c", max_penalty=0.5)


def test_penalty_added_in_float16():
    # 12 words, 10 3-grams, 6 distinct: penalty (1 - 6/10) * -0.5 = -0.2, float16 -0.199951171875;
    # right without a box (soft 0.5): 0.5 - 0.199951171875 = 0.300048828125 (a float16 value)
    result = score("x y z x y z x y z answer is B", "B")
    assert result["repetition_penalty"] == -0.199951171875
    assert result["score"] == 0.300048828125
    assert result["acc"] == 1.0
    # 'B B B B' right without a box: 0.5 - 0.25
    assert score("B B B B", "B")["score"] == 0.25
    # the penalty reads the whole response, thinking included
    # ('<think>', 'go', 'go', 'go', 'go', '</think>\\boxed{b}': 4 3-grams, 3 distinct -> -0.125)
    assert score("<think>\ngo go go go\n</think>\\boxed{B}", "B")["score"] == 0.875
    assert float16_sum(1.0, -2 / 7) == 0.71435546875


def test_think_and_special_tokens():
    assert after_last_think("a</think>b</think>\n\nc") == "c"
    assert after_last_think("no think") == "no think"
    assert score("\\boxed{B}<|im_end|><|endoftext|>", "B")["score"] == 1.0


def test_refusals():
    with pytest.raises(ValueError, match=r"reward_type must be one of loose, soft, strict, got None"):
        roll_crossthinkqa.compute_score("\\boxed{B}", "B")
    with pytest.raises(ValueError, match="response_length_penalty_coef must be 0"):
        roll_crossthinkqa.compute_score("\\boxed{B}", "B", reward_type="soft", response_length_penalty_coef=0.1)
    with pytest.raises(ValueError, match="ground truth is empty"):
        score("\\boxed{B}", "")
