"""Two GRPO steps through Ray on two CPU ranks with a tensor-parallel rollout engine
(`tensor_model_parallel_size=2`: the two ranks' vLLM engines are one engine's shards) equal the
same two steps with one engine per rank (TP=1), same seeds, fp32: every metric within 1e-4 (the
engine's log-probs differ only in summation order) and the checkpointed weights of both steps
within 1e-6; and the TP=2 run resumed from its step-1 checkpoint reproduces step 2 and its weights.

The rollout is greedy (`rollout.do_sample=false`, verl's n greedy copies): sampled tokens from two
engines and from one engine over the same prompts are different random draws, greedy ones are not.
A group's copies then score alike and GRPO's advantages are 0, so the update's gradient comes from
the entropy bonus (`actor.entropy_coeff`) and, in step 2, the KL loss to the reference.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.checkpoint_helpers import assert_metrics_close, run_config, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
RUN = [
    "trainer.n_gpus_per_node=2",
    "trainer.worker_group=ray",
    "trainer.total_training_steps=2",
    "trainer.save_freq=1",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.do_sample=false",
    "actor_rollout_ref.rollout.max_num_batched_tokens=256",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
]
METRIC_TOL = 1e-4
WEIGHT_TOL = 1e-6


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith_tp_grpo"), n_train=16, n_val=4, seed=9)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def shards(folder, step: int) -> list[dict]:
    from safetensors.torch import load_file

    actor = folder / f"global_step_{step}" / "actor"
    return [load_file(actor / f"model_world_size_2_rank_{rank}.safetensors") for rank in (0, 1)]


def assert_weights_close(a: list[dict], b: list[dict]) -> None:
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.allclose(x[key], y[key], atol=WEIGHT_TOL, rtol=0), key


def test_tp2_grpo_equals_tp1_and_resumes(ray_session, tp_model_dir, arithmetic_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one = train(run_config(tp_model_dir, arithmetic_files, "tp1", *RUN, f"{TP_KEY}=1"))
    two = train(run_config(tp_model_dir, arithmetic_files, "tp2", *RUN, f"{TP_KEY}=2"))
    assert [h["step"] for h in two["history"]] == [1, 2]
    for a, b in zip(one["history"], two["history"]):
        assert_metrics_close(a, b, tol=METRIC_TOL)
    assert two["history"][1]["actor/kl_loss"] != 0  # step 1 moved the policy away from the reference
    for step in (1, 2):
        assert_weights_close(shards(tmp_path / "tp1", step), shards(tmp_path / "tp2", step))
    assert any(
        not torch.equal(x[k], y[k]) for x, y in zip(shards(tmp_path / "tp2", 1), shards(tmp_path / "tp2", 2)) for k in x
    )

    first = tmp_path / "tp2" / "global_step_1"
    resumed = train(
        run_config(
            tp_model_dir,
            arithmetic_files,
            "tp2_resumed",
            *RUN,
            f"{TP_KEY}=2",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={first}",
        )
    )
    assert [h["step"] for h in resumed["history"]] == [2]
    assert_metrics_close(two["history"][1], resumed["history"][0], tol=METRIC_TOL)
    assert_weights_close(shards(tmp_path / "tp2", 2), shards(tmp_path / "tp2_resumed", 2))
