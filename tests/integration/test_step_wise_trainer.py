"""One step-wise GRPO step (`multi_turn.step_wise_trajectories`) on the tiny random model with the
lock-step loop and the HF engine, with an environment of one or two turns: the batch holds one
sample per model turn; each sample's prompt is the chat history rendered again by the chat
template (the prompt's messages, the model's earlier turns decoded, the observations); each
trajectory's samples share one advantage, GRPO's over the prompt's last turns worked out here
from the decoded last answers; the update's mini-batches hold the samples of whole prompts."""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration import step_wise_env
from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration

MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith_sw"), n_train=16, n_val=4, seed=7)


def _rows(batch, i: int, tokenizer):
    """Sample i: its prompt tokens, its model tokens, the text of its model tokens."""
    width = batch.batch["prompts"].shape[1]
    prompt = batch.batch["prompts"][i][batch.batch["attention_mask"][i, :width].bool()].tolist()
    model = batch.batch["responses"][i][batch.batch["response_mask"][i].bool()].tolist()
    return prompt, model, tokenizer.decode(model, skip_special_tokens=True)


def test_one_step_wise_grpo_step(tiny_model_dir, arithmetic_files, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from hybrid.step_wise import TRAJECTORY
    from hybrid.trainer import PPOTrainer
    from workers.optimizer_step import MINI_BATCH_ROWS
    from workers.rollout.multi_turn import render_prompt_ids
    from workers.rollout.step_wise import STEP_WISE_LAST

    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path / "run",
        "algorithm.adv_estimator=grpo",
        "data.max_response_length=16",
        "trainer.total_training_steps=1",
        f"{MT}.enable=true",
        f"{MT}.env_class={step_wise_env.__file__}:OneOrTwoTurnsEnv",
        f"{MT}.max_assistant_turns=2",
        f"{MT}.max_tokens_per_turn=6",
        f"{MT}.reward_placement=turn",
        f"{MT}.step_wise_trajectories=true",
    )
    seen = {}
    update_step, padded = PPOTrainer.update_step, PPOTrainer._padded

    def recording_update(self, batch, metrics, timing):
        seen["batch"] = update_step(self, batch, metrics, timing)
        return seen["batch"]

    def recording_padded(self, batch, section, role, metrics):
        seen[role] = padded(self, batch, section, role, metrics)
        return seen[role]

    monkeypatch.setattr(PPOTrainer, "update_step", recording_update)
    monkeypatch.setattr(PPOTrainer, "_padded", recording_padded)
    out = train(cfg)
    batch, metrics = seen["batch"], out["history"][-1]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    # One sample per model turn: 4 prompts x 2 trajectories, each of 1 or 2 turns.
    last = batch.batch[STEP_WISE_LAST].tolist()
    turns = [t for t, is_last in zip(batch.non_tensor_batch["multi_turn_turns"], last) if is_last]
    assert len(turns) == 8 and set(turns) <= {1, 2} and len(batch) == sum(turns)
    assert 1 in turns and 2 in turns, turns  # a batch of a varying number of samples per prompt
    assert metrics["step_wise/samples"] == len(batch) and metrics["step_wise/trajectories"] == 8
    assert metrics["multi_turn/turns/mean"] == pytest.approx(sum(turns) / 8)  # per trajectory

    trajectories: dict[int, list[int]] = {}
    for i, t in enumerate(batch.non_tensor_batch[TRAJECTORY]):
        trajectories.setdefault(int(t), []).append(i)
    finals: dict[int, float] = {}
    for rows in trajectories.values():
        assert [last[i] for i in rows] == [False] * (len(rows) - 1) + [True]
        # Each turn continues the history rendered again: messages, earlier answers, observations.
        history = [dict(m) for m in batch.non_tensor_batch["raw_prompt"][rows[0]]]
        for i in rows:
            prompt, model, text = _rows(batch, i, tokenizer)
            assert prompt == render_prompt_ids(tokenizer, history), i
            history += [{"role": "assistant", "content": text}, {"role": "user", "content": step_wise_env.AGAIN}]
        finals[rows[-1]] = step_wise_env.last_turn_reward(_rows(batch, rows[-1], tokenizer)[2])
        # The environment's reward of each turn is on that turn's last model token.
        for i in rows:
            reward = batch.batch["token_level_scores"][i].sum().item()
            expected = finals[rows[-1]] if i == rows[-1] else step_wise_env.EARLIER_REWARD
            assert reward == pytest.approx(expected), i

    # GRPO over each prompt's last turns (earlier turns' 0.25 ignored), by hand; the same on every turn.
    by_uid: dict[str, list[int]] = {}
    for i in finals:
        by_uid.setdefault(batch.non_tensor_batch["uid"][i], []).append(i)
    varied = 0
    for group in by_uid.values():
        a, b = (finals[i] for i in group)
        std = abs(a - b) / math.sqrt(2)
        for i, score in zip(group, (a, b)):
            expected = (score - (a + b) / 2) / (std + 1e-6)
            varied += expected != 0
            for j in trajectories[int(batch.non_tensor_batch[TRAJECTORY][i])]:
                mask = batch.batch["response_mask"][j].bool()
                values = batch.batch["advantages"][j][mask]
                torch.testing.assert_close(values, torch.full_like(values, expected), rtol=0, atol=1e-5)
                assert not batch.batch["advantages"][j][~mask].any()
    assert varied, finals  # at least one group whose advantages are not all 0

    # ppo_mini_batch_size=2 of 4 prompts: 2 mini-batches of 2 whole prompts each, padded alike.
    update = seen["actor"]
    rows_per_mini = update.meta_info[MINI_BATCH_ROWS]
    assert len(update) == 2 * rows_per_mini
    real = update.batch["response_mask"].any(-1).tolist()
    assert sum(real) == int(batch.batch["response_mask"].any(-1).sum())
    assert metrics["actor/dummy_rows"] == len(update) - sum(real)
    for m in range(2):
        part = range(m * rows_per_mini, (m + 1) * rows_per_mini)
        assert len({update.non_tensor_batch["uid"][i] for i in part if real[i]}) == 2
