"""A tensor-parallel rollout engine in an actor of its own (issue 38, point 3): fully asynchronous
training with one engine actor at tensor_model_parallel_size=2 on the tiny 4-head model.

The engine's two shards are vLLM's worker processes, so the trainer's weights reach them in
buckets of whole layers (workers/weight_sync.layer_buckets), one in-place reload each. Shown:
two steps train, and after a push the engine's samples carry the trainer's own log-probs (the
pushed weights are the trained ones, every layer included; a half-loaded layer or a missed
bucket would leave the engine far from the trainer)."""

from __future__ import annotations

import os

import pytest

from tests.integration.checkpoint_helpers import run_config, train
from tests.integration.engine_helpers import prompt_batch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AT = "async_training"


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith_tp_actor"), n_train=16, n_val=4, seed=7)


def test_fully_async_trains_with_a_two_way_engine_actor(
    tp_model_dir, arithmetic_files, tmp_path, tokenizer, monkeypatch
):
    # One training rank and a 2-way engine are three device slots; this machine (and CI) has two
    # cores. The run is told it has three (Ray's logical CPUs follow), and the two cores are shared.
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    run = [
        "actor_rollout_ref.hybrid_engine=false",
        "rollout.n_gpus_per_node=2",
        "trainer.worker_group=auto",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
        # Small buckets: the push of the tiny model goes in several reloads.
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes=1",
        f"{AT}.mode=fully_async",
        f"{AT}.staleness_threshold=1.0",
        f"{AT}.trigger_parameter_sync_step=1",
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
    ]

    def push_and_compare(trainer):
        trainer.engines.push(trainer.actor_rollout_wg, version=100)
        prompts = prompt_batch(tokenizer)
        prompts.meta_info.update({"n": 1})
        samples = trainer.engines.generate_sequences(prompts)
        actor = trainer.actor_rollout_wg.compute_log_prob(samples)
        mask = samples.batch["response_mask"].bool()
        engine_lp = samples.batch["rollout_log_probs"][mask]
        actor_lp = actor.batch["old_log_probs"][mask]
        return {"gap": float((engine_lp - actor_lp).abs().max()), "tokens": int(mask.sum())}

    out = train(run_config(tp_model_dir, arithmetic_files, tmp_path, *run), inspect=push_and_compare)
    assert len(out["history"]) == 2
    assert all("actor/pg_loss" in h for h in out["history"])
    assert out["tokens"] > 0
    assert out["gap"] < 1e-4, out["gap"]
