"""Rollout correction on the tiny model: decoupled weights computed inside the on-policy
update (no old log-prob pass) equal the ones computed from the separate pass, and one GRPO
step runs with each main mode (decoupled IS, decoupled rejection + normalised weights,
bypass PPO-clip with rejection, bypass REINFORCE), reporting verl's rollout_corr/ metrics."""

from __future__ import annotations

import math

import pytest
import torch

from protocol.data_proto import DataProto
from tests.integration.checkpoint_helpers import run_config, train
from tests.integration.engine_helpers import engine_config, synthetic_rollout

pytestmark = pytest.mark.integration

RC = "algorithm.rollout_correction."


def _actor(cfg):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    group = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor")
    group.init_model()
    return group


def test_in_update_weights_match_the_separate_pass(tiny_model_dir, tokenizer):
    """Sequence IS, decoupled: computed per micro-batch from the update's own forward
    ("micro", no old log-prob pass: on_policy_update) or once from the pass's old log-probs
    ("batch"), the loss, the gradient and the metrics agree. lr=0 keeps the weights, and the
    three actors (on-policy, with the pass, no correction) start from the same seed."""
    base = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=0")
    correction = (RC + "rollout_is=sequence", RC + "rollout_is_threshold=1.5")
    skip = "actor_rollout_ref.actor.skip_old_log_prob_on_policy="
    cfg = engine_config(tiny_model_dir, *base, *correction, skip + "true")
    assert cfg.actor_rollout_ref.actor.on_policy_update
    group = _actor(cfg)
    batch = synthetic_rollout(tokenizer, n=2)
    old = group.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"]
    gen = torch.Generator().manual_seed(1)
    rollout = (old + 0.05 * torch.randn(old.shape, generator=gen)) * mask  # a slightly different engine
    on_policy = batch.union(DataProto.from_dict(tensors={"rollout_log_probs": rollout}))
    micro = group.update_actor(on_policy).meta_info["metrics"]
    group.shutdown()
    group = _actor(engine_config(tiny_model_dir, *base, *correction, skip + "false"))
    with_pass = on_policy.select(deepcopy=True).union(DataProto.from_dict(tensors={"old_log_probs": old}))
    whole = group.update_actor(with_pass).meta_info["metrics"]
    group.shutdown()
    group = _actor(engine_config(tiny_model_dir, *base, skip + "true"))
    plain = group.update_actor(on_policy.select(deepcopy=True)).meta_info["metrics"]
    group.shutdown()
    assert abs(plain["actor/pg_loss"] - micro["actor/pg_loss"]) > 1e-4  # the weights did something
    assert not any(k.startswith("rollout_corr/") for k in plain)
    assert abs(micro["actor/pg_loss"] - whole["actor/pg_loss"]) <= 1e-5
    assert micro["actor/grad_norm"] == pytest.approx(whole["actor/grad_norm"], rel=1e-4)
    keys = [k for k in whole if k.startswith("rollout_corr/")]
    assert "rollout_corr/rollout_is_seq_mean" in keys and keys == [k for k in micro if k.startswith("rollout_corr/")]
    for key in keys:
        assert micro[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-5), key
    assert whole["rollout_corr/rollout_is_ratio_fraction_high"] > 0  # the cap of 1.5 did bite


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=5)


MODES = {
    # on-policy (one mini-batch): the old log-prob pass is skipped, weights computed in the update
    "decoupled_seq_is": [RC + "rollout_is=sequence", RC + "rollout_is_threshold=2.0"],
    # rejection and normalisation need the whole batch first: the pass runs
    "decoupled_rs_norm": [
        RC + "rollout_is=token",
        RC + "rollout_is_batch_normalize=true",
        RC + "rollout_rs=seq_mean_k1",
        RC + "rollout_rs_threshold=1.5",
    ],
    "bypass_ppo_clip_rs": [
        RC + "bypass_mode=true",
        RC + "rollout_rs='token_k1,seq_max_k3'",
        RC + "rollout_rs_threshold='0.5_2.0,4.0'",
    ],
    "bypass_reinforce": [
        RC + "bypass_mode=true",
        RC + "loss_type=reinforce",
        RC + "rollout_is=sequence",
        RC + "rollout_is_threshold=2.0",
        RC + "rollout_is_batch_normalize=true",
    ],
}


@pytest.mark.slow  # four short trainer runs: about 30 s together on two CPU cores
@pytest.mark.parametrize("mode", sorted(MODES))
def test_one_grpo_step_per_mode(tiny_model_dir, arithmetic_files, tmp_path, mode):
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "trainer.total_training_steps=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        *MODES[mode],
    )
    (step,) = train(cfg)["history"]
    assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
    assert ("timing_s/old_log_prob" in step) == (mode == "decoupled_rs_norm")
    assert math.isfinite(step["rollout_corr/kl"]) and math.isfinite(step["rollout_corr/chi2_token"])
    if "rs" in mode:
        assert 0 <= step["rollout_corr/rollout_rs_masked_fraction"] <= 1
    if mode != "bypass_ppo_clip_rs":
        assert step["rollout_corr/rollout_is_mean"] > 0
    if mode.endswith("norm") or mode == "bypass_reinforce":
        assert step["rollout_corr/rollout_is_batch_norm_factor"] > 0
    if mode.startswith("bypass"):
        # the skipped pass's numbers come from the update: entropy, and the engine/trainer gap
        assert 0 < step["actor/entropy"] and step["rollout/logp_abs_diff_mean"] >= 0
