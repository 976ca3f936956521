"""End to end in the dialects: `python -m hybrid.main_ppo --dialect skyrl ...` with the SkyRL
example of the reference docs, and `--roll-config examples/roll_grpo_arithmetic.yaml`, each
train one GRPO step with the real vLLM engine and write one metrics line. Sizes are cut down
(4 prompts x 2 responses, 16-token responses, no validation, no checkpoint) in the dialect's
own keys, and the model is the tiny random one of tests/conftest.py (in the dialect's own model
key): the real default model through the real engine is tests/e2e/test_e2e_grpo.py's, so
running it here again bought nothing but about 20 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.dialect_helpers import SKYRL_SEED_EXAMPLE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 420  # stops a hung run; one step takes well under that

# The seed example's keys that must change to fit the default model, the generated data and
# one CPU process: which model and files, how many devices, the sizes, and switches that
# only make sense on a GPU (bf16 engine, CUDA graphs).
SKYRL_ADAPTED = {
    "trainer.placement.policy_num_gpus_per_node": "1",
    "trainer.placement.critic_num_gpus_per_node": "1",
    "trainer.placement.ref_num_gpus_per_node": "1",
    "trainer.placement.reward_num_gpus_per_node": "1",
    "generator.inference_engine_tensor_parallel_size": "1",
    "trainer.train_batch_size": "4",
    "trainer.policy_mini_batch_size": "4",
    "trainer.critic_mini_batch_size": "4",
    "trainer.micro_train_batch_size_per_gpu": "8",
    "trainer.micro_forward_batch_size_per_gpu": "8",
    "trainer.max_prompt_length": "64",
    "trainer.gradient_checkpointing": "false",
    "trainer.eval_before_train": "false",
    "trainer.eval_interval": "-1",
    "trainer.eval_batch_size": "4",
    "trainer.ckpt_interval": "-1",
    "trainer.resume_mode": "none",
    "trainer.logger": "console",
    "generator.n_samples_per_prompt": "2",
    "generator.enforce_eager": "true",
    "generator.sampling_params.max_generate_length": "16",
}
SKYRL_DROPPED = ("generator.model_dtype",)  # the engine's dtype: auto


def run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "hybrid.main_ppo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return done, time.time() - start


def metric_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "timing_s/step" in x]


def test_skyrl_seed_example_trains_one_step(tiny_model_dir, tmp_path):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    # Four prompts: with SkyRL's trainer.epochs=1 the run is exactly one step.
    files = write_arithmetic_parquet(tmp_path / "data", n_train=4, n_val=4, seed=3)
    run_dir = tmp_path / "run"
    adapted = {
        **SKYRL_ADAPTED,
        "trainer.policy.model.path": tiny_model_dir,
        "data.train_data": f"['{files['train']}']",
        "data.val_data": f"['{files['val']}']",
        "trainer.ckpt_path": str(run_dir),
        "trainer.export_path": str(tmp_path / "exports"),
    }
    overrides = []
    for override in SKYRL_SEED_EXAMPLE:
        key = override.split("=", 1)[0]
        if key in SKYRL_DROPPED:
            continue
        overrides.append(f"{key}={adapted.pop(key)}" if key in adapted else override)
    overrides += [f"{k}={v}" for k, v in adapted.items()]
    done, seconds = run(["--dialect", "skyrl", *overrides], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    steps = metric_lines(run_dir)
    assert len(steps) == 1, steps
    assert steps[0]["response_length/mean"] > 0
    print(f"skyrl one step: {seconds:.0f} s")


def test_roll_example_trains_one_step(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    done, seconds = run(
        [
            "--roll-config",
            str(REPO / "examples" / "roll_grpo_arithmetic.yaml"),
            f"+pretrain={tiny_model_dir}",  # the file has none: hybrid's default model
            "max_steps=1",
            "eval_steps=0",
            "~save_steps",  # ROLL would save the last step; not needed here
            "rollout_batch_size=4",
            "num_return_sequences_in_group=2",
            "response_length=16",
            # 4 x 2 x 1 device = 8 samples per optimizer step = the 4 prompts of 2 responses.
            "actor_train.training_args.per_device_train_batch_size=4",
            "actor_train.training_args.gradient_accumulation_steps=2",
            f"output_dir={run_dir}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    steps = metric_lines(run_dir)
    assert len(steps) == 1, steps
    assert steps[0]["response_length/mean"] > 0
    print(f"roll one step: {seconds:.0f} s")
