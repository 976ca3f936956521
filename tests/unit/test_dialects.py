"""SkyRL and ROLL keys on hybrid's command line (hybrid/dialects/), the parts the two
dialects share: the `--dialect` / `--roll-config` flags, value quoting, `--cfg job` and
refusals through the real entry point, and docs/config_dialects.md matching the rule tables.
The helpers and the SkyRL reference example the dialect tests share are in dialect_helpers.py. Each
dialect's mappings and refusals are in test_dialects_skyrl.py and test_dialects_roll.py,
the multi-turn keys in test_dialects_multi_turn.py. Nothing here loads a model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from hybrid.config import ConfigError
from hybrid.dialects import translate_argv
from hybrid.dialects.table import hydra_value
from tests.unit.dialect_helpers import REPO, ROLL_EXAMPLE

# ---------------------------------------------------------------- the command line


def test_verl_is_the_default_and_passes_everything_through():
    argv = ["data.train_batch_size=4", "--cfg", "job", "hydra.run.dir=."]
    assert translate_argv(argv) == argv
    assert translate_argv(["--dialect", "verl", *argv]) == argv
    assert translate_argv(["--dialect=verl", *argv]) == argv


def test_skyrl_flags_and_hydra_overrides_pass_through():
    out = translate_argv(["--dialect", "skyrl", "trainer.seed=3", "--cfg", "job", "hydra.job.chdir=false", "-m"])
    assert out[:3] == ["--cfg", "job", "-m"]
    assert "trainer.seed=3" in out and "data.seed=3" in out
    assert out[-1] == "hydra.job.chdir=false"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dialect", "openrlhf"], "not a dialect hybrid speaks"),
        (["--dialect", "skyrl", "--roll-config", "x.yaml"], "cannot be combined with --dialect skyrl"),
        (["--dialect", "roll"], "needs --roll-config"),
        (["--dialect", "skyrl", "--dialect", "verl"], "more than once"),
        (["--roll-config", "/nonexistent/x.yaml"], "no such file"),
        (["--dialect", "skyrl", "+trainer.seed=1"], "set with key=value"),
    ],
)
def test_command_line_mistakes(argv, message):
    with pytest.raises(ConfigError, match=message):
        translate_argv(argv)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        1e-06,
        0.2,
        float("inf"),
        "vllm",
        "3",
        "null",
        "a b,c",
        "it's",
        "C:\\dir\\",
        "${x}",
        "/root/data/train.parquet",
        [1, 2],
        ["a", "b c"],
        {"x": 1, "y.z": [1, "q"]},
    ],
)
def test_hydra_value_round_trips(value):
    parsed = OverridesParser.create().parse_override(f"k={hydra_value(value)}").value()
    if isinstance(value, str) and "${" in value:
        assert parsed == value.replace("${", "\\${")  # kept literal: OmegaConf unescapes it
    else:
        assert parsed == value


# ---------------------------------------------------------------- the entry point and the doc


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HYBRID_CACHE_DIR": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    (tmp_path / "run").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "hybrid.main_ppo", *args],
        cwd=tmp_path / "run",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cfg_job_prints_the_skyrl_line_in_verl_keys(tmp_path):
    done = run_cli(
        tmp_path,
        "--dialect",
        "skyrl",
        "trainer.train_batch_size=16",
        "generator.n_samples_per_prompt=2",
        "trainer.algorithm.advantage_estimator=rloo",
        "--cfg",
        "job",
        "trainer.policy_mini_batch_size=4",
    )
    assert done.returncode == 0, done.stderr
    assert "train_batch_size: 16" in done.stdout
    assert "ppo_mini_batch_size: 4" in done.stdout
    assert "adv_estimator: rloo" in done.stdout
    assert "    'n': 2" in done.stdout  # YAML quotes the key n
    assert "merge_on_finish: false" in done.stdout
    assert "n_samples_per_prompt" not in done.stdout
    # Keys the line does not give show SkyRL's defaults (hybrid/dialects/skyrl_defaults.py).
    assert "use_kl_loss: true" in done.stdout and "clip_ratio_high: 0.2" in done.stdout
    assert "lr: 1.0e-06" in done.stdout and "seed: 42" in done.stdout
    assert os.listdir(tmp_path / "run") == []


def test_cfg_job_prints_the_roll_file_in_verl_keys(tmp_path):
    done = run_cli(tmp_path, "--roll-config", str(ROLL_EXAMPLE), "--cfg", "job", "max_steps=3")
    assert done.returncode == 0, done.stderr
    assert "total_training_steps: 3" in done.stdout
    assert "experiment_name: roll_grpo_arithmetic" in done.stdout
    assert "ppo_mini_batch_size: 8" in done.stdout


def test_refusal_exits_2_with_every_problem_and_no_traceback(tmp_path):
    done = run_cli(
        tmp_path, "--dialect", "skyrl", "trainer.policy.record_memory=true", "trainer.update_ref_every_epoch=true"
    )
    assert done.returncode == 2
    assert "trainer.policy.record_memory=true: no memory-snapshot switch in hybrid" in done.stderr
    assert "trainer.update_ref_every_epoch=true: hybrid's reference stays the initial policy" in done.stderr
    assert "Traceback" not in done.stderr


def test_committed_doc_is_generated_from_the_tables():
    from scripts.gen_config_dialects_doc import DOC, render

    assert DOC.read_text() == render(), (
        "docs/config_dialects.md is stale: run python -m scripts.gen_config_dialects_doc"
    )
