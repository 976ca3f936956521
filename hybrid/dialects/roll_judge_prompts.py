"""ROLL's LLM-judge prompts, by the name a `rewards.<domain>.judge_prompt` gives, and their form
as hybrid's judge template (reward_model.judge.prompt_template, reward/judge.py).

The text is ROLL's `prompt_maps` in roll/utils/prompt.py (alibaba/ROLL, commit 8eb27cc2), kept
here line by line (its lines end in two spaces, Markdown line breaks, which a source file would
lose). ROLL's LLMJudgeRewardWorker fills it with `str.format(question=..., response=...,
reference=...)` and sends it as the only (user) message of a chat; hybrid's judge fills
{prompt}, {response} and {ground_truth} and does the same.
"""

from __future__ import annotations

import string

from hybrid.dialects.table import Refusal

QWEN2_5_7B_INSTRUCT_RLVR_PROMPT = "\n".join(
    (
        "",
        "Given a problem, determine whether the final answer in the provided (incomplete) solution process "
        "matches the reference answer.  ",
        "The reference answer may be one single option character (e.g., A, B, C, D), a numerical value, an "
        "expression, or a list of answers if multiple questions are involved.  ",
        "**The reference answer may be in Chinese or another language, but your evaluation should be "
        "language-agnostic.**  ",
        "",
        "Your task:  ",
        "- Compare the final output of the solution process with the reference answer.  ",
        "- If they **match exactly**, output **YES**.  ",
        "- If they **do not match**, output **NO**.  ",
        "- If the solution process is unclear, incomplete, or ambiguous, assume it is incorrect and output **NO**.  ",
        "",
        "Your output must be strictly **'YES'** or **'NO'**, with no additional words, punctuation, or explanation.  ",
        "",
        "---",
        "",
        "**Question:**  ",
        "{question}  ",
        "",
        "**Solution Process (Final Step Only):**  ",
        "{response}  ",
        "",
        "**Reference Answer:**  ",
        "{reference}  ",
        "",
        "**Output:**  ",
        "",
    )
)

# ROLL's prompt_maps: judge_prompt name -> text with {question}, {response}, {reference}.
PROMPT_MAPS = {"Qwen2.5-7B-Instruct-RLVR-prompt": QWEN2_5_7B_INSTRUCT_RLVR_PROMPT}

# ROLL's format fields -> hybrid's placeholders (reward/judge.py PLACEHOLDERS).
FIELDS = {"question": "prompt", "response": "response", "reference": "ground_truth"}


def judge_template(name: str, where: str) -> str:
    """The prompt ROLL names `name`, as hybrid's template: ROLL's format fields become hybrid's
    placeholders and its escaped braces plain ones, so hybrid's render gives ROLL's text."""
    if name not in PROMPT_MAPS:
        raise Refusal(
            f"{where}={name!r} is not in ROLL's prompt_maps (roll/utils/prompt.py: {', '.join(PROMPT_MAPS)}); "
            "ROLL would fall back to its 0-10 prompt, whose score its yes/no rule does not read"
        )
    parts = []
    for literal, field, spec, conversion in string.Formatter().parse(PROMPT_MAPS[name]):
        parts.append(literal)
        if field is None:
            continue
        if field not in FIELDS or spec or conversion:
            raise Refusal(f"{where}={name!r}: format field {{{field}}} is not one of {', '.join(FIELDS)}")
        parts.append("{" + FIELDS[field] + "}")
    return "".join(parts)


__all__ = ["FIELDS", "PROMPT_MAPS", "judge_template"]
