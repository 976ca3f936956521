"""The trainer loop end to end on tiny random models through two Ray ranks on CPU:
GAE (with a critic) steps run (GRPO's: test_checkpoint_ray.py), produce finite metrics, change the weights,
report every phase's timing and write metrics.jsonl."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.integration

PHASES = ["gen", "reward", "adv", "update_actor", "update_weights", "step"]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


def tiny_run_config(model_dir, files, out_dir, *extra):
    from hybrid.config import load_config, validate_config

    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={files['train']}",
            f"data.val_files={files['val']}",
            "data.train_batch_size=4",
            "data.max_prompt_length=64",
            "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.max_num_batched_tokens=512",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "trainer.n_gpus_per_node=2",
            "trainer.worker_group=ray",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.val_before_train=false",
            "trainer.logger=[console,file]",
            f"trainer.default_local_dir={out_dir}",
            *extra,
        ]
    )
    validate_config(cfg)
    return cfg


@pytest.mark.parametrize(
    "algo",
    [
        # GRPO through two Ray ranks is test_checkpoint_ray.py's first run (its metrics checked there).
        # GAE also with Ulysses over both ranks (actor, reference, critic) and PF-PPO's resampling.
        [
            "algorithm.adv_estimator=gae",
            "algorithm.use_kl_in_reward=true",
            "algorithm.use_pf_ppo=true",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "critic.ulysses_sequence_parallel_size=2",
        ],
    ],
    ids=["gae_sp_pfppo"],
)
def test_two_steps_through_ray(tiny_model_dir, arithmetic_files, tmp_path, algo):
    import ray
    from transformers import AutoTokenizer

    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer
    from reward.loader import load_reward_manager

    cfg = tiny_run_config(tiny_model_dir, arithmetic_files, tmp_path, *algo)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    train_dl, val_dl = build_dataloaders(cfg, tokenizer)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    trainer = PPOTrainer(cfg, tokenizer, train_dl, val_dl, reward_fn, reward_fn)
    try:
        trainer.init_workers()
        before = trainer.actor_rollout_wg.weights_digest()
        result = trainer.fit()
        after = trainer.actor_rollout_wg.weights_digest()
    finally:
        trainer.shutdown()
        ray.shutdown()
    assert result["steps"] == 2
    assert after != before
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "timing_s/step" in line]
    assert [s["step"] for s in steps] == [1, 2]
    # GRPO here is one optimizer step per batch: the old log-prob pass is skipped and the
    # update reports entropy and the engine/trainer gap. GAE (two mini-batches, KL in the
    # reward) needs the pass.
    extra = ["ref"] + (["old_log_prob", "values", "update_critic"] if "gae" in algo[0] else [])
    for metrics in steps:
        for phase in PHASES + extra:
            assert f"timing_s/{phase}" in metrics, phase
        if "gae" not in algo[0]:
            assert "timing_s/old_log_prob" not in metrics
        for key in (
            "actor/pg_loss",
            "actor/grad_norm",
            "actor/entropy",
            "rollout/logp_abs_diff_mean",
            "critic/score/mean",
            "response_length/mean",
            "perf/throughput",
        ):
            assert math.isfinite(metrics[key]), key
        if "gae" in algo[0]:
            assert math.isfinite(metrics["critic/vf_loss"]) and math.isfinite(metrics["actor/reward_kl_penalty"])
        else:
            assert math.isfinite(metrics["actor/kl_loss"])
    assert any(k.startswith("val-core/arithmetic/reward/mean@1") for k in steps[-1])
