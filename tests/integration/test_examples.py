"""Run scripts in examples/ train one real step: the script's own settings, plus
overrides appended on its command line that point it at the tiny random model, tiny
arithmetic parquet files and small batches (one in-process rank, the real vLLM engine),
must exit 0 and leave a metrics.jsonl line for step 1 with a finite critic/score/mean.
The scripts run one after another, each in its own process. ppo_arithmetic.sh's run also shows
the engine's own log lines (the CPU worker's NUMA notice among them) kept in engine_rank0.log,
off the console.

Every script is composed and checked by tests/unit/test_examples_config.py. Not trained here,
because their step is trained elsewhere and each run costs about 20 s of the suite:
- grpo_arithmetic.sh: GRPO with a low_var_kl KL loss and the vLLM engine, the step of verl's
  run_qwen2-7b_math.sh, whose keys test_verl_scripts.py trains in its LoRA and prefix-grouper
  scripts (that script plus LoRA; plus the prefix grouper);
- rloo_arithmetic.sh: RLOO trains in verl's rollout-correction script (test_verl_scripts.py),
  the KL folded into the reward in test_trainer.py's GAE case;
- reinforce_plus_plus_arithmetic.sh: the estimator is checked by hand in test_core_algos.py, its
  mse KL loss in test_losses.py; a KL loss trains in verl's GRPO script;
- multi_turn_arithmetic_retry.sh in sync mode: test_multi_turn_trainer.py, test_multi_turn_ranks.py;
- gsm8k_grpo.sh: GRPO as above; its MODEL_PATH and DATA_DIR handling is tested
  with the script itself in test_examples_config.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# One step of a tiny model takes well under a minute; this only stops a hung run.
RUN_TIMEOUT_S = 420

MT = "actor_rollout_ref.rollout.multi_turn"
SMALL_RUN = [
    "data.train_batch_size=4",
    "data.max_prompt_length=64",
    "data.max_response_length=8",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.max_num_batched_tokens=512",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=1",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.logger=[console,file]",
]

# DAPO keeps only groups whose responses disagree; a random model never answers an
# arithmetic question, so every group would be dropped. This reward varies with the
# response text instead, which is all the filtering needs to keep some groups.
VARYING_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    right = len(solution_str) % 2 == 1
    return {"score": 1.0 if right else 0.0, "acc": right}
"""

TIMES: dict[str, float] = {}
CONSOLE: dict[str, str] = {}  # each script's stdout and stderr


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


@pytest.fixture(scope="module", autouse=True)
def report_times():
    yield
    if TIMES:
        print("\nexample script times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in TIMES.items()), file=sys.stderr)


def run_example(
    name: str, overrides: list[str], out_dir: Path, env: dict | None = None, unset: tuple[str, ...] = ()
) -> dict:
    full_env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    for key in unset:
        full_env.pop(key, None)
    args = ["bash", str(EXAMPLES / name), *overrides, f"trainer.default_local_dir={out_dir}"]
    start = time.perf_counter()
    # cwd=REPO: the run must not depend on how the package was installed (an editable
    # install made before a package gained its __init__.py resolves it elsewhere).
    result = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=full_env, timeout=RUN_TIMEOUT_S)
    TIMES[name] = time.perf_counter() - start
    CONSOLE[name] = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"{name} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    metrics_file = out_dir / "metrics.jsonl"
    assert metrics_file.is_file(), f"{name} wrote no metrics.jsonl\n{result.stderr[-3000:]}"
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    step1 = [r for r in rows if r.get("step") == 1]
    assert step1, f"{name}: no step-1 line in {rows}"
    score = step1[-1].get("critic/score/mean")
    assert isinstance(score, float) and math.isfinite(score), f"{name}: critic/score/mean = {score!r}"
    return step1[-1]


def tiny_data(tiny_model_dir, files) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
    ]


@pytest.mark.parametrize(
    "name, expect",
    [
        ("ppo_arithmetic.sh", ["critic/vf_loss", "critic/values/mean", "timing_s/update_critic"]),
    ],
)
def test_example_one_step(name, expect, tiny_model_dir, arithmetic_files, tmp_path):
    # Also: the engine's own lines go to engine_rank0.log beside the metrics, the CPU worker's NUMA
    # binding notice (torch C++, straight to descriptor 2) included, and not to the console (with
    # neither HYBRID_DEBUG nor a vLLM logging config of the user's, which leave vLLM's logging as it is).
    unset = ("HYBRID_DEBUG", "VLLM_LOGGING_CONFIG_PATH")
    step = run_example(name, tiny_data(tiny_model_dir, arithmetic_files) + SMALL_RUN, tmp_path, unset=unset)
    for key in expect:
        assert key in step and math.isfinite(step[key]), (key, step.get(key))
    assert "NUMA binding" not in CONSOLE[name]
    log = (tmp_path / "engine_rank0.log").read_text()
    assert "Initializing a V1 LLM engine" in log  # vLLM's own lines
    if not torch.cuda.is_available():  # the notice is the CPU worker's
        assert "NUMA binding" in log


def test_multi_turn_example_one_step(tiny_model_dir, arithmetic_files, tmp_path):
    # Room for two 4-token turns and the reply between them: the random model never answers
    # right, so every episode takes the retry. async: the agent loops, one coroutine per episode.
    budget = [f"{MT}.max_tokens_per_turn=4", f"{MT}.max_assistant_turns=2", "data.max_response_length=32"]
    overrides = (
        tiny_data(tiny_model_dir, arithmetic_files) + SMALL_RUN + budget + ["actor_rollout_ref.rollout.mode=async"]
    )
    step = run_example("multi_turn_arithmetic_retry.sh", overrides, tmp_path)
    assert step["multi_turn/turns/max"] == 2.0 and step["multi_turn/observation_tokens/mean"] > 0
    assert step["agent/turns/mean"] == 2.0 and step["agent/in_flight/max"] >= 1
    assert 0 < step["agent/engine_busy_share"] <= 1


def test_openai_agent_example_one_step(tiny_model_dir, arithmetic_files, tmp_path):
    # The agent's conversation through the endpoint (port 0: a free one); 4-token turns.
    budget = ["data.max_response_length=32", "actor_rollout_ref.rollout.agent.http_endpoint_port=0"]
    step = run_example(
        "openai_agent_arithmetic.sh", tiny_data(tiny_model_dir, arithmetic_files) + SMALL_RUN + budget, tmp_path
    )
    assert step["agent/turns/mean"] >= 1 and step["multi_turn/turns/max"] <= 3
    assert math.isfinite(step["actor/pg_loss"])


def test_dapo_example_one_step(tiny_model_dir, arithmetic_files, tmp_path):
    reward_file = tmp_path / "varying_reward.py"
    reward_file.write_text(VARYING_REWARD)
    step = run_example(
        "dapo_arithmetic.sh",
        tiny_data(tiny_model_dir, arithmetic_files)
        + SMALL_RUN
        + [
            # the script's 16-token overlong buffer does not fit in 8-token responses
            "reward_model.reward_kwargs.overlong_buffer.len=4",
            f"custom_reward_function.path={reward_file}",
            "custom_reward_function.name=compute_score",
        ],
        tmp_path,
    )
    assert step["train/num_gen_batches"] >= 1
    assert 0 < step["train/kept_group_fraction"] <= 1
