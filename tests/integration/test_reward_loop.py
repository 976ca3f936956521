"""The reward loop (hybrid/reward_loop.py) on real Ray actors and a real vLLM engine: a
classification reward model served by the engine gives the FSDP forward's scores; a judge
served by the engine writes what greedy decoding of the same weights writes; a judge that
times out ends only its own trajectory's verdict; a judge limited to one domain (ROLL's LLM-judge
domain) scores only that domain's rows, the rule scorer the others."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tests.integration.engine_helpers import classifier_dir, engine_config, synthetic_rollout

pytestmark = pytest.mark.integration

LOOP = ("reward_model.enable=true", "reward_model.use_reward_loop=true", "reward_model.num_workers=1")


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def _scored_rollout(tokenizer, answers=("5", "red", "12345", "Paris")):
    """synthetic_rollout with the fields a reward function reads (arithmetic rows: the rule
    scorer gives 0 or 1)."""
    batch = synthetic_rollout(tokenizer, n=2)
    truths = [a for a in answers for _ in range(2)]
    batch.non_tensor_batch["data_source"] = np.array(["arithmetic"] * len(batch), dtype=object)
    batch.non_tensor_batch["reward_model"] = np.array([{"ground_truth": t} for t in truths], dtype=object)
    return batch


def test_engine_served_classifier_scores_as_the_fsdp_forward(ray_session, tiny_model_dir, tokenizer, tmp_path):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from hybrid.reward_loop import RewardLoop
    from reward.loader import load_reward_manager
    from workers.reward_model_worker import RewardModelWorker

    rm_dir = classifier_dir(tmp_path / "rm", tokenizer)
    common = (f"reward_model.model.path={rm_dir}", "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32")
    loop_cfg = engine_config(
        tiny_model_dir,
        *LOOP,
        *common,
        "reward_model.rollout.dtype=float32",
        "reward_model.rollout.prompt_length=64",
        "reward_model.rollout.response_length=32",
    )
    batch = _scored_rollout(tokenizer)
    loop = RewardLoop(loop_cfg)
    try:
        result = loop.score(batch, use_reward_fn=True, env_rewards=None)
    finally:
        loop.close()
    fsdp_cfg = engine_config(tiny_model_dir, "reward_model.enable=true", *common)
    group = LocalWorkerGroup(RewardModelWorker, fsdp_cfg.reward_model, name="rm")
    group.init_model()
    expected_rm = group.compute_rm_score(batch).batch["rm_scores"]
    # The engine's float32 pooling against the FSDP float32 forward of the same weights.
    assert torch.allclose(result["rm_scores"], expected_rm, atol=1e-4), (result["rm_scores"].sum(-1), expected_rm)
    rule = load_reward_manager(fsdp_cfg, tokenizer, num_examine=0)(batch)
    assert torch.allclose(result["reward_tensor"], rule + result["rm_scores"], atol=0)
    assert result["reward_metrics"]["reward_loop/rm_truncated"] == 0.0


def test_engine_served_judge_writes_the_greedy_continuation(ray_session, tiny_model_dir, tokenizer):
    import ray
    from transformers import AutoModelForCausalLM

    from workers.reward_engine import RewardEngine

    cfg = engine_config(
        tiny_model_dir,
        *LOOP,
        f"reward_model.model.path={tiny_model_dir}",
        "reward_model.rollout.dtype=float32",
        "reward_model.rollout.prompt_length=96",
        "reward_model.rollout.response_length=6",
    )
    engine = ray.remote(RewardEngine).options(num_cpus=0).remote(cfg.reward_model)
    messages = [{"role": "user", "content": "Question: 2+3\nStudent answer: 5\nIs it right?"}]
    text = ray.get(engine.judge.remote(messages, 0.0, None))
    # Sampling at temperature 1 with top_k=1, or a top_p that keeps one token, is greedy too
    # (the random model's near-flat distribution would give other tokens if either were dropped).
    top_k_one = ray.get(engine.judge.remote(messages, 1.0, None, 1.0, 1))
    top_p_tiny = ray.get(engine.judge.remote(messages, 1.0, None, 1e-6, -1))
    ray.kill(engine)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    greedy = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert text == tokenizer.decode(greedy[0, ids.shape[1] :], skip_special_tokens=True)
    assert top_k_one == text and top_p_tiny == text


def test_a_judge_time_out_ends_only_its_trajectory(ray_session, tiny_model_dir, tokenizer):
    from hybrid.reward_loop import RewardLoop
    from scripts.latency_judge import LatencyJudge

    # An OpenAI-compatible judge server that takes 5 s over answers containing "12345".
    server = LatencyJudge(
        0.0,
        0.0,
        concurrency=8,
        wait=lambda question: 5.0 if "12345" in question else 0.0,
        verdict=lambda question: "Score: 1" if "Reference answer: 5\n" in question else "no verdict here",
    )
    cfg = engine_config(
        tiny_model_dir,
        *LOOP,
        f"reward_model.judge.base_url={server.url}",
        "reward_model.judge.timeout_s=1",
        "reward_model.judge.invalid_score=-0.5",
        "reward_model.combine=rm_only",
    )
    loop = RewardLoop(cfg)
    start = time.perf_counter()
    try:
        result = loop.score(_scored_rollout(tokenizer), use_reward_fn=True, env_rewards=None)
    finally:
        loop.close()
        server.close()
    # Rows 4, 5 (ground truth 12345) time out; rows 0, 1 get "Score: 1"; the rest no verdict.
    statuses = result["reward_extra_info"]["judge_status"]
    assert statuses == ["ok", "ok", "unparsable", "unparsable", "timeout", "timeout", "unparsable", "unparsable"]
    assert result["rm_scores"].sum(-1).tolist() == [1.0, 1.0, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5]
    metrics = result["reward_metrics"]
    assert (metrics["reward_loop/judge_timeout"], metrics["reward_loop/judge_unparsable"]) == (2.0, 4.0)
    assert time.perf_counter() - start < 5  # the 5 s verdicts were not waited for


def test_agent_loops_score_each_trajectory_as_it_finishes(ray_session, tiny_model_dir, tokenizer):
    from hybrid.reward_loop import SCORED, RewardLoop
    from reward.loader import load_reward_manager
    from tests.integration.engine_helpers import chat_batch, engine_config, sharp_engine

    engine = sharp_engine(tiny_model_dir, tokenizer, "actor_rollout_ref.rollout.mode=async", n=2)
    cfg = engine_config(tiny_model_dir, "reward_model.use_reward_loop=true", "reward_model.num_workers=2")
    loop = RewardLoop(cfg)
    try:
        engine.agents.set_reward_loop(*loop.rollout_settings())
        chats = [[{"role": "user", "content": q}] for q in ("What is 60 + 8?", "What is 2 + 3?")]
        batch = chat_batch(tokenizer, chats, data_source=["arithmetic"] * 2)
        output = engine.generate_sequences(batch)
        scored = list(output.non_tensor_batch[SCORED])
        assert len(scored) == 4 and all(r["scored_after_s"] >= 0 for r in scored)
        batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])  # as the trainer does
        full = batch.repeat(repeat_times=2, interleave=True).union(output)
        result = loop.score(full, use_reward_fn=True, env_rewards=None)
    finally:
        loop.close()
    # The same scores as the reward manager on the whole batch after generation.
    after_batch = load_reward_manager(cfg, tokenizer, num_examine=0)(full)
    assert torch.equal(result["reward_tensor"], after_batch)
    assert result["reward_metrics"]["reward_loop/scored_in_rollout_fraction"] == 1.0


def test_a_judge_on_one_domain_scores_its_rows_and_the_rule_scorer_the_rest(ray_session, tiny_model_dir, tokenizer):
    # ROLL's multi-domain RLVR: the LLM-judge domain's rows get the judge's verdict (ROLL's prompt,
    # 1 when "yes" is in the verdict), the other domain's rows their rule scorer's score.
    from hybrid.config.override_values import hydra_value
    from hybrid.dialects.roll_judge_prompts import PROMPT_MAPS, judge_template
    from hybrid.reward_loop import RewardLoop
    from reward.scorers.arithmetic import compute_score
    from scripts.latency_judge import LatencyJudge

    asked = []

    def verdict(question):
        asked.append(question)
        return "YES" if "**Reference Answer:**  \n5  \n" in question else "NO"

    server = LatencyJudge(0.0, 0.0, concurrency=8, verdict=verdict)
    template = judge_template("Qwen2.5-7B-Instruct-RLVR-prompt", "judge_prompt")
    cfg = engine_config(
        tiny_model_dir,
        *LOOP,
        f"reward_model.judge.base_url={server.url}",
        f"reward_model.judge.prompt_template={hydra_value(template)}",
        "reward_model.judge.verdict_pattern='(?i)(yes)'",
        "reward_model.judge.verdict_labels={yes: 1}",
        "reward_model.judge.domains=[llm_judge]",
        "data.domain_quotas={llm_judge: 0.5, math_rule: 0.5}",
        "data.reward_fn_key=domain",
        "data.domain_scorers={math_rule: arithmetic}",
    )
    batch = _scored_rollout(tokenizer)  # ground truths 5, 5, red, red, 12345, 12345, Paris, Paris
    domains = ["llm_judge"] * 4 + ["math_rule"] * 4
    batch.non_tensor_batch["domain"] = np.array(domains, dtype=object)
    loop = RewardLoop(cfg)
    try:
        result = loop.score(batch, use_reward_fn=True, env_rewards=None)
    finally:
        loop.close()
        server.close()
    mask = batch.batch["attention_mask"][:, batch.batch["prompts"].shape[-1] :].bool()
    responses = [tokenizer.decode(r[m], skip_special_tokens=True) for r, m in zip(batch.batch["responses"], mask)]
    prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in batch.batch["prompts"]]
    truths = ["5", "5", "red", "red", "12345", "12345", "Paris", "Paris"]
    # The judge saw ROLL's text for the judged rows only (the row's decoded prompt as its question).
    expected = [
        PROMPT_MAPS["Qwen2.5-7B-Instruct-RLVR-prompt"].format(question=q, response=r, reference=t)
        for q, r, t in zip(prompts[:4], responses[:4], truths[:4])
    ]
    assert sorted(asked) == sorted(expected)
    rule = [float(compute_score(r, t)) for r, t in zip(responses[4:], truths[4:])]
    assert result["reward_tensor"].sum(-1).tolist() == [1.0, 1.0, 0.0, 0.0, *rule]
    assert result["reward_extra_info"]["judge_status"] == ["ok", "ok", "unparsable", "unparsable"] + ["not_judged"] * 4
