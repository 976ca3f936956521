"""Worker groups on a tiny random model: one rank in process and two Ray ranks over gloo
give the same log-probs and the same update; packed sequences and token-budget
micro-batches give the same numbers as the plain padded path; a killed worker makes the
driver raise an error naming it instead of hanging. The batch has 2 samples per prompt, so
the defaults pack prompt-once with the fused output layer; one case turns both off."""

from __future__ import annotations

import time

import pytest

from protocol.data_proto import DataProto
from tests.integration.engine_helpers import actor_group, engine_config, logp_update_logp, synthetic_rollout

pytestmark = pytest.mark.integration

TOL = 1e-5


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def batch(tokenizer):
    return synthetic_rollout(tokenizer, n=2)


@pytest.fixture(scope="module")
def local_result(tiny_model_dir, batch):
    cfg = engine_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    group = actor_group(cfg, None)
    return logp_update_logp(group, batch)


def _assert_ray_group_matches(group, batch, local_result) -> None:
    """The Ray group's log-probs, loss, grad norm and updated log-probs equal one rank's."""
    try:
        before, metrics, after = logp_update_logp(group, batch)
    finally:
        group.shutdown()
        group.pool.remove()
    ref_before, ref_metrics, ref_after = local_result
    mask = batch.batch["response_mask"].bool()
    assert (before - ref_before)[mask].abs().max() <= TOL
    assert abs(metrics["actor/pg_loss"] - ref_metrics["actor/pg_loss"]) <= TOL
    assert abs(metrics["actor/grad_norm"] - ref_metrics["actor/grad_norm"]) <= 1e-4 * max(
        1.0, ref_metrics["actor/grad_norm"]
    )
    assert (after - ref_after)[mask].abs().max() <= TOL
    assert (after - before)[mask].abs().max() > 100 * TOL, "the update did not move the log-probs"


@pytest.mark.parametrize("ranks", [1, 2])
def test_ray_group_matches_in_process(ray_cluster, tiny_model_dir, batch, local_result, ranks):
    cfg = engine_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", ranks=ranks)
    group = actor_group(cfg, ranks)
    _assert_ray_group_matches(group, batch, local_result)


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor_rollout_ref.model.use_remove_padding=false"],
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=120"],
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],
        ["actor_rollout_ref.actor.use_prefix_grouper=false", "actor_rollout_ref.model.use_fused_kernels=false"],
    ],
    ids=["padded", "dynamic_bsz", "one_micro_batch", "unshared_full_logits"],
)
def test_micro_batching_modes_match(tiny_model_dir, batch, local_result, overrides):
    cfg = engine_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", *overrides)
    before, metrics, after = logp_update_logp(actor_group(cfg, None), batch)
    ref_before, ref_metrics, ref_after = local_result
    mask = batch.batch["response_mask"].bool()
    assert (before - ref_before)[mask].abs().max() <= TOL
    assert abs(metrics["actor/pg_loss"] - ref_metrics["actor/pg_loss"]) <= TOL
    assert (after - ref_after)[mask].abs().max() <= TOL


def test_token_sum_adds_up_every_micro_batch(tiny_model_dir, batch, local_result):
    """verl 0.9's token-sum: the mini-batch's loss is the sum over its valid tokens, so with
    four micro-batches summed (not averaged) the loss and the gradient are the token-mean run's
    times the number of response tokens (the update is one mini-batch)."""
    cfg = engine_config(
        tiny_model_dir,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.loss_agg_mode=token-sum",
    )
    _, metrics, _ = logp_update_logp(actor_group(cfg, None), batch)
    _, ref_metrics, _ = local_result
    tokens = float(batch.batch["response_mask"].sum())
    assert metrics["actor/pg_loss"] == pytest.approx(ref_metrics["actor/pg_loss"] * tokens, rel=1e-4, abs=1e-5)
    assert metrics["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"] * tokens, rel=1e-4)


