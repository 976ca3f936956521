"""`python -m hybrid.main_ppo` as a user runs it: printing the config, rejecting typos and
invalid configs before anything loads, and leaving the current directory clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir(tmp_path):
    """An empty directory to run in, with the cache pointed inside it."""
    (tmp_path / "run").mkdir()
    return tmp_path


def run_cli(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["HYBRID_CACHE_DIR"] = str(workdir / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, "-m", "hybrid.main_ppo", *args],
        cwd=workdir / "run",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_directory_untouched(workdir: Path) -> None:
    # No outputs/<date>/, no .hydra/, no main_ppo.log, and no default model conversion.
    assert sorted(os.listdir(workdir / "run")) == []
    assert not (workdir / "cache").exists()


def test_cfg_job_prints_config_without_resolving(workdir):
    result = run_cli(workdir, "--cfg", "job")
    assert result.returncode == 0, result.stderr
    assert "train_batch_size: 8" in result.stdout
    assert "adv_estimator: grpo" in result.stdout
    assert "${hybrid_default:model}" in result.stdout
    assert "hydra:" not in result.stdout
    assert_directory_untouched(workdir)


def test_cfg_job_applies_overrides_and_free_form_keys(workdir):
    result = run_cli(
        workdir,
        "--cfg",
        "job",
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=3",
        "+reward_model.reward_kwargs.max_resp_len=7",
    )
    assert result.returncode == 0, result.stderr
    assert "train_batch_size: 16" in result.stdout
    assert "swap_space: 3" in result.stdout
    assert "max_resp_len: 7" in result.stdout


def test_unknown_key_suggests_the_nearest(workdir):
    result = run_cli(workdir, "data.train_batch_sise=4")
    assert result.returncode == 2
    assert "did you mean data.train_batch_size?" in result.stderr
    assert "Traceback" not in result.stderr
    assert_directory_untouched(workdir)


def test_invalid_config_exits_before_loading(workdir):
    result = run_cli(workdir, "actor_rollout_ref.actor.strategy=megatron")
    assert result.returncode == 2
    assert "actor_rollout_ref.actor.strategy='megatron' is not supported" in result.stderr
    assert "Traceback" not in result.stderr
    assert_directory_untouched(workdir)
