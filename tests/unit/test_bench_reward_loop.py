"""scripts/bench_reward_loop.py's arithmetic and its judge's stand-in, without a training run:
the rows from metrics records, the estimate for after-batch scoring, the judge's verdicts and
its concurrency bound over real HTTP."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from reward.judge import render
from scripts.bench_reward_loop import reward_overrides, run_row
from scripts.latency_judge import LatencyJudge, draw_wait, verdict_for

TEMPLATE = (
    "Question: {prompt}\nReference answer: {ground_truth}\nStudent answer: {response}\n\nIs the student's "
    "final answer equal to the reference answer? Reply with one line: 'Score: 1' if it is, 'Score: 0' if it is not."
)


def _records(**extra):
    base = {"timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/reward": 2.0, "agent/latency_s/p50": 4.0}
    return [{"step": 1, **base, "timing_s/step": 30.0}, {"step": 2, **base, **extra}, {"step": 3, **base, **extra}]


def test_rows_skip_the_first_step_and_estimate_the_after_batch_wait():
    row = run_row("after_batch", _records())
    assert row["step_s"] == 10.0 and row["steps"] == 3
    # gen 6 - the median trajectory's own 4 s + 2 s of scoring after generation
    assert (row["last_token_to_score_s"], row["last_token_to_score_kind"]) == (4.0, "estimated")
    row = run_row("reward_loop", _records(**{"reward_loop/last_token_to_score_s/mean": 1.5}))
    assert (row["last_token_to_score_s"], row["last_token_to_score_kind"]) == (1.5, "measured")
    with pytest.raises(ValueError, match="timing needs 2 or more"):
        run_row("reward_loop", _records()[:1])


def test_the_modes_differ_only_in_where_the_judge_is_placed():
    after, loop = reward_overrides("after_batch", "http://x/v1"), reward_overrides("reward_loop", "http://x/v1")
    assert [o for o in after if o not in loop] == ["reward_model.enable_resource_pool=false"]
    assert "reward_model.judge.base_url=http://x/v1" in after


def test_verdicts_are_the_exact_scorer_on_the_default_template():
    assert verdict_for(render(TEMPLATE, "What is 60 + 8?", "60 + 8 = 68", 68)) == "Score: 1"
    assert verdict_for(render(TEMPLATE, "What is 60 + 8?", "It is 67.\nOr 69", 68)) == "Score: 0"
    assert verdict_for("something else") == "I cannot read this request."
    assert draw_wait("q", 0, 1.0, 0.5) == draw_wait("q", 0, 1.0, 0.5) != draw_wait("r", 0, 1.0, 0.5)


def test_the_judge_serves_at_most_its_concurrency_at_once():
    judge = LatencyJudge(mean_s=0.3, sigma=0.01, concurrency=2)
    question = render(TEMPLATE, "What is 2 + 3?", "5", 5)
    replies = []

    def ask():
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": question}]}).encode()
        request = urllib.request.Request(judge.url + "/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            replies.append(json.loads(response.read())["choices"][0]["message"]["content"])

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    judge.close()
    assert replies == ["Score: 1"] * 4
    # Never more than 2 verdicts in progress at once: count overlaps at each start.
    spans = [(start, end) for _, start, end in judge.served]
    assert len(spans) == 4
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) == 2