def test_on_policy_update_without_old_log_probs_matches(tiny_model_dir, batch, local_result):
    """Skipping the old log-prob pass (one optimizer step per batch) gives the same update,
    and the update itself reports entropy and the engine/trainer gap."""
    cfg = engine_config(
        tiny_model_dir,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.skip_old_log_prob_on_policy=true",
    )
    assert cfg.actor_rollout_ref.actor.on_policy_update
    group = actor_group(cfg, None)
    ref_before, ref_metrics, ref_after = local_result
    mask = batch.batch["response_mask"].bool()
    shifted = (ref_before - 0.25) * mask  # a stand-in engine log-prob 0.25 off on every valid token
    on_policy = batch.select(deepcopy=True).union(DataProto.from_dict(tensors={"rollout_log_probs": shifted}))
    metrics = group.update_actor(on_policy).meta_info["metrics"]
    after = group.compute_log_prob(batch).batch["old_log_probs"]
    assert abs(metrics["actor/pg_loss"] - ref_metrics["actor/pg_loss"]) <= TOL
    assert (after - ref_after)[mask].abs().max() <= TOL
    assert metrics["rollout/logp_abs_diff_mean"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["rollout/logp_abs_diff_max"] == pytest.approx(0.25, abs=1e-5)
    assert 0 < metrics["actor/entropy"] < 12  # log(vocab) bounds the entropy


def test_update_without_old_log_probs_refuses_several_steps(tiny_model_dir, batch):
    cfg = engine_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    group = actor_group(cfg, None)
    with pytest.raises(ValueError, match="only valid for one optimizer step on the whole batch"):
        group.update_actor(batch.select(deepcopy=True))


def test_killed_worker_raises_naming_it(ray_cluster, tiny_model_dir, batch):
    import ray

    from hybrid.controller.ray_worker_group import WorkerFailedError

    cfg = engine_config(tiny_model_dir, ranks=2)
    group = actor_group(cfg, 2)
    try:
        ray.kill(group.workers[1], no_restart=True)
        start = time.time()
        with pytest.raises(WorkerFailedError, match=r"rank 1 \(ActorRolloutRefWorker\) died in compute_log_prob"):
            group.compute_log_prob(batch)
        assert time.time() - start < 60
    finally:
        group.shutdown()
        group.pool.remove()


def test_in_process_group_ignores_a_busy_inherited_master_port(tmp_path):
    """A run started by a process that listens on MASTER_PORT (a test runner holding its own
    process group) must still start: a world of one picks its own free port."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # Through the in-process group (main_ppo), and a bare worker (a one-process SFT job).
        for make in ("LocalWorkerGroup(Worker).worker", "Worker()"):
            code = (
                "from hybrid.controller.local_worker_group import LocalWorkerGroup\n"
                "from workers.base import Worker\n"
                f"worker = {make}\n"
                "print('rank', worker.ping())\n"
            )
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            env.pop("TORCHELASTIC_RUN_ID", None)
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
            assert result.returncode == 0, make + result.stderr[-3000:]
            assert "rank 0" in result.stdout


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["actor_rollout_ref.model.use_remove_padding=false", "actor_rollout_ref.actor.use_prefix_grouper=false"],
        ["actor_rollout_ref.actor.use_prefix_grouper=false", "actor_rollout_ref.model.use_fused_kernels=false"],
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=60"],
    ],
    ids=["prompt_once_fused", "padded", "packed_full_logits", "dynamic_bsz"],
)
def test_sequence_parallel_matches_one_rank(ray_cluster, tiny_model_dir, batch, local_result, overrides):
    """Ulysses SP = 2 on 2 ranks (one data-parallel group; the tiny model's 2 query heads and
    1 key/value head take the repeated-key path) equals one rank without SP."""
    cfg = engine_config(
        tiny_model_dir,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "trainer.n_gpus_per_node=2",
        *overrides,
    )
    group = actor_group(cfg, 2)
    _assert_ray_group_matches(group, batch, local_result)
