"""The critic worker on a tiny random model, one in-process rank: its update runs through the
optimizer step it shares with the actor, so packed or padded rows, several micro-batches,
one micro-batch and token-budget micro-batches give the same values, loss and update; and
its mini-batches count prompts (`ppo_mini_batch_size` x `rollout.n` samples)."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.integration.engine_helpers import engine_config, synthetic_rollout

pytestmark = pytest.mark.integration

TOL = 1e-5
CRITIC = [
    "algorithm.adv_estimator=gae",
    "critic.model.fsdp_config.mixed_precision=fp32",
    "critic.optim.lr=1e-3",
    "critic.ppo_micro_batch_size_per_gpu=2",
]


def _critic_update(tiny_model_dir, batch, *overrides, ray_ranks: int | None = None):
    """Values, one update's metrics, values after it: one rank in process, or `ray_ranks`."""
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from hybrid.controller.ray_worker_group import RayResourcePool, RayWorkerGroup
    from workers.critic_worker import CriticWorker

    cfg = engine_config(tiny_model_dir, *CRITIC, *overrides, ranks=ray_ranks or 1)
    if ray_ranks is None:
        group = LocalWorkerGroup(CriticWorker, cfg.critic, name="critic")
    else:
        pool = RayResourcePool(nnodes=1, slots_per_node=ray_ranks, use_gpu=False)
        group = RayWorkerGroup(pool, CriticWorker, cfg.critic, name=f"critic{ray_ranks}")
    group.init_model()
    values = group.compute_values(batch).batch["values"]
    data = batch.select(deepcopy=True)
    data.batch["values"] = values
    data.batch["returns"] = torch.linspace(-1, 1, values.numel()).view_as(values) * data.batch["response_mask"]
    metrics = group.update_critic(data).meta_info["metrics"]
    after = group.compute_values(batch).batch["values"]
    return group, values, metrics, after


@pytest.fixture(scope="module")
def batch(tokenizer):
    return synthetic_rollout(tokenizer, n=2)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, batch):
    _, values, metrics, after = _critic_update(tiny_model_dir, batch)
    return values, metrics, after


@pytest.mark.parametrize(
    "overrides",
    [
        ["critic.model.use_remove_padding=false"],
        [
            "critic.use_dynamic_bsz=true",
            "critic.ppo_max_token_len_per_gpu=120",
            "critic.forward_max_token_len_per_gpu=120",
        ],
        ["critic.ppo_micro_batch_size_per_gpu=8", "critic.forward_micro_batch_size_per_gpu=8"],
    ],
    ids=["padded", "dynamic_bsz", "one_micro_batch"],
)
def test_critic_micro_batching_modes_match(tiny_model_dir, batch, reference, overrides):
    _, values, metrics, after = _critic_update(tiny_model_dir, batch, *overrides)
    ref_values, ref_metrics, ref_after = reference
    mask = batch.batch["response_mask"].bool()
    assert (values - ref_values)[mask].abs().max() <= TOL
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"):
        assert abs(metrics[key] - ref_metrics[key]) <= TOL * max(1.0, abs(ref_metrics[key])), key
    assert (after - ref_after)[mask].abs().max() <= TOL
    assert (ref_after - ref_values)[mask].abs().max() > 100 * TOL, "the update did not move the values"


def test_critic_mini_batches_count_prompts(tiny_model_dir, batch):
    # 4 prompts x n=2 = 8 samples; ppo_mini_batch_size=2 prompts -> 4 samples -> 2 optimizer steps
    group, _, metrics, _ = _critic_update(tiny_model_dir, batch, "critic.ppo_mini_batch_size=2")
    assert group.worker.config.mini_batch_samples_per_rank == 4
    scheduler_steps = group.worker.critic.lr_scheduler.last_epoch
    assert scheduler_steps == 1  # one scheduler step per update call, whatever the number of minis
    assert metrics["critic/lr"] == pytest.approx(1e-3)
    assert group.worker.critic.optimizer.state_dict()["state"][0]["step"].item() == 2


def test_critic_sequence_parallel_matches_one_rank(tiny_model_dir, batch, reference):
    """critic.ulysses_sequence_parallel_size=2 on 2 Ray ranks (one data-parallel group) gives
    the one-rank values, loss and update."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        group, values, metrics, after = _critic_update(
            tiny_model_dir, batch, "critic.ulysses_sequence_parallel_size=2", ray_ranks=2
        )
        group.shutdown()
    finally:
        ray.shutdown()
    ref_values, ref_metrics, ref_after = reference
    assert (values - ref_values).abs().max() <= TOL
    assert abs(metrics["critic/vf_loss"] - ref_metrics["critic/vf_loss"]) <= TOL
    assert (after - ref_after).abs().max() <= TOL
    assert (after - values).abs().max() > 100 * TOL, "the update did not move the values"


def test_the_critic_shows_no_fsdp_view_warning(tiny_model_dir, batch):
    """FSDP2 warned on every GAE run's console that the value model returns a view; nothing
    modifies that output in place, so the warning is dropped, for the critic's model only."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _critic_update(tiny_model_dir, batch, "critic.model.use_remove_padding=false")
    assert not [w for w in caught if "returned a view tensor" in str(w.message)]
