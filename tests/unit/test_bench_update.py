"""The pure helpers of scripts/bench_update.py: token counts, weight counts, the floor."""

from __future__ import annotations

import torch

from scripts.bench_update import (
    VARIANTS,
    actor_kwargs,
    batch_path,
    batch_settings,
    format_table,
    logit_positions,
    matmul_floor_seconds,
    missing_flags,
    others_cores,
    padded_row_tokens,
    prompt_once_tokens,
    settings_hash,
    weight_counts,
)

SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
}


def _batch():
    """Two groups of two samples; prompts left-padded to 4, responses right-padded to 3."""
    pad = 0
    prompts = [[pad, 5, 6, 7], [pad, 5, 6, 7], [pad, pad, 8, 9], [pad, pad, 8, 9]]
    responses = [[1, 2, pad], [3, pad, pad], [4, 4, 4], [pad, pad, pad]]
    lengths = [2, 1, 3, 0]
    input_ids = torch.tensor([p + r for p, r in zip(prompts, responses)])
    prompt_mask = torch.tensor([[0, 1, 1, 1]] * 2 + [[0, 0, 1, 1]] * 2)
    response_mask = torch.tensor([[1] * n + [0] * (3 - n) for n in lengths])
    return input_ids, torch.cat([prompt_mask, response_mask], -1), response_mask


def test_decoder_tokens_with_packed_rows_and_with_each_prompt_once():
    input_ids, attention_mask, _ = _batch()
    assert padded_row_tokens(attention_mask) == 3 + 3 + 2 + 2 + (2 + 1 + 3 + 0)
    # One micro-batch: each group's prompt once.
    assert prompt_once_tokens(input_ids, attention_mask, 3, micro_batch_size=4) == 3 + 2 + 6
    # Micro-batches of one row: nothing is shared.
    assert prompt_once_tokens(input_ids, attention_mask, 3, micro_batch_size=1) == padded_row_tokens(attention_mask)
    # Groups stay whole: with room for 3 rows, each group of 2 gets a micro-batch.
    assert prompt_once_tokens(input_ids, attention_mask, 3, micro_batch_size=3) == 3 + 2 + 6


def test_a_prompt_repeated_in_the_batch_is_computed_once_per_micro_batch():
    input_ids, attention_mask, _ = _batch()
    order = torch.tensor([0, 1, 2, 3, 0, 1])  # the first prompt's group appears twice
    ids, mask = input_ids[order], attention_mask[order]
    responses = 2 + 1 + 3 + 0 + 2 + 1
    assert prompt_once_tokens(ids, mask, 3, micro_batch_size=8) == 3 + 2 + responses
    # Micro-batches of 2 rows: [0, 1], [4, 5] (the first prompt, in pieces), [2, 3].
    assert prompt_once_tokens(ids, mask, 3, micro_batch_size=2) == 3 + 3 + 2 + responses


def test_logit_positions_follow_the_actor():
    # The actor computes logits at every position predicting a response token whose
    # predicting position is real: min(length + 1, R) per row.
    _, _, response_mask = _batch()
    assert logit_positions(response_mask) == 3 + 2 + 3 + 1


def test_weight_counts_of_the_default_model():
    weights = weight_counts(SMOLLM2_135M)
    assert weights["vocab"] == 576 * 49152
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert weights["layers"] == 30 * per_layer
    # With the embedding (tied lm_head) and the norms, this is the 134.5 M of the model.
    assert abs(weights["layers"] + weights["vocab"] - 134.5e6) < 0.1e6


def test_floor_is_six_flops_per_weight_and_token():
    weights = {"layers": 100, "vocab": 10}
    rates = {"layers": 1000.0, "vocab": 60.0}
    assert matmul_floor_seconds(weights, 5, 2, rates) == 6 * 100 * 5 / 1000 + 6 * 10 * 2 / 60


def test_batch_file_name_depends_on_every_setting():
    base = batch_settings(8, 4)
    assert settings_hash(base) == settings_hash(batch_settings(8, 4))
    assert batch_path(base) != batch_path(batch_settings(16, 4))
    assert batch_path(base) != batch_path(batch_settings(8, 8))
    assert batch_path(base).name.startswith("update_batch-") and batch_path(base).parent.name == ".bench"


def test_variants_missing_from_the_constructor_are_named():
    accepted = {"self", "module", "use_remove_padding", "config", "optimizer", "lr_scheduler", "share_prompts"}
    assert missing_flags(accepted, VARIANTS["baseline"]) == []
    assert missing_flags(accepted, VARIANTS["shared_prompts"]) == []
    assert missing_flags(accepted, VARIANTS["both"]) == ["chunk_logits"]


def test_every_accepted_flag_is_passed_explicitly():
    accepted = {"self", "module", "share_prompts", "chunk_logits"}
    assert actor_kwargs(accepted, VARIANTS["baseline"]) == {"chunk_logits": False, "share_prompts": False}
    assert actor_kwargs(accepted, VARIANTS["chunked_logits"]) == {"chunk_logits": True, "share_prompts": False}
    assert actor_kwargs({"self", "share_prompts"}, VARIANTS["baseline"]) == {"share_prompts": False}


def test_table_shows_skipped_variants():
    rows = [
        {
            "variant": "baseline",
            "seconds": 10.0,
            "ratio": 1.0,
            "decoder_tokens": 2500,
            "vocab_tokens": 500,
            "peak_rss_gb": 3.2,
            "floor_s": 1.5,
            "grad_norm": 0.5,
        },
        {"variant": "chunked_logits", "skipped": "skipped: DataParallelPPOActor takes no chunk_logits"},
    ]
    table = format_table(rows)
    assert "baseline" in table and "10.00" in table and "1.00" in table
    assert "takes no chunk_logits" in table


def test_other_processes_cores_are_the_machine_busy_time_minus_ours():
    # 10 s of wall time, the machine busy for 25 CPU-seconds, 20 of them ours: 0.5 core.
    assert others_cores((0.0, 100.0, 5.0), (10.0, 125.0, 25.0)) == 0.5
    assert others_cores((0.0, 100.0, 5.0), (10.0, 119.0, 25.0)) == 0.0  # clock-tick rounding
