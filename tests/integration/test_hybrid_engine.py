"""The hybrid engine on a tiny random model: after each update and `update_rollout_weights`
the in-process vLLM engine samples from exactly the weights the actor trains (engine
log-probs equal the actor's), and an engine that missed a sync is caught by the same check."""

from __future__ import annotations

import pytest
import torch

from tests.integration.engine_helpers import engine_config, prompt_batch, with_advantages

pytestmark = pytest.mark.integration

FP32_TOL = 1e-3


@pytest.fixture(scope="module")
def fused_group(tiny_model_dir):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    cfg = engine_config(tiny_model_dir, "actor_rollout_ref.rollout.temperature=1.0")
    group = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor_rollout_ref")
    group.init_model()
    group.update_rollout_weights()  # the engine starts with dummy weights
    return group


def _engine_vs_actor(group, tokenizer):
    gen = group.generate_sequences(prompt_batch(tokenizer))
    actor = group.compute_log_prob(gen)
    mask = gen.batch["response_mask"].bool()
    diff = (actor.batch["old_log_probs"] - gen.batch["rollout_log_probs"]).abs()[mask]
    return gen, actor, diff


def test_engine_log_probs_track_actor_through_updates(fused_group, tokenizer):
    group = fused_group
    digests = [group.weights_digest()]
    for updates_done in range(4):  # compare after 0, 1, 2 and 3 updates
        gen, actor, diff = _engine_vs_actor(group, tokenizer)
        assert gen.batch["response_mask"].sum() > 0
        assert diff.mean().item() <= FP32_TOL, (
            f"after {updates_done} updates: mean |engine - actor| = {diff.mean():.2e}"
        )
        if updates_done < 3:
            metrics = group.update_actor(with_advantages(gen.union(actor), seed=updates_done)).meta_info["metrics"]
            assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
            digests.append(group.weights_digest())
            assert digests[-1] != digests[-2], "update_actor did not change the weights"
            seconds = group.update_rollout_weights()
            assert len(seconds) == 1 and seconds[0] > 0  # one float per rank


def test_stale_engine_is_detected(fused_group, tokenizer):
    """Skip the sync after an update: the same comparison must now fail."""
    group = fused_group
    gen, actor, diff = _engine_vs_actor(group, tokenizer)
    assert diff.mean().item() <= FP32_TOL
    group.update_actor(with_advantages(gen.union(actor), seed=11))  # and no update_rollout_weights
    _, _, stale_diff = _engine_vs_actor(group, tokenizer)
    assert stale_diff.mean().item() > 10 * FP32_TOL, f"stale engine not detected: {stale_diff.mean():.2e}"
    group.update_rollout_weights()
    _, _, fresh_diff = _engine_vs_actor(group, tokenizer)
    assert fresh_diff.mean().item() <= FP32_TOL
