"""Prompt-once packing: the rows of a GRPO group share their prompt, so it runs once.

A group holds n responses to one prompt; packed one row per sample, the prompt goes
through every layer n times. Here the rows of a micro-batch whose real prompt tokens (and
positions) are identical form a group, packed as `[prompt, response_1, ..., response_n]`:
the prompt attends causally to itself, each response to the whole prompt and causally to
its own tokens, and every response's position ids continue from the prompt's, so each
token sees exactly what it would in its own row (workers/packed_attention.py runs the
attention from the `SharedPrefixLayout`). Per-token results come back to the (B, L) layout
through `packed_at`, the packed position of each (row, column), shared by the prompt
columns of a group's rows.

Groups are found from the tokens, not from `uid`, so a micro-batch cut anywhere is still
computed exactly; `prompt_groups` also tells the micro-batch splitter what to keep whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class SharedPrefixLayout:
    """Where each group sits in the packed row, and the gathers that batch its attention.

    `prompts` and `responses` are spans `(start, length)` in the packed row. The attention
    runs as two SDPA calls per layer, whatever the number of groups: every prompt padded to
    the longest (`prompt_index`, causal), and every non-empty response padded to the
    longest with its prompt's keys in front (`response_query_index`, `response_key_index`,
    `response_mask`: the whole real prompt, then causally its own tokens). `output_index`
    takes each packed position's result from the two outputs laid end to end.
    """

    prompts: tuple[tuple[int, int], ...]
    responses: tuple[tuple[tuple[int, int], ...], ...]  # per group, per response
    prompt_index: torch.Tensor  # (G, P_max) packed positions, padded with 0
    response_query_index: torch.Tensor  # (N, R_max)
    response_key_index: torch.Tensor  # (N, P_max + R_max)
    response_mask: torch.Tensor  # (N, 1, R_max, P_max + R_max) bool
    output_index: torch.Tensor  # (T,) into [prompt outputs (G * P_max), response outputs (N * R_max)]


def attention_plan(prompts, responses, total: int, device) -> dict[str, torch.Tensor]:
    """The index tensors of a `SharedPrefixLayout` (built once per micro-batch, used by every layer)."""
    p_max = max((n for _, n in prompts), default=0)
    spans = [(g, r0, r_len) for g, group in enumerate(responses) for r0, r_len in group if r_len]
    r_max = max((n for _, _, n in spans), default=0)
    prompt_index = torch.zeros(len(prompts), p_max, dtype=torch.long)
    output_index = torch.zeros(total, dtype=torch.long)
    for g, (p0, p_len) in enumerate(prompts):
        prompt_index[g, :p_len] = torch.arange(p0, p0 + p_len)
        output_index[p0 : p0 + p_len] = g * p_max + torch.arange(p_len)
    query_index = torch.zeros(len(spans), r_max, dtype=torch.long)
    key_index = torch.zeros(len(spans), p_max + r_max, dtype=torch.long)
    mask = torch.zeros(len(spans), 1, r_max, p_max + r_max, dtype=torch.bool)
    causal = torch.ones(r_max, r_max, dtype=torch.bool).tril()
    base = len(prompts) * p_max
    for i, (g, r0, r_len) in enumerate(spans):
        p_len = prompts[g][1]
        query_index[i, :r_len] = torch.arange(r0, r0 + r_len)
        key_index[i, :p_max] = prompt_index[g]
        key_index[i, p_max : p_max + r_len] = query_index[i, :r_len]
        mask[i, 0, :, :p_len] = True
        mask[i, 0, :, p_max : p_max + r_len] = causal[:, :r_len]
        output_index[r0 : r0 + r_len] = base + i * r_max + torch.arange(r_len)
    tensors = {
        "prompt_index": prompt_index,
        "response_query_index": query_index,
        "response_key_index": key_index,
        "response_mask": mask,
        "output_index": output_index,
    }
    return {k: v.to(device) for k, v in tensors.items()}


def prompt_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_len: int
) -> list[list[int]]:
    """Row indices grouped by identical real prompt tokens and positions, in order of first
    appearance; rows within a group keep their order."""
    prompt_width = input_ids.shape[1] - response_len
    ids = input_ids[:, :prompt_width].cpu()
    pos = position_ids[:, :prompt_width].cpu()
    keep = attention_mask[:, :prompt_width].bool().cpu()
    groups: dict[bytes, list[int]] = {}
    for row in range(ids.shape[0]):
        key = ids[row][keep[row]].numpy().tobytes() + b"|" + pos[row][keep[row]].numpy().tobytes()
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def group_token_counts(attention_mask: torch.Tensor, response_len: int, groups: list[list[int]]) -> list[int]:
    """Tokens each group puts through the model when packed prompt-once."""
    prompt_width = attention_mask.shape[1] - response_len
    prompt_lens = attention_mask[:, :prompt_width].sum(-1).tolist()
    response_lens = attention_mask[:, prompt_width:].sum(-1).tolist()
    return [prompt_lens[g[0]] + sum(response_lens[r] for r in g) for g in groups]


def pack_shared(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_len: int):
    """One packed row with every group's prompt once.

    Returns packed (1, T) input ids and position ids, `packed_at` (B * L,): the packed
    position of each real (row, column), -1 elsewhere, and the model's keyword arguments
    (`shared_prefix`, read by the packed attention).
    """
    batch, seq_len = input_ids.shape
    prompt_width = seq_len - response_len
    device = input_ids.device
    mask = attention_mask.bool()
    cols = torch.arange(seq_len, device=device)
    packed_at = torch.full((batch * seq_len,), -1, dtype=torch.long, device=device)
    sources: list[torch.Tensor] = []  # flat (row * L + column) index of each packed token
    prompts, responses = [], []
    start = 0
    for group in prompt_groups(input_ids, attention_mask, position_ids, response_len):
        prompt_cols = cols[:prompt_width][mask[group[0], :prompt_width]]
        prompts.append((start, prompt_cols.numel()))
        for row in group:
            packed_at[row * seq_len + prompt_cols] = torch.arange(start, start + prompt_cols.numel(), device=device)
        sources.append(group[0] * seq_len + prompt_cols)
        start += prompt_cols.numel()
        spans = []
        for row in group:
            response_cols = cols[prompt_width:][mask[row, prompt_width:]]
            packed_at[row * seq_len + response_cols] = torch.arange(start, start + response_cols.numel(), device=device)
            sources.append(row * seq_len + response_cols)
            spans.append((start, response_cols.numel()))
            start += response_cols.numel()
        responses.append(tuple(spans))
    flat = torch.cat(sources)
    packed_ids = input_ids.reshape(-1)[flat].unsqueeze(0)
    packed_pos = position_ids.reshape(-1)[flat].unsqueeze(0)
    plan = attention_plan(prompts, responses, start, device)
    layout = SharedPrefixLayout(prompts=tuple(prompts), responses=tuple(responses), **plan)
    return packed_ids, packed_pos, packed_at, {"shared_prefix": layout}
