"""The generative judge's prompt and verdict rules (reward/judge.py): good verdicts give their
score, bad and adversarial ones give invalid_score with the reason."""

from __future__ import annotations

import pytest

from reward.judge import AMBIGUOUS, OK, OUT_OF_RANGE, UNPARSABLE, compile_pattern, parse_verdict, render

DEFAULT = r"(?i)score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)"


def verdict(text, pattern=DEFAULT, low=0.0, high=1.0, invalid=-1.0, labels=None):
    return parse_verdict(text, compile_pattern(pattern), low, high, invalid, labels)


@pytest.mark.parametrize(
    "text, score",
    [
        ("Score: 1", 1.0),
        ("The answer matches.\nscore = 0", 0.0),
        ("**Score:** 1", 1.0),  # markdown bold, as chat models write it
        ("Score: 0.5", 0.5),
        ("Score: 1\nFinal. Score: 1", 1.0),  # repeated, same value
    ],
)
def test_good_verdicts_give_their_score(text, score):
    result = verdict(text)
    assert (result.score, result.status) == (score, OK)


@pytest.mark.parametrize(
    "text, status",
    [
        ("", UNPARSABLE),
        ("The student is right.", UNPARSABLE),
        ("Score: one", UNPARSABLE),
        ("Score: 0 ... on reflection Score: 1", AMBIGUOUS),  # undecided: neither value is taken
        ("Score: 7", OUT_OF_RANGE),
        ("Score: -1", OUT_OF_RANGE),
        ("Score: 99999999999999999999999999999999999999", OUT_OF_RANGE),
    ],
)
def test_bad_and_adversarial_verdicts_score_invalid_with_the_reason(text, status):
    result = verdict(text)
    assert (result.score, result.status) == (-1.0, status)


def test_a_custom_range_and_pattern():
    pattern = r"<score>(\d+)</score>"
    assert verdict("<score>7</score>", pattern, 0, 10).score == 7.0
    assert verdict("Score: 7", pattern, 0, 10).status == UNPARSABLE


def test_patterns_without_a_group_or_broken_are_refused():
    with pytest.raises(ValueError, match="has no group"):
        compile_pattern(r"Score: \d+")
    with pytest.raises(ValueError, match="is not a regular expression"):
        compile_pattern(r"Score: (\d+")


def test_render_fills_placeholders_once_and_leaves_other_braces():
    template = 'Q: {prompt}\nA: {response}\nRef: {ground_truth}\nJSON: {"score": 1}'
    out = render(template, "2+3?", "It is {ground_truth}", 5)
    assert out == 'Q: 2+3?\nA: It is {ground_truth}\nRef: 5\nJSON: {"score": 1}'
    assert render("{ground_truth}", "p", "r", None) == ""


def test_labels_turn_words_into_scores():
    pattern = r"(?i)\b(yes|no)\b"
    labels = {"yes": 1, "No": 0}
    assert verdict("Yes, it is right.", pattern, labels=labels).score == 1.0
    assert verdict("no.", pattern, labels=labels).score == 0.0
    assert verdict("Yes... well, no.", pattern, labels=labels).status == AMBIGUOUS
    assert verdict("Maybe.", pattern, labels=labels).status == UNPARSABLE
