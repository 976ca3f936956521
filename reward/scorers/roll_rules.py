"""Pieces ROLL's rule reward workers share, for the scorers that reproduce them (roll_*.py).

ROLL's CrossThinkQA and IFEval workers decode a response with its special tokens, drop
`<|endoftext|>`, `<pad>` and `<|im_end|>`, score the text after the last `</think>`, add
a 3-gram repetition penalty computed on the whole response (thinking included), and add
the terms as float16 tensors. These helpers do the same, so a score here equals the
`response_level_rewards` ROLL logs for the same text, float16 rounding included.
"""

from __future__ import annotations

import torch

# The special tokens ROLL's workers remove from the decoded response (hybrid decodes
# without special tokens, so this matters only for a tokenizer that keeps them).
_STRIPPED_TOKENS = ("<|endoftext|>", "<pad>", "<|im_end|>")
# ROLL builds its repetition penalty with these two fixed values; no config key changes them.
REPETITION_NGRAM_SIZE = 3
REPETITION_MAX_PENALTY = -0.5


def strip_special_tokens(text: str) -> str:
    for token in _STRIPPED_TOKENS:
        text = text.replace(token, "")
    return text


def after_last_think(text: str, end_think: str = "</think>") -> str:
    """The text after the last `</think>` with its leading newlines removed; all of it when there is none."""
    index = text.rfind(end_think)
    if index == -1:
        return text
    return text[index + len(end_think) :].lstrip("\n")


def repetition_penalty(
    text: str, ngram_size: int = REPETITION_NGRAM_SIZE, max_penalty: float = REPETITION_MAX_PENALTY
) -> float:
    """`max_penalty` times the share of repeated word n-grams (lower-cased, split on whitespace).

    0 for an empty text or one with fewer words than `ngram_size`; otherwise
    `(1 - distinct/total) * max_penalty`, so a text without a repeated n-gram scores 0 and
    one that repeats a single n-gram k times scores `(1 - 1/k) * max_penalty`.
    """
    if max_penalty > 0:
        raise ValueError(f"repetition penalty: max_penalty {max_penalty} must not be positive")
    words = text.lower().split()
    if text == "" or len(text.split()) < ngram_size:
        return 0.0
    ngrams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
    return (1 - len(set(ngrams)) / len(ngrams)) * max_penalty


def float16_sum(*terms: float) -> float:
    """The sum as ROLL computes it: each term a float16 tensor, added left to right in float16."""
    total = torch.tensor(terms[0], dtype=torch.float16)
    for term in terms[1:]:
        total = total + torch.tensor(term, dtype=torch.float16)
    return float(total)


def float16(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float16))


__all__ = [
    "REPETITION_MAX_PENALTY",
    "REPETITION_NGRAM_SIZE",
    "after_last_think",
    "float16",
    "float16_sum",
    "repetition_penalty",
    "strip_special_tokens",
]
