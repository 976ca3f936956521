"""ROLL's IFEval rule (GeneralRuleRewardWorker, ifeval_rule_reward_worker.py) as a scorer.

The ground truth is a JSON object (or a dict) naming one instruction verifier in
`func_name`, with that verifier's arguments beside it (`{"func_name": "verify_keywords",
"keyword_list": ["cat"]}`). The verifier reads the text after the last `</think>`; it gets
the keys of the ground truth that are among its parameter names, as ROLL passes them. The
rule reward is 1 when it holds, else 0, and 0 when the verifier raises (a missing
argument, a letter of two characters...), as in ROLL. The 3-gram repetition penalty of the
whole response (roll_rules.py) is added in float16; `acc` is the rule reward (ROLL's
`scores`).

The verifiers are open-instruct's as ROLL carries them, quirks included (each noted
where it is): `verify_keyword_frequency` counts all words, not the keyword's, etc.
`validate_response_language` needs langdetect; where it is not installed (it is not a
dependency of hybrid) a row naming it is refused. A ground truth without a known
`func_name` is refused too: ROLL's worker fails its batch on one (its penalty list comes
out shorter than the batch).

ROLL's worker reads no `rewards.<domain>.*` key (the examples' `reward_type` is unused by
it), so this scorer takes no options.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from .roll_rules import after_last_think, float16_sum, repetition_penalty, strip_special_tokens


def verify_keywords(text, keyword_list):
    return all(keyword.lower() in text.lower() for keyword in keyword_list)


def verify_keyword_frequency(text, word, N):
    # ROLL's comparison is `word == word` inside the generator, so every word counts.
    return len(re.findall(r"\b\w+\b", text.lower())) == N


def validate_forbidden_words(text, forbidden_words):
    return not any(word.lower() in text.lower() for word in forbidden_words)


def verify_letter_frequency(text, letter, N):
    if len(letter) != 1:
        raise ValueError("the letter must be a single character")
    return text.count(letter) == N


def validate_response_language(text, language):
    # Called only where langdetect is installed (rule_reward refuses the row otherwise).
    from langdetect import detect

    return detect(text) == language


def verify_paragraph_count(text, N):
    cleaned = "\n".join(line.strip() for line in text.splitlines()).strip()
    paragraphs = cleaned.split("* * *")
    if any(not paragraph.strip() for paragraph in paragraphs):
        return False
    return len(paragraphs) == N


def validate_word_constraint(text, N, quantifier):
    count = len(text.strip().split())
    tolerance = max(round(N * 0.1), 1)  # computed first, as in ROLL: N=None raises
    if quantifier == "at least":
        return count >= N
    if quantifier == "at most":
        return count <= N
    if quantifier == "around":
        return abs(count - N) <= tolerance
    return False


def verify_sentence_constraint(text, N, quantifier):
    count = len(re.split(r"(?<!\w\.\w.)(?<![A-Z][a-z]\.)(?<=\.|\?)\s", text))
    if quantifier == "at least":
        return count >= N
    if quantifier == "around":
        return abs(count - N) <= 1
    if quantifier == "at most":
        return count <= N
    return False


def validate_paragraphs(text, N, first_word, i):
    paragraphs = text.split("\n\n")
    if len(paragraphs) != N:
        return False
    return paragraphs[i - 1].strip().startswith(first_word)


def verify_postscript(text, postscript_marker):
    if postscript_marker not in text:
        return False
    return len(text[text.find(postscript_marker) :].strip()) > len(postscript_marker)


def validate_placeholders(text, N):
    return len(re.findall(r"\[(.*?)\]", text)) >= N


def verify_bullet_points(text, N):
    return sum(1 for line in text.split("\n") if line.strip().startswith(("*", "-"))) == N


def validate_title(text):
    return bool(re.findall(r"<<(.*?)>>", text))


def validate_choice(text, options):
    # The whole response must be contained in one of the options.
    return any(text in option for option in options)


def validate_highlighted_sections(text, N):
    return len(re.findall(r"\*(.*?)\*", text)) >= N


def validate_sections(text, N, section_splitter):
    sections = text.split(section_splitter)
    if sections[0] == "":
        sections.pop(0)
    return len(sections) == N


def validate_json_format(text):
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def validate_repeat_prompt(text, original_prompt):
    return text.startswith(original_prompt)


def validate_two_responses(text):
    if text.count("******") != 1:
        return False
    first, second = (part.strip() for part in text.split("******"))
    return first != second


def validate_uppercase(text):
    return text == text.upper()


def validate_lowercase(text):
    return text == text.lower()


def validate_frequency_capital_words(text, N, quantifier):
    count = len(re.findall(r"\b[A-Z]+\b", text))
    if quantifier == "at least":
        return count >= N
    if quantifier == "around":
        return count == N  # ROLL's "around" is exact here
    if quantifier == "at most":
        return count <= N
    return False


def validate_end(text, end_phrase):
    return text.endswith(end_phrase)


def validate_quotation(text):
    return text.startswith('"') and text.endswith('"')


def validate_no_commas(text):
    return "," not in text


VERIFIERS = {
    fn.__name__: fn
    for fn in (
        verify_keywords,
        verify_keyword_frequency,
        validate_forbidden_words,
        verify_letter_frequency,
        validate_response_language,
        verify_paragraph_count,
        validate_word_constraint,
        verify_sentence_constraint,
        validate_paragraphs,
        verify_postscript,
        validate_placeholders,
        verify_bullet_points,
        validate_title,
        validate_choice,
        validate_highlighted_sections,
        validate_sections,
        validate_json_format,
        validate_repeat_prompt,
        validate_two_responses,
        validate_uppercase,
        validate_lowercase,
        validate_frequency_capital_words,
        validate_end,
        validate_quotation,
        validate_no_commas,
    )
}
_NEEDS_LANGDETECT = "validate_response_language"


def _constraint(ground_truth: Any) -> tuple[str, dict]:
    constraint = dict(json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth)
    name = constraint.pop("func_name", None)
    if name not in VERIFIERS:
        raise ValueError(
            f"roll_ifeval: the ground truth's func_name {name!r} is not one of ROLL's IFEval verifiers "
            f"({', '.join(VERIFIERS)})"
        )
    return name, constraint


def _langdetect_installed() -> bool:
    try:
        import langdetect  # noqa: F401
    except ImportError:
        return False
    return True


def rule_reward(text: str, ground_truth: Any) -> float:
    """1.0 when the ground truth's verifier holds for `text`, else 0.0 (0.0 when it raises, as in ROLL)."""
    name, constraint = _constraint(ground_truth)
    if name == _NEEDS_LANGDETECT and not _langdetect_installed():
        raise ValueError(
            "roll_ifeval: instruction validate_response_language needs langdetect, which is not installed "
            "(not a hybrid dependency): pip install langdetect, or drop these rows"
        )
    verifier = VERIFIERS[name]
    parameters = set(inspect.signature(verifier).parameters)
    arguments = {key: value for key, value in constraint.items() if key in parameters}
    try:
        result = verifier(text, **arguments)
    except Exception:
        # ROLL's rule: a verifier that raises (wrong or missing arguments) is a failed instruction.
        return 0.0
    return 1.0 if result else 0.0


def compute_score(solution_str: str, ground_truth: Any) -> dict:
    """ROLL's IFEval reward of one response (see the module docstring)."""
    text = strip_special_tokens(solution_str)
    reward = rule_reward(after_last_think(text), ground_truth)
    return {"score": float16_sum(reward, repetition_penalty(text)), "acc": reward}


__all__ = ["VERIFIERS", "compute_score", "rule_reward"]
