"""Ulysses sequence parallelism with SmolLM2-135M's head layout (9 query heads, 3 key/value
heads: on 2 ranks the queries split 5 / 4 and the key/value heads are repeated), on a 2-layer
random model of that layout (head size 32, the SmolLM2 tokenizer): a training step of the
actor with SP = 2 on 2 Ray ranks gives the log-probs, loss, gradient norm and updated
log-probs of one rank without SP, in fp32, prompt-once and fused output layer on (the
defaults). The tiny models of the other SP tests have 2 / 1 heads, which split evenly."""

from __future__ import annotations

import pytest

from tests.integration.engine_helpers import actor_group, engine_config, logp_update_logp, synthetic_rollout

pytestmark = pytest.mark.integration

TOL = 1e-4  # fp32: summation order differs between the two paths


@pytest.fixture(scope="module")
def smollm2_heads_model_dir(tmp_path_factory, tokenizer) -> str:
    from tests.conftest import build_tiny_model_dir

    heads = dict(hidden_size=9 * 32, num_attention_heads=9, num_key_value_heads=3)
    return build_tiny_model_dir(tmp_path_factory.mktemp("heads_9_3"), tokenizer, **heads)


def test_sequence_parallel_step_matches_one_rank(smollm2_heads_model_dir, tokenizer):
    import ray

    batch = synthetic_rollout(tokenizer, n=2)
    base = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=1e-3"]
    reference = logp_update_logp(actor_group(engine_config(smollm2_heads_model_dir, *base), None), batch)
    cfg = engine_config(
        smollm2_heads_model_dir,
        *base,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "trainer.n_gpus_per_node=2",
    )
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        group = actor_group(cfg, 2)
        before, metrics, after = logp_update_logp(group, batch)
        group.shutdown()
    finally:
        ray.shutdown()
    ref_before, ref_metrics, ref_after = reference
    mask = batch.batch["response_mask"].bool()
    assert (before - ref_before)[mask].abs().max() <= TOL
    assert abs(metrics["actor/pg_loss"] - ref_metrics["actor/pg_loss"]) <= TOL
    assert abs(metrics["actor/grad_norm"] - ref_metrics["actor/grad_norm"]) <= 1e-3 * ref_metrics["actor/grad_norm"]
    assert (after - ref_after)[mask].abs().max() <= TOL
    assert (after - before)[mask].abs().max() > 10 * TOL, "the update did not move the log-probs"
