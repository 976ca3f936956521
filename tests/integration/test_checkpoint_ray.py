"""Checkpoint and exact resume through Ray with two ranks (GRPO with a KL loss): each
rank writes its own shards into the folder the driver names (an absolute path: Ray
workers do not share the driver's working directory), and a run resumed from step 1
reproduces step 2's metrics and the step-2 weights of the run that went on; also with Ulysses
sequence parallelism over the two ranks (one data-parallel group, both ranks one sequence).
The first run is also the suite's plain GRPO-through-Ray check (test_trainer.py runs GAE through
Ray): every phase timed, finite metrics, the weights changed by the step."""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration.checkpoint_helpers import assert_metrics_close, run_config, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RAY_RUN = [
    "trainer.n_gpus_per_node=2",
    "trainer.worker_group=ray",
    "trainer.total_training_steps=2",
    "trainer.save_freq=1",
    "actor_rollout_ref.actor.use_kl_loss=true",
]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.mark.parametrize("sp", [1, 2])
def test_two_rank_resume_is_exact(ray_session, tiny_model_dir, arithmetic_files, tmp_path, monkeypatch, sp):
    monkeypatch.chdir(tmp_path)  # a relative default_local_dir, as run scripts write it
    run = [*RAY_RUN, f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}"]
    a = train(run_config(tiny_model_dir, arithmetic_files, "first", *run))
    first, second = tmp_path / "first", tmp_path / "second"
    assert [h["step"] for h in a["history"]] == [1, 2]
    for metrics in a["history"]:
        for phase in ("gen", "reward", "adv", "ref", "update_actor", "update_weights", "step"):
            assert f"timing_s/{phase}" in metrics, phase
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/score/mean", "perf/throughput"):
            assert math.isfinite(metrics[key]), key
    files = sorted(p.name for p in (first / "global_step_1" / "actor").glob("model_world_size_*"))
    assert files == ["model_world_size_2_rank_0.safetensors", "model_world_size_2_rank_1.safetensors"]
    b = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            "second",
            *run,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={first / 'global_step_1'}",
        )
    )
    assert [h["step"] for h in b["history"]] == [2]
    assert_metrics_close(a["history"][1], b["history"][0])
    from safetensors.torch import load_file

    for rank in (0, 1):
        name = f"model_world_size_2_rank_{rank}.safetensors"
        x, y = load_file(first / "global_step_2" / "actor" / name), load_file(second / "global_step_2" / "actor" / name)
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), rank
        earlier = load_file(first / "global_step_1" / "actor" / name)
        assert any(not torch.equal(earlier[k], x[k]) for k in x), f"step 2 left rank {rank}'s weights unchanged"
