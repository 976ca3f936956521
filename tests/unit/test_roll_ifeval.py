"""ROLL's IFEval rule (reward/scorers/roll_ifeval.py): each of its verifiers on texts that keep and
break the instruction, quirks included, with the expected results worked out by hand from
ROLL's ifeval_rule_reward_worker.py; the think split, the repetition penalty and the refusals."""

from __future__ import annotations

import json

import pytest

from reward.scorers import roll_ifeval

CASES = [
    ("verify_keywords", {"keyword_list": ["Cat", "dog"]}, "A cat and a DOG.", 1.0),
    ("verify_keywords", {"keyword_list": ["Cat", "dog"]}, "A cat.", 0.0),
    # ROLL counts every word, not the keyword: 3 words of anything match N=3
    ("verify_keyword_frequency", {"word": "cat", "N": 3}, "cat dog bird", 1.0),
    ("verify_keyword_frequency", {"word": "cat", "N": 3}, "cat cat cat cat", 0.0),
    ("validate_forbidden_words", {"forbidden_words": ["Bad"]}, "all good", 1.0),
    ("validate_forbidden_words", {"forbidden_words": ["Bad"]}, "so bad", 0.0),
    ("verify_letter_frequency", {"letter": "a", "N": 2}, "bad a", 1.0),
    ("verify_letter_frequency", {"letter": "a", "N": 2}, "banana", 0.0),
    ("verify_letter_frequency", {"letter": "ab", "N": 1}, "ab", 0.0),  # raises in the verifier: 0
    ("verify_paragraph_count", {"N": 2}, "one\n* * *\ntwo", 1.0),
    ("verify_paragraph_count", {"N": 3}, "one\n* * *\n* * *\ntwo", 0.0),  # an empty paragraph
    # around: tolerance max(round(N / 10), 1); round(2.5) is 2
    ("validate_word_constraint", {"N": 10, "quantifier": "around"}, " ".join(["w"] * 11), 1.0),
    ("validate_word_constraint", {"N": 10, "quantifier": "around"}, " ".join(["w"] * 12), 0.0),
    ("validate_word_constraint", {"N": 25, "quantifier": "around"}, " ".join(["w"] * 27), 1.0),
    ("validate_word_constraint", {"N": 25, "quantifier": "around"}, " ".join(["w"] * 28), 0.0),
    ("validate_word_constraint", {"N": 3, "quantifier": "at least"}, "a b", 0.0),
    ("validate_word_constraint", {"N": 3, "quantifier": "nearly"}, "a b c", 0.0),
    ("verify_sentence_constraint", {"N": 2, "quantifier": "at most"}, "Dr. Smith came. He left.", 1.0),
    ("verify_sentence_constraint", {"N": 2, "quantifier": "at most"}, "One. Two. Three.", 0.0),
    ("validate_paragraphs", {"N": 2, "first_word": "Second", "i": 2}, "First para.\n\nSecond para.", 1.0),
    ("validate_paragraphs", {"N": 2, "first_word": "Second", "i": 2}, "First\n\nThird", 0.0),
    ("validate_paragraphs", {"N": 3, "first_word": "Second", "i": 2}, "First\n\nSecond", 0.0),
    ("verify_postscript", {"postscript_marker": "P.S."}, "Hi.\nP.S. see you", 1.0),
    ("verify_postscript", {"postscript_marker": "P.S."}, "Hi. P.S.", 0.0),  # the marker alone
    ("validate_placeholders", {"N": 2}, "[name] at [address]", 1.0),
    ("validate_placeholders", {"N": 2}, "[name]", 0.0),
    ("verify_bullet_points", {"N": 2}, "* a\n- b\nc", 1.0),
    ("verify_bullet_points", {"N": 2}, "* a\n* b\n* c", 0.0),
    ("validate_title", {}, "<<Joy>> text", 1.0),
    ("validate_title", {}, "<Joy> text", 0.0),
    # the response must be inside one option: 'yes' is inside 'My answer is yes.'
    ("validate_choice", {"options": ["My answer is yes.", "My answer is no."]}, "yes", 1.0),
    ("validate_choice", {"options": ["My answer is yes.", "My answer is no."]}, "maybe", 0.0),
    ("validate_highlighted_sections", {"N": 2}, "*a* and *b*", 1.0),
    ("validate_highlighted_sections", {"N": 2}, "*a* only", 0.0),
    ("validate_sections", {"N": 2, "section_splitter": "SECTION"}, "SECTION 1 x SECTION 2 y", 1.0),
    ("validate_sections", {"N": 2, "section_splitter": "SECTION"}, "SECTION 1 x", 0.0),
    ("validate_json_format", {}, '{"a": 1}', 1.0),
    ("validate_json_format", {}, "{a: 1}", 0.0),
    ("validate_repeat_prompt", {"original_prompt": "Say hi."}, "Say hi. Hi!", 1.0),
    ("validate_repeat_prompt", {"original_prompt": "Say hi."}, "Hi!", 0.0),
    ("validate_two_responses", {}, "A\n******\nB", 1.0),
    ("validate_two_responses", {}, "A ****** A", 0.0),
    ("validate_uppercase", {}, "HELLO 1", 1.0),
    ("validate_uppercase", {}, "Hello", 0.0),
    ("validate_lowercase", {}, "hello", 1.0),
    ("validate_lowercase", {}, "Hello", 0.0),
    # ROLL's 'around' for capital words is exact
    ("validate_frequency_capital_words", {"N": 2, "quantifier": "around"}, "NASA and ESA", 1.0),
    ("validate_frequency_capital_words", {"N": 2, "quantifier": "around"}, "NASA ESA JAXA", 0.0),
    ("validate_end", {"end_phrase": "Anything else?"}, "Done. Anything else?", 1.0),
    ("validate_end", {"end_phrase": "Anything else?"}, "Done. Anything else?!", 0.0),
    ("validate_end", {}, "Done.", 0.0),  # a missing argument raises in the verifier: 0
    ("validate_quotation", {}, '"quoted"', 1.0),
    ("validate_quotation", {}, "quoted", 0.0),
    ("validate_no_commas", {"N": None}, "a b", 1.0),  # keys the verifier does not take are left out
    ("validate_no_commas", {}, "a, b", 0.0),
]


