"""Step metrics (hybrid/metrics.py) against numbers worked out by hand on a 3-sample batch
with left-padded prompts, right-padded responses and junk values under the padding (so a
statistic that forgets the mask is visibly wrong); validation grouping with mean@N,
best@N, worst@N, std@N and the val-core / val-aux split."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from hybrid.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    process_validation_metrics,
    reduce_metrics,
    validation_sample_counts,
)
from protocol import DataProto

PAD = 100.0  # written under padding; any statistic that reads it is off by a lot

# 3 samples, prompt width 3 (left-padded), response width 4 (right-padded):
#   s0: prompt 2 tokens, response 3 tokens
#   s1: prompt 3 tokens (= width, clipped), response 4 tokens (= width, clipped)
#   s2: prompt 1 token,  response 1 token
PROMPT_MASK = [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
RESPONSE_MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def f(rows):
    return torch.tensor(rows, dtype=torch.float32)


def make_batch(with_values: bool = True, with_logprobs: bool = True) -> DataProto:
    response_mask = torch.tensor(RESPONSE_MASK)
    tensors = {
        "responses": torch.arange(12).reshape(3, 4),
        "attention_mask": torch.cat([torch.tensor(PROMPT_MASK), response_mask], dim=1),
        "response_mask": response_mask,
        # per-sequence sums: 1, 0.5, 0
        "token_level_scores": f([[0, 0, 1, 0], [0, 0, 0, 0.5], [0, 0, 0, 0]]),
        # per-sequence sums: 0.9, 0.5, -0.2
        "token_level_rewards": f([[-0.1, 0, 1, 0], [0, 0, 0, 0.5], [-0.2, 0, 0, 0]]),
        # valid: 1 2 3 | -1 -1 -1 -1 | 5
        "advantages": f([[1, 2, 3, PAD], [-1, -1, -1, -1], [5, PAD, PAD, PAD]]),
        # valid: 1 1 1 | 0 0 0 0 | 2
        "returns": f([[1, 1, 1, PAD], [0, 0, 0, 0], [2, PAD, PAD, PAD]]),
    }
    if with_values:
        # valid: .5 .5 .5 | 0 0 0 1 | 1
        tensors["values"] = f([[0.5, 0.5, 0.5, PAD], [0, 0, 0, 1], [1, PAD, PAD, PAD]])
    if with_logprobs:
        # |diff| on valid tokens: .1 .2 .3 | 0 0 0 .4 | .6 ; padding differs by 50
        tensors["rollout_log_probs"] = f([[-1.1, -1.2, -1.3, -50], [-1, -1, -1, -1.4], [-0.6, -50, -50, -50]])
        tensors["old_log_probs"] = f([[-1, -1, -1, 0], [-1, -1, -1, -1], [0, 0, 0, 0]])
    return DataProto.from_dict(tensors)


def approx(x, expected):
    return x == pytest.approx(expected, abs=1e-6)


def test_scores_and_rewards_are_per_sequence_sums():
    m = compute_data_metrics(make_batch(), use_critic=True)
    assert approx(m["critic/score/mean"], 0.5)
    assert approx(m["critic/score/max"], 1.0)
    assert approx(m["critic/score/min"], 0.0)
    assert approx(m["critic/rewards/mean"], 1.2 / 3)
    assert approx(m["critic/rewards/max"], 0.9)
    assert approx(m["critic/rewards/min"], -0.2)


def test_token_statistics_ignore_padding():
    m = compute_data_metrics(make_batch(), use_critic=True)
    assert approx(m["critic/advantages/mean"], 7 / 8)
    assert approx(m["critic/advantages/max"], 5.0)
    assert approx(m["critic/advantages/min"], -1.0)
    assert approx(m["critic/returns/mean"], 5 / 8)
    assert approx(m["critic/returns/max"], 2.0)
    assert approx(m["critic/returns/min"], 0.0)
    assert approx(m["critic/values/mean"], 3.5 / 8)
    assert approx(m["critic/values/max"], 1.0)
    assert approx(m["critic/values/min"], 0.0)


def test_explained_variance_uses_unbiased_variance_over_valid_tokens():
    returns = [1, 1, 1, 0, 0, 0, 0, 2]
    values = [0.5, 0.5, 0.5, 0, 0, 0, 1, 1]
    diff = [r - v for r, v in zip(returns, values)]
    expected = 1 - statistics.variance(diff) / (statistics.variance(returns) + 1e-5)
    m = compute_data_metrics(make_batch(), use_critic=True)
    assert approx(m["critic/vf_explained_var"], expected)


def test_lengths_and_clip_ratios():
    m = compute_data_metrics(make_batch(), use_critic=False)
    assert approx(m["response_length/mean"], 8 / 3)
    assert approx(m["response_length/max"], 4)
    assert approx(m["response_length/min"], 1)
    assert approx(m["response_length/clip_ratio"], 1 / 3)
    assert approx(m["prompt_length/mean"], 2)
    assert approx(m["prompt_length/max"], 3)
    assert approx(m["prompt_length/min"], 1)
    assert approx(m["prompt_length/clip_ratio"], 1 / 3)


def test_rollout_logprob_mismatch_over_valid_tokens():
    m = compute_data_metrics(make_batch(), use_critic=False)
    assert approx(m["rollout/logp_abs_diff_mean"], (0.1 + 0.2 + 0.3 + 0.4 + 0.6) / 8)
    assert approx(m["rollout/logp_abs_diff_max"], 0.6)
    assert "rollout/logp_abs_diff_mean" not in compute_data_metrics(make_batch(with_logprobs=False), use_critic=False)


def test_without_critic_no_value_metrics():
    m = compute_data_metrics(make_batch(with_values=False), use_critic=False)
    assert not any(k.startswith("critic/values") for k in m)
    assert "critic/vf_explained_var" not in m


def test_missing_keys_are_named():
    with pytest.raises(KeyError, match="values"):
        compute_data_metrics(make_batch(with_values=False), use_critic=True)
    batch = make_batch()
    batch.batch.pop("advantages")
    with pytest.raises(KeyError, match="advantages"):
        compute_data_metrics(batch, use_critic=False)


def test_all_responses_empty_gives_nan_not_a_crash():
    batch = make_batch()
    batch.batch["response_mask"] = torch.zeros(3, 4, dtype=torch.long)
    m = compute_data_metrics(batch, use_critic=True)
    assert math.isnan(m["critic/advantages/mean"]) and math.isnan(m["critic/values/max"])
    assert math.isnan(m["critic/vf_explained_var"])
    assert approx(m["response_length/mean"], 0.0)
    # scores are per-sequence sums and do not depend on the mask
    assert approx(m["critic/score/mean"], 0.5)


def test_timing_metrics_per_token():
    # response tokens 3+4+1 = 8, prompt tokens 2+3+1 = 6, total 14
    timing = {"gen": 0.8, "update_actor": 1.4, "reward": 0.1, "step": 3.0}
    m = compute_timing_metrics(make_batch(), timing)
    assert m["timing_s/gen"] == 0.8 and m["timing_s/step"] == 3.0 and m["timing_s/reward"] == 0.1
    assert approx(m["timing_per_token_ms/gen"], 800 / 8)
    assert approx(m["timing_per_token_ms/update_actor"], 1400 / 14)
    assert "timing_per_token_ms/reward" not in m and "timing_per_token_ms/step" not in m


def test_throughput_counts_attended_tokens_per_device():
    m = compute_throughput_metrics(make_batch(), {"step": 2.0}, n_devices=2)
    assert m["perf/total_num_tokens"] == 14
    assert approx(m["perf/time_per_step"], 2.0)
    assert approx(m["perf/throughput"], 14 / (2.0 * 2))
    with pytest.raises(KeyError, match="step"):
        compute_throughput_metrics(make_batch(), {"gen": 1.0}, n_devices=1)
    with pytest.raises(ValueError, match="n_devices"):
        compute_throughput_metrics(make_batch(), {"step": 1.0}, n_devices=0)


def test_reduce_metrics_means_over_entries_and_lists():
    out = reduce_metrics(
        [
            {"a": 1.0, "b": torch.tensor([1.0, 3.0])},
            {"a": 3, "c": [1.0, 2.0]},
        ]
    )
    assert out == {"a": 2.0, "b": 2.0, "c": 1.5}


@pytest.mark.parametrize("n, expected", [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6])])
def test_validation_sample_counts(n, expected):
    assert validation_sample_counts(n) == expected


def test_validation_sample_counts_rejects_zero():
    with pytest.raises(ValueError, match=">= 1"):
        validation_sample_counts(0)


def test_validation_greedy_one_sample_per_prompt():
    m = process_validation_metrics(
        ["arith", "arith", "arith", "gsm"], ["p1", "p2", "p3", "q1"], {"reward": [1.0, 0.0, 1.0, 0.0]}
    )
    assert m == {"val-core/arith/reward/mean@1": pytest.approx(2 / 3), "val-core/gsm/reward/mean@1": 0.0}


def test_validation_groups_by_source_and_prompt_with_interleaved_rows():
    # Two prompts from "a" with 4 samples each, rows interleaved; one prompt from "b".
    sources = ["a", "a", "b", "a", "a", "b", "a", "a", "b", "a", "b"]
    prompts = ["p", "q", "r", "p", "q", "r", "p", "q", "r", "p", "r"]
    reward = [1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1]
    # p samples: 1 0 1 0 ; q samples: 0 0 1 ; r samples: 0 1 1 1  -> n=3 is the smallest group (q)
    m = process_validation_metrics(sources, prompts, {"reward": reward})
    # N in (1, 2, 3)
    assert approx(m["val-aux/a/reward/mean@1"], (1 + 0) / 2)
    assert approx(m["val-aux/a/reward/mean@2"], (0.5 + 0.0) / 2)
    assert approx(m["val-aux/a/reward/best@2"], (1 + 0) / 2)
    assert approx(m["val-aux/a/reward/worst@2"], (0 + 0) / 2)
    assert approx(m["val-core/a/reward/mean@3"], (2 / 3 + 1 / 3) / 2)
    assert approx(m["val-core/a/reward/best@3"], (1 + 1) / 2)
    assert approx(m["val-core/a/reward/worst@3"], (0 + 0) / 2)
    assert approx(m["val-aux/a/reward/std@3"], (np.std([1, 0, 1]) + np.std([0, 0, 1])) / 2)
    assert approx(m["val-core/b/reward/mean@3"], 2 / 3)
    assert approx(m["val-core/b/reward/best@3"], 1.0)
    assert approx(m["val-core/b/reward/worst@3"], 0.0)
    assert not any("@4" in k for k in m)
    assert "val-aux/a/reward/best@1" not in m and "val-aux/a/reward/std@1" not in m


def test_validation_mean_and_best_at_n():
    # 2 prompts x 4 samples; n=4 -> N in (1, 2, 4)
    sources = ["s"] * 8
    prompts = ["x"] * 4 + ["y"] * 4
    acc = [0, 1, 0, 0, 0, 0, 0, 1]
    m = process_validation_metrics(sources, prompts, {"reward": [2 * a for a in acc], "acc": acc}, n=4)
    # acc is the core variable when present; reward goes entirely to val-aux.
    assert approx(m["val-core/s/acc/mean@4"], (0.25 + 0.25) / 2)
    assert approx(m["val-core/s/acc/best@4"], 1.0)
    assert approx(m["val-aux/s/acc/mean@2"], (0.5 + 0.0) / 2)
    assert approx(m["val-aux/s/acc/best@2"], (1 + 0) / 2)
    assert approx(m["val-aux/s/acc/mean@1"], 0.0)
    assert approx(m["val-aux/s/reward/mean@4"], 0.5)
    assert approx(m["val-aux/s/reward/best@4"], 2.0)
    assert not any(k.startswith("val-core/s/reward") for k in m)


def test_validation_groups_chat_prompts_by_content():
    # Prompts read from parquet are object arrays of message dicts; equal content held by
    # different objects must still be one prompt.
    def chat(text):
        arr = np.empty(1, dtype=object)
        arr[0] = {"role": "user", "content": text}
        return arr

    prompts = [chat("1+1"), chat("2+2"), chat("1+1"), chat("2+2")]
    m = process_validation_metrics(["s"] * 4, prompts, {"reward": [1.0, 0.0, 0.0, 0.0]})
    assert approx(m["val-core/s/reward/mean@2"], (0.5 + 0.0) / 2)
    assert approx(m["val-core/s/reward/best@2"], (1 + 0) / 2)
    assert approx(m["val-aux/s/reward/mean@1"], (1 + 0) / 2)
    list_prompts = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "a"}]]
    m = process_validation_metrics(["s", "s"], list_prompts, {"reward": [1.0, 0.0]})
    assert approx(m["val-core/s/reward/mean@2"], 0.5)


def test_validation_breaks_the_mean_down_by_subset():
    # Four greedy prompts from one source, two question types; "x" rows have no type.
    sources = ["arithmetic"] * 4 + ["openai/gsm8k"] * 2
    prompts = ["a", "b", "c", "d", "e", "f"]
    subsets = ["1-digit", "2-digit", "2-digit", "2-digit", None, "hard"]
    acc = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    m = process_validation_metrics(sources, prompts, {"reward": acc}, subsets=subsets)
    assert approx(m["val-core/arithmetic/reward/mean@1"], 0.75)  # the headline is over all prompts
    assert approx(m["val-aux/arithmetic/1-digit/reward/mean@1"], 1.0)
    assert approx(m["val-aux/arithmetic/2-digit/reward/mean@1"], 2 / 3)
    assert approx(m["val-aux/openai/gsm8k/hard/reward/mean@1"], 1.0)
    assert not [k for k in m if "/None/" in k]
    assert process_validation_metrics(sources, prompts, {"reward": acc}).keys() < m.keys()
    with pytest.raises(ValueError, match="subsets has 2 rows"):
        process_validation_metrics(sources, prompts, {"reward": acc}, subsets=["x", "y"])


def test_validation_errors():
    with pytest.raises(ValueError, match="fewer than n=3"):
        process_validation_metrics(["s", "s", "s"], ["a", "a", "b"], {"reward": [1, 1, 1]}, n=3)
    with pytest.raises(ValueError, match="sample_inputs has 1 rows"):
        process_validation_metrics(["s", "s"], ["a"], {"reward": [1, 1]})
    with pytest.raises(ValueError, match=r"infos_dict\['reward'\] has 1 rows"):
        process_validation_metrics(["s", "s"], ["a", "b"], {"reward": [1]})
    assert process_validation_metrics([], [], {"reward": []}) == {}


def test_memory_metrics_driver_largest_rank_and_gpu_peak():
    from hybrid.metrics import compute_memory_metrics

    driver = {"pid": 1, "rss_gb": 0.7, "fds": 30, "threads": 20}
    assert compute_memory_metrics(driver) == {"perf/cpu_memory_rss_gb": 0.7}
    workers = [{"rss_gb": 2.1, "fds": 90, "threads": 60}, {"rss_gb": 2.4, "fds": 91, "threads": 61}]
    assert compute_memory_metrics(driver, workers) == {
        "perf/cpu_memory_rss_gb": 0.7,
        "perf/worker_cpu_memory_rss_gb": 2.4,
    }
    gpus = [dict(w, max_memory_allocated_gb=10.0 + i, max_memory_reserved_gb=12.0) for i, w in enumerate(workers)]
    metrics = compute_memory_metrics(driver, gpus)
    assert metrics["perf/max_memory_allocated_gb"] == 11.0 and metrics["perf/max_memory_reserved_gb"] == 12.0


def test_process_stats_reads_this_process():
    import mmap
    import os
    import threading

    from workers.host_memory import process_stats

    before = process_stats()
    # A fresh mapping, written: resident. (A bytearray could reuse memory the allocator
    # already holds in a long test session, leaving RSS unchanged.)
    block = mmap.mmap(-1, 64 * 2**20)
    block.write(b"\x01" * (64 * 2**20))
    assert before["pid"] == os.getpid()
    assert process_stats()["rss_gb"] - before["rss_gb"] > 0.05
    block.close()
    # One more thread and one more open file are counted. Threads other tests left behind in a
    # long session may start or end meanwhile: a few tries, each must see exactly one more.
    for _ in range(10):
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        before = process_stats()
        thread.start()
        try:
            with open(os.devnull) as _:
                after = process_stats()
        finally:
            stop.set()
            thread.join()
        if (after["threads"], after["fds"]) == (before["threads"] + 1, before["fds"] + 1):
            break
    assert (after["threads"], after["fds"]) == (before["threads"] + 1, before["fds"] + 1)
