"""verl's examples/grpo_trainer/run_qwen2-7b.sh with its `tensor_model_parallel_size=2` kept
(tests/integration/verl_scripts.py VERL_TP_SCRIPTS: only the model, data paths and sizes changed)
trains two steps on two CPU ranks as `python -m hybrid.main_ppo` runs it: the two ranks' vLLM
engines are one engine's shards (workers/rollout/tensor_parallel.py). The tiny model has 2 heads
and 1 key/value head, which vLLM repeats on both shards. Asserted: both steps finish with finite
losses, and the engine's log-probs of the sampled tokens are the FSDP actor's old log-probs to
1e-2 (`rollout/logp_abs_diff_max`; measured 1.7e-3 here: shards left with the engine's dummy
start-up weights would be off by whole nats). The script's lr of 1e-6 barely moves the weights,
so whether every push after an update reaches the shards is test_tp_grpo_steps.py's to show."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.integration.run_helpers import REPO, clean_env
from tests.integration.verl_scripts import VERL_TP_SCRIPTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN_CONTROL = [
    "trainer.total_training_steps=2",
    "trainer.total_epochs=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "trainer.logger=[console,file]",
    "trainer.merge_on_finish=False",
    "trainer.plot_on_finish=False",
    "actor_rollout_ref.rollout.cpu_kvcache_space_gb=1",
]
GAP = 1e-2


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith_tp_script"), n_train=16, n_val=4, seed=4)


def test_run_qwen2_7b_trains_two_steps_at_tp2(tiny_model_dir, arithmetic_files, tmp_path):
    out = tmp_path / "run"
    script = VERL_TP_SCRIPTS["grpo_trainer_run_qwen2-7b"]
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in script
    filled = [
        o.format(model=tiny_model_dir, train=arithmetic_files["train"], val=arithmetic_files["val"]) for o in script
    ]
    command = [sys.executable, "-m", "hybrid.main_ppo", *filled, *RUN_CONTROL, f"trainer.default_local_dir={out}"]
    result = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "actor/pg_loss" in s]
    assert [s["step"] for s in trained] == [1, 2]
    for step in trained:
        assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/kl_loss"])
        assert step["rollout/logp_abs_diff_max"] <= GAP, step["rollout/logp_abs_diff_max"]
