"""One of ROLL's own RLVR example files (examples/qwen3-30BA3B-rlvr_fsdp2/rlvr_config.yaml, kept
in tests/data/peer_examples/roll.json) trains two steps from the command line, as
`python -m hybrid.main_ppo --roll-config FILE key=value ...`, with only the model, the data and
the sizes changed in ROLL's own dotted keys (the tiny random model of tests/conftest.py, the
arithmetic data in the example's `messages` column, one device, 4 prompts x 2 responses of 16
tokens). Its REINFORCE++ with whitening, reward and advantage clips, dual clip, ROLL's
max_len_mask and difficulty_mask, FSDP2 and vLLM settings go through as written.

A random model never ends a response and never scores, so as written both of ROLL's masks leave
no response in the losses and every step is skipped, as ROLL skips it (mask/final_mask_sum_eq_0);
the second run turns the two masks off (ROLL keys again) to show the same file updating the
policy.

ROLL's agentic Sokoban example (examples/qwen3-30BA3B-agentic_fsdp2/agentic_val_sokoban_30a3.yaml
with the examples/config/traj_envs.yaml its defaults pull in) trains two steps the same way: its
episodes come from seeds (hybrid/env_seeds.py) in hybrid's sokoban and frozen_lake environments,
with its reward normalisation, whitening and templates as written; only the model and sizes
change (its vLLM block_size 16, which CPU attention refuses, is dropped as a GPU setting at start)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.roll_helpers import ONE_DEVICE, REPO, kept_example, write_example

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RLVR_EXAMPLE = "examples/qwen3-30BA3B-rlvr_fsdp2/rlvr_config.yaml"


@pytest.fixture(scope="module")
def rlvr_run(tiny_model_dir, tmp_path_factory):
    """(the example file, its ROLL overrides for model, data and sizes)."""
    import pandas as pd

    from hybrid.arithmetic_task import write_arithmetic_parquet

    root = tmp_path_factory.mktemp("roll")
    assert not kept_example(RLVR_EXAMPLE)["defaults_files"]
    path = write_example(root, RLVR_EXAMPLE)
    files = write_arithmetic_parquet(root / "data", n_train=8, n_val=4, seed=4)
    data = {}
    for split in ("train", "val"):  # the example reads its prompts from a `messages` column
        data[split] = root / f"{split}.jsonl"
        pd.read_parquet(files[split]).rename(columns={"prompt": "messages"}).to_json(
            data[split], orient="records", lines=True
        )
    overrides = [
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        f"actor_train.data_args.file_name=[{data['train']}]",
        f"validation.data_args.file_name=[{data['val']}]",
        *ONE_DEVICE,
        "actor_infer.num_gpus_per_worker=1",
        "max_steps=2",
        "rollout_batch_size=4",
        "num_return_sequences_in_group=2",
        "prompt_length=64",
        "response_length=16",
        "eval_steps=0",
        "save_steps=0",
    ]
    return path, overrides


def _train(path: Path, overrides: list[str], out: Path) -> list[dict]:
    command = [sys.executable, "-m", "hybrid.main_ppo", "--roll-config", str(path), *overrides, f"output_dir={out}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "timing_s/step" in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert (out / "global_step_2" / "actor" / "huggingface").is_dir()  # ROLL saves the last step
    return steps


def test_roll_rlvr_example_as_written_skips_the_steps_its_masks_empty(rlvr_run, tmp_path):
    path, overrides = rlvr_run
    for step in _train(path, overrides, tmp_path / "run"):
        assert step["response_length/truncated_masked_ratio"] == 1.0  # no response ends within 16 tokens
        assert step["actor/difficulty_mask_ratio"] == 0.0  # every group scores 0: outside (0.1, 0.95)
        assert step["mask/final_mask_sum_eq_0"] == 1.0
        assert "actor/pg_loss" not in step  # nothing trained


def test_roll_rlvr_example_trains_two_steps_without_its_masks(rlvr_run, tmp_path):
    """Also an engine context shorter than prompt + response, as ROLL's ascend qwen3_8b example has:
    vLLM stops every response at max_model_len - its prompt (the prompts are 45 to 47 tokens)."""
    path, overrides = rlvr_run
    capped = ["prompt_length=48", "+actor_infer.strategy_args.strategy_config.max_model_len=56"]
    steps = _train(path, [*overrides, "max_len_mask=false", "difficulty_mask=false", *capped], tmp_path / "run")
    for step in steps:
        assert "mask/final_mask_sum_eq_0" not in step
        assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
        # no response ends (a random model), so each is 56 - its prompt long, below response_length=16
        assert step["response_length/max"] == 56 - step["prompt_length/min"] < 16
        assert step["response_length/min"] == 56 - step["prompt_length/max"]


AGENTIC_EXAMPLE = "examples/qwen3-30BA3B-agentic_fsdp2/agentic_val_sokoban_30a3.yaml"


@pytest.fixture(scope="module")
def agentic_run(tiny_model_dir, tmp_path_factory):
    """ROLL's agentic Sokoban example (and examples/config/traj_envs.yaml, which its defaults pull
    in), with its ROLL overrides for model and sizes: 2 environment groups of 2 episodes (validation:
    one of each of its four tags), 2 actions of at most 8 tokens each, an optimizer step of twice the
    batch (so every step adds copies of its episodes, as ROLL's adjust_batch)."""
    root = tmp_path_factory.mktemp("roll_agentic")
    assert "examples/config/traj_envs.yaml" in kept_example(AGENTIC_EXAMPLE)["defaults_files"]
    path = write_example(root, AGENTIC_EXAMPLE)
    overrides = [
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        *ONE_DEVICE,
        "actor_train.training_args.gradient_accumulation_steps=8",  # 8 samples a step: ROLL copies 4 of the 4
        "max_steps=2",
        "rollout_batch_size=4",
        "train_env_manager.num_env_groups=2",
        "train_env_manager.group_size=2",
        "train_env_manager.num_groups_partition=[2]",
        "max_actions_per_traj=2",
        "max_tokens_per_step=8",
        "+prompt_length=320",
        "sequence_length=512",
        "val_batch_size=4",
        "val_env_manager.num_env_groups=4",
        "val_env_manager.num_groups_partition=[1,1,1,1]",
        "eval_steps=2",
        "save_steps=0",
    ]
    return path, overrides


def test_roll_agentic_example_trains_two_steps_on_sokoban_episodes(agentic_run, tmp_path):
    path, overrides = agentic_run
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "hybrid.main_ppo",
        "--roll-config",
        str(path),
        *overrides,
        f"output_dir={out}",
        f"tracker_kwargs.log_dir={out / 'tf_log'}",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in records if "timing_s/step" in s]
    assert [s["step"] for s in steps] == [1, 2]
    # Validation (at step 0, as ROLL with eval_steps > 0, and at 2): one seed row per val tag, each its
    # environment's score for two turns without an answer: Sokoban 2 x (-0.1 - 0.15), FrozenLake 2 x -0.01
    validations = [r for r in records if "val-core/FrozenLake/reward/mean@1" in r]
    assert [r["step"] for r in validations] == [0, 2]
    for record in validations:
        for tag in ("SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab"):
            assert record[f"val-core/{tag}/reward/mean@1"] == pytest.approx(-0.5)
        assert record["val-core/FrozenLake/reward/mean@1"] == pytest.approx(-0.02)
    for step in steps:
        # 4 episodes (2 seed rows x group_size 2) of 2 model turns each, ended by the environment
        assert step["multi_turn/turns/mean"] == 2.0 and step["multi_turn/finish_reason/done"] == 1.0
        # an optimizer step of 8 samples (1 x 8 accumulation x 1 rank): ROLL's adjust_batch copies the 4 episodes
        assert step["batch_adjust/added"] == 4.0 and step["batch_adjust/removed"] == 0.0
        assert step["multi_turn/env/actions"] == 2.0 and step["multi_turn/observation_tokens/mean"] > 0
        # A random model writes no <answer>: each turn is SimpleSokoban's no-op step (-0.1) plus its
        # format_penalty (-0.15), so every episode scores 2 x -0.25, and that reaches the batch.
        assert step["multi_turn/env/action_is_valid"] == 0.0
        assert step["multi_turn/reward/mean"] == pytest.approx(-0.5)
        assert step["critic/rewards/mean"] == pytest.approx(-0.5) == step["critic/rewards/min"]
        # equal scores within each group: GRPO's advantages (whitened after, as the file asks) and so the
        # policy loss are 0, and finite
        assert step["actor/pg_loss"] == 0.0 and math.isfinite(step["actor/grad_norm"])
