"""Episodes from seeds (hybrid/env_seeds.py) and ROLL's agentic env managers mapped onto them
(hybrid/dialects/roll_episodes.py): the spec's rows, the data loader reading a spec, and ROLL's
agentic Sokoban example (tests/data/peer_examples/roll.json) translated: batches in groups,
per-tag settings, its grid vocabulary reaching the environment, and what is refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from hybrid.config import ConfigError, build_config
from hybrid.data import read_rows
from hybrid.dialects import translate_argv
from hybrid.env_seeds import make_spec, parse_spec, spec_rows
from reward.environments import EnvFactory
from tests.integration.roll_helpers import ONE_DEVICE, write_example

EXAMPLE = "examples/qwen3-30BA3B-agentic_fsdp2/agentic_val_sokoban_30a3.yaml"
MT = "actor_rollout_ref.rollout.multi_turn"


def test_spec_rows_follow_the_groups_and_seed():
    spec = make_spec([("sokoban", "Small", 1), ("frozen_lake", "Lake", 2)], rows=6, seed=7)
    assert spec == "env-seeds:rows=6&seed=7&groups=sokoban/Small*1,frozen_lake/Lake*2"
    assert parse_spec(spec) == ([("sokoban", "Small", 1), ("frozen_lake", "Lake", 2)], 6, 7)
    rows = spec_rows(spec)
    # row i belongs to group i mod 3: Small, Lake, Lake, Small, Lake, Lake
    assert [r["tag"] for r in rows] == ["Small", "Lake", "Lake"] * 2
    assert [r["env_class"] for r in rows[:3]] == ["sokoban", "frozen_lake", "frozen_lake"]
    assert rows == spec_rows(spec) and len({r["seed"] for r in rows}) == 6  # repeatable, distinct
    assert [r["seed"] for r in spec_rows(make_spec([("sokoban", "Small", 1)], 6, 8))] != [r["seed"] for r in rows]
    assert rows[0]["data_source"] == "Small" and rows[0]["extra_info"] == {
        "index": 0,
        "tag": "Small",
        "seed": rows[0]["seed"],
    }
    assert read_rows(spec) == rows  # the data loader reads a spec as its rows
    with pytest.raises(ValueError, match=r"group 'sokoban\*2' is not env/tag\*count"):
        parse_spec("env-seeds:rows=2&seed=1&groups=sokoban*2")


@pytest.fixture
def example(tmp_path) -> Path:
    return write_example(tmp_path, EXAMPLE)


SIZES = [
    *ONE_DEVICE,
    "actor_train.training_args.gradient_accumulation_steps=128",  # one optimizer step: 16 groups of 8
    "max_steps=3",
]


def overrides(path: Path, *extra: str) -> dict:
    out = {}
    for item in translate_argv(["--roll-config", str(path), *SIZES, *extra]):
        key, _, value = item.partition("=")
        out[key] = value
    return out


def test_agentic_example_episodes_become_seed_rows(example):
    out = overrides(example)
    # 16 groups of 8 per step, 3 steps; validation 128 groups of 1 split 32/32/32/32 over four tags
    assert out["data.train_files"] == "'env-seeds:rows=48&seed=42&groups=sokoban/SimpleSokoban*16'"
    assert out["data.train_batch_size"] == "16" and out["actor_rollout_ref.rollout.n"] == "8"
    assert out["data.val_batch_size"] == "128" and out["actor_rollout_ref.rollout.val_kwargs.n"] == "1"
    val = out["data.val_files"].strip("'")
    assert Counter(r["tag"] for r in spec_rows(val)) == {
        "SimpleSokoban": 32,
        "LargerSokoban": 32,
        "SokobanDifferentGridVocab": 32,
        "FrozenLake": 32,
    }
    assert f"{MT}.env_class" not in out  # each row names its environment
    assert out[f"{MT}.env_kwargs.tags.LargerSokoban.dim_room"] == "[10,10]"
    assert out[f"{MT}.env_kwargs.tags.FrozenLake.format_penalty"] == "-0.01"
    assert out[f"{MT}.env_kwargs.tags.SimpleSokoban.max_tokens_per_step"] == "64"  # the file's override of 128
    assert not any(".FrozenLakeThink." in key for key in out)  # no env manager lists it
    # reward_normalization mean_std per traj_group_id, grpo, whiten_advantages: hybrid's grpo, whitened after
    assert out["algorithm.adv_estimator"] == "'grpo'" and out["algorithm.norm_adv_by_std_in_grpo"] == "true"
    assert out["algorithm.whiten_advantages"] == "true"
    assert overrides(example, "whiten_advantages=false")["algorithm.whiten_advantages"] == "false"


def test_a_validation_row_plays_its_tags_settings(example):
    argv = ["--roll-config", str(example), *SIZES]
    cfg = build_config(translate_argv(argv))
    rows = read_rows(cfg.data.val_files if isinstance(cfg.data.val_files, str) else cfg.data.val_files[0])
    row = next(r for r in rows if r["tag"] == "SokobanDifferentGridVocab")
    env = EnvFactory(cfg.actor_rollout_ref.rollout.multi_turn).make(row)
    messages, _ = env.init(row["prompt"])
    board = env.render_board()
    assert set(board) <= set("W.GCBA@\n") and ("A" in board or "@" in board)
    assert "W: wall, .: empty, G: target" in messages[1]["content"]
    assert (
        "You have 10 actions left" in messages[1]["content"]
        and "Max response length: 64 words" in messages[1]["content"]
    )
    assert messages[0]["content"].startswith("You're a helpful assistant. You are a good game player.")


@pytest.mark.parametrize(
    "extra, reason",
    [
        (["train_env_manager.group_size=1", "rollout_batch_size=16"], "ROLL zeroes each normalised score"),
        (["rollout_batch_size=12"], "rollout_batch_size=12 trajectories is not a whole number of groups"),
        (["train_env_manager.num_groups_partition=[8]"], "gives 8 groups, not num_env_groups=16"),
        (["val_batch_size=96"], "not divisible by val_env_manager's num_env_groups x group_size = 128"),
        (["train_env_manager.tags=[Missing]"], "no custom_envs section for Missing"),
    ],
)
def test_agentic_example_refusals(example, extra, reason):
    with pytest.raises(ConfigError) as err:
        translate_argv(["--roll-config", str(example), *SIZES, *extra])
    assert reason in str(err.value), str(err.value)


def test_whiten_advantages_after_grpo_by_hand():
    import numpy as np
    import torch

    from hybrid.batch_ops import clip_rewards_and_advantages
    from protocol.data_proto import DataProto

    # Two groups of two: scores (3, 1) and (0, 0). GRPO: (1/std, -1/std) with std = sqrt(2), and 0, 0.
    # Tokens (mask): 2 + 1 + 2 + 1 = 6 with values a, a, -a, 0, 0, 0 for a = 1/sqrt(2); whitened over
    # them (mean a/6, unbiased variance) as ROLL's masked_whiten, then masked, then clamped to [-1, 1].
    scores = torch.tensor([[0.0, 3.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
    batch = DataProto.from_dict(
        {"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    algorithm = build_config(["algorithm.whiten_advantages=true", "algorithm.advantage_clip=1.0"]).algorithm
    clip_rewards_and_advantages(batch, algorithm, {})
    a = 1 / 2**0.5
    values = torch.tensor([a, a, -a, 0.0, 0.0, 0.0], dtype=torch.float64)
    mean, var = values.mean(), values.var(unbiased=True)
    white = (torch.tensor([[a, a], [-a, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64) - mean) / (
        var + 1e-8
    ).sqrt()
    expected = (white * mask).clamp(-1, 1).float()
    torch.testing.assert_close(batch.batch["advantages"], expected, atol=1e-5, rtol=1e-5)
    assert float(expected[0, 0]) > 0.9 and float(expected[1, 0]) == -1.0  # the clamp bound the negative one


def test_optimizer_step_batch_counts_data_parallel_ranks(example):
    # ROLL's FSDP2 data-parallel size is devices / ulysses_size: 1 x 128 x (2 / 2) = 128 samples = 16 groups of 8
    two = ["actor_train.device_mapping=[0,1]", "reference.device_mapping=[0,1]", "actor_infer.device_mapping=[0,1]"]
    ulysses = ["actor_train.model_args.ulysses_size=2", "reference.model_args.ulysses_size=2"]
    assert overrides(example, *two, *ulysses)["actor_rollout_ref.actor.ppo_mini_batch_size"] == "16"
    assert overrides(example, *two)["actor_rollout_ref.actor.ppo_mini_batch_size"] == "32"


def test_a_gpu_block_size_is_dropped_without_cuda(monkeypatch):
    from hybrid.config.foreign_keys import VLLM_BLOCK, rewrite_overrides

    monkeypatch.setattr("workers.device.is_cuda_available", lambda: False)
    kept, note, problems = rewrite_overrides([f"{VLLM_BLOCK}=16", "data.train_batch_size=4"])
    assert kept == ["data.train_batch_size=4"] and problems == []
    assert note.startswith(f"accepted with no effect on this hardware: {VLLM_BLOCK}=16: vLLM's KV-cache paging block")
    assert rewrite_overrides([f"{VLLM_BLOCK}=64"])[0] == [f"{VLLM_BLOCK}=64"]  # a size CPU attention takes
    monkeypatch.setattr("workers.device.is_cuda_available", lambda: True)
    assert rewrite_overrides([f"{VLLM_BLOCK}=16"])[0] == [f"{VLLM_BLOCK}=16"]  # a GPU engine takes it
