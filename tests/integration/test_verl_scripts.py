"""verl's own example scripts, one step each on the tiny model: the override lists of
twelve FSDP + vLLM `main_ppo` scripts (four trained here, eight composed and checked only:
COMPOSE_ONLY says where their step is trained) (tests/integration/verl_scripts.py: GRPO with a KL
loss, PPO with a critic and Ulysses over two ranks, token-budget batches, ReMax, RLOO,
REINFORCE++ with baseline, GPG, rollout correction in bypass mode and with rejection
sampling, the prefix grouper,
LoRA, DAPO's reward manager with GMPO's loss) compose with hybrid's config, pass its checks
and train one real step (the real vLLM engine, one in-process rank; two Ray ranks where the
script asks for sequence parallelism), each in its own process, as `python -m
hybrid.main_ppo` runs them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.verl_scripts import VERL_SCRIPTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RUN_CONTROL = [
    "trainer.total_training_steps=1",
    "trainer.total_epochs=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "trainer.logger=[console,file]",
    "trainer.merge_on_finish=False",
    "trainer.plot_on_finish=False",
    "actor_rollout_ref.rollout.cpu_kvcache_space_gb=1",
]


def _overrides(name: str, model: str, files: dict, out: Path) -> list[str]:
    filled = [o.format(model=model, train=files["train"], val=files["val"], out=out) for o in VERL_SCRIPTS[name]]
    parallel = any("ulysses_sequence_parallel_size=2" in o for o in filled)
    return [
        *filled,
        *RUN_CONTROL,
        f"trainer.default_local_dir={out}",
        f"trainer.n_gpus_per_node={2 if parallel else 1}",
    ]


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=16, n_val=8, seed=4)


def test_the_scripts_compose_and_pass_the_checks(tiny_model_dir, arithmetic_files, tmp_path):
    from hybrid.config import build_config

    for name in VERL_SCRIPTS:
        config = build_config(_overrides(name, tiny_model_dir, arithmetic_files, tmp_path / name))
        assert config.trainer.total_training_steps == 1, name


# Composed and checked above, not trained here: what their step would run is trained elsewhere,
# and each step costs 15-40 s of the suite's budget.
COMPOSE_ONLY = {
    # GRPO with a low_var_kl KL loss: the LoRA script below is this one with every key as written
    # plus LoRA (and its lr, layered_summon, load_format, data.shuffle); the prefix-grouper script,
    # also trained, is it in full parameters plus the prefix grouper (use_remove_padding off,
    # balance_batch on).
    "grpo_trainer_run_qwen2-7b_math",
    # GAE with Ulysses over two Ray ranks for actor and critic: test_trainer's gae_sp_pfppo case
    # trains the same (plus PF-PPO) through Ray, and test_sequence_parallel_heads.py checks its numbers.
    "ppo_trainer_run_deepseek7b_llm_sp2",
    # The GRPO script with another outcome estimator: RLOO is trained by the rollout-correction
    # script below; REINFORCE++-baseline
    # differs from the trained scripts only in the estimator, which tests/unit/test_core_algos.py
    # checks by hand.
    "rloo_trainer_run_qwen2-7b",
    "reinforce_plus_plus_trainer_run_qwen2-7b_math_rf_baseline",
    # PPO with a critic on one rank: test_trainer's GAE cases and examples/ppo_arithmetic.sh
    # (test_examples.py) train it.
    "ppo_trainer_run_gemma",
    # GPG's and GMPO's losses are checked against verl 0.9.1's functions to 1e-6
    # (tests/unit/test_verl_oracle_losses.py) and by hand (test_losses.py); DAPO's reward
    # manager and overlong buffer train in examples/dapo_arithmetic.sh (test_examples.py).
    "gpg_trainer_run_qwen2-7b_math",
    "gmpo_trainer_test_dapo_7b_math",
    # Token-level IS with two rejection-sampling criteria under PPO clipping: test_rollout_correction_steps.py
    # trains GRPO steps with the same multi-criterion rollout_rs (token_k1 with seq_max_k3) in each mode, and
    # tests/unit/test_rollout_correction.py checks the masks by hand; the other rollout-correction script trains.
    "rollout_correction_run_with_rollout_corr_multi_rs",
}


@pytest.mark.parametrize("name", sorted(set(VERL_SCRIPTS) - COMPOSE_ONLY))
def test_verl_script_trains_one_step(name, tiny_model_dir, arithmetic_files, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "hybrid.main_ppo", *_overrides(name, tiny_model_dir, arithmetic_files, out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(s for s in steps if s.get("step") == 1 and "actor/pg_loss" in s)
    assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["critic/score/mean"])
