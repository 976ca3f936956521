"""The counting and measuring of scripts/bench_update.py (which re-exports all of it): the
tokens through the decoder layers and the vocabulary projection, the weights of the dense
matrix products, the matmul rate and floor, the cores other processes keep busy, and the
result table. Standard library only, apart from torch in `measure_rates`.
"""

from __future__ import annotations

import os
import resource
import time

__all__ = [
    "padded_row_tokens",
    "prompt_once_tokens",
    "logit_positions",
    "weight_counts",
    "matmul_floor_seconds",
    "ratio",
    "format_table",
    "cpu_snapshot",
    "others_cores",
    "measure_rates",
]


def padded_row_tokens(attention_mask) -> int:
    """Tokens through the decoder with packed rows: every real token of every row."""
    return int(attention_mask.sum())


def prompt_once_tokens(input_ids, attention_mask, response_length: int, micro_batch_size: int) -> int:
    """Tokens through the decoder when a group's prompt is computed once: rows with the same
    real prompt tokens form a group (in order of first appearance), groups go whole into
    micro-batches of up to `micro_batch_size` rows (a larger group is cut into pieces of
    that size), and each micro-batch computes each of its prompts once; every response
    token counts."""
    prompt_ids, prompt_mask = input_ids[:, :-response_length], attention_mask[:, :-response_length]
    prompts = [tuple(prompt_ids[i][prompt_mask[i].bool()].tolist()) for i in range(input_ids.shape[0])]
    groups: dict[tuple, list[int]] = {}
    for row, prompt in enumerate(prompts):
        groups.setdefault(prompt, []).append(row)
    micro: list[list[int]] = []
    for rows in groups.values():
        for start in range(0, len(rows), micro_batch_size):
            piece = rows[start : start + micro_batch_size]
            if micro and len(micro[-1]) + len(piece) <= micro_batch_size:
                micro[-1] = micro[-1] + piece
            else:
                micro.append(list(piece))
    total = int(attention_mask[:, -response_length:].sum())
    return total + sum(len(p) for rows in micro for p in {prompts[r] for r in rows})


def logit_positions(response_mask) -> int:
    """Positions at which the actor computes logits: those predicting a response token whose
    predicting position is a real token (the last prompt token, then each response token
    but the last one of a full-length response): min(length + 1, R) per row."""
    lengths = response_mask.sum(-1)
    return int(lengths.add(1).clamp(max=response_mask.shape[1]).sum())


def weight_counts(hf_config: dict) -> dict[str, int]:
    """Weights of the dense matrix products: all decoder layers' projections, and the
    vocabulary projection (lm_head, tied or not)."""
    hidden, inter = hf_config["hidden_size"], hf_config["intermediate_size"]
    heads, kv_heads = (
        hf_config["num_attention_heads"],
        hf_config.get("num_key_value_heads", hf_config["num_attention_heads"]),
    )
    head_dim = hf_config.get("head_dim") or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    per_layer = attention + 3 * hidden * inter
    return {"layers": per_layer * hf_config["num_hidden_layers"], "vocab": hidden * hf_config["vocab_size"]}


def matmul_floor_seconds(
    weights: dict[str, int], decoder_tokens: int, vocab_tokens: int, rates: dict[str, float]
) -> float:
    """Forward + backward (6 FLOPs per weight per token) at the measured FLOP/s rates."""
    return (
        6 * weights["layers"] * decoder_tokens / rates["layers"] + 6 * weights["vocab"] * vocab_tokens / rates["vocab"]
    )


def ratio(value, base) -> float | None:
    return None if value is None or not base else value / base


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'variant':<15} {'s/update':>9} {'vs base':>8} {'decoder tok':>12} {'vocab tok':>10} "
        f"{'peak RSS GB':>12} {'floor s':>8} {'grad norm':>10} {'others':>7}  note"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        if r.get("skipped"):
            lines.append(
                f"{r['variant']:<15} {'-':>9} {'-':>8} {'-':>12} {'-':>10} {'-':>12} {'-':>8} {'-':>10} {'-':>7}  "
                f"{r['skipped']}"
            )
            continue
        vs = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        others = "-" if r.get("other_cores") is None else f"{r['other_cores']:.2f}"
        lines.append(
            f"{r['variant']:<15} {r['seconds']:>9.2f} {vs:>8} {r['decoder_tokens']:>12} {r['vocab_tokens']:>10} "
            f"{r['peak_rss_gb']:>12.2f} {r['floor_s']:>8.2f} {r['grad_norm']:>10.4f} {others:>7}  {r.get('note', '')}"
        )
    return "\n".join(lines)


def cpu_snapshot() -> tuple[float, float, float]:
    """(wall seconds, CPU seconds busy on the whole machine, CPU seconds of this process)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait
    except (OSError, ValueError):
        busy = float("nan")
    return time.perf_counter(), busy, usage.ru_utime + usage.ru_stime


def others_cores(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores that other processes kept busy between two snapshots (0 on a quiet machine)."""
    wall = after[0] - before[0]
    return max((after[1] - before[1]) - (after[2] - before[2]), 0.0) / wall if wall > 0 else 0.0


def measure_rates(
    dtype_name: str, hidden: int, inter: int, vocab: int, tokens: int, vocab_tokens: int
) -> dict[str, float]:
    """FLOP/s of torch.mm on the update's shapes: (tokens x hidden) @ (hidden x intermediate)
    for the layers, (positions x hidden) @ (hidden x vocab) for the vocabulary projection."""
    import torch

    dtype = getattr(torch, dtype_name)

    def rate(m: int, k: int, n: int) -> float:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        for _ in range(3):
            torch.mm(a, b)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            reps = 0
            while reps < 3 or time.perf_counter() - start < 0.3:
                torch.mm(a, b)
                reps += 1
            best = min(best, (time.perf_counter() - start) / reps)
        return 2 * m * k * n / best

    return {"layers": rate(tokens, hidden, inter), "vocab": rate(vocab_tokens, hidden, vocab)}