@pytest.mark.parametrize(("name", "arguments", "text", "expected"), CASES)
def test_verifiers(name, arguments, text, expected):
    truth = json.dumps({"func_name": name, **arguments})
    assert roll_ifeval.rule_reward(text, truth) == expected


def test_every_verifier_is_exercised():
    assert {name for name, *_ in CASES} | {"validate_response_language"} == set(roll_ifeval.VERIFIERS)
    assert len(roll_ifeval.VERIFIERS) == 25


def test_think_split_and_float16_penalty():
    # the verifier reads '"hello world"' (after </think>); the penalty reads the whole response:
    # words <think> plan plan plan plan </think> "hello world" -> 6 3-grams, 5 distinct -> -1/12,
    # float16 -0.08331298828125; 1 - 0.08331298828125 rounds to float16 0.91650390625
    truth = {"func_name": "validate_quotation"}
    result = roll_ifeval.compute_score('<think>\nplan plan plan plan\n</think>\n"hello world"', truth)
    assert result == {"score": 0.91650390625, "acc": 1.0}
    assert roll_ifeval.compute_score('"hi"<|im_end|>', truth) == {"score": 1.0, "acc": 1.0}
    assert roll_ifeval.compute_score("no quotes", truth) == {"score": 0.0, "acc": 0.0}


def test_refusals(monkeypatch):
    with pytest.raises(ValueError, match=r"func_name 'validate_haiku' is not one of ROLL's IFEval verifiers"):
        roll_ifeval.compute_score("x", {"func_name": "validate_haiku"})
    with pytest.raises(ValueError, match=r"func_name None"):
        roll_ifeval.compute_score("x", "{}")
    monkeypatch.setattr(roll_ifeval, "_langdetect_installed", lambda: False)
    with pytest.raises(ValueError, match="instruction validate_response_language needs langdetect"):
        roll_ifeval.compute_score("Hello", {"func_name": "validate_response_language", "language": "en"})
