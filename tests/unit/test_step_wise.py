"""Step-wise trajectories (workers/rollout/step_wise.py, hybrid/step_wise.py), against values
worked out by hand: a trajectory cut into one sample per model turn (prompts, responses, masks,
rewards for both placements, the response cut), the samples joined to their prompts' rows, the
padding prompts' samples dropped, the last turn's GRPO advantage on every turn of its trajectory
(also after the rows were reordered), the mini-batches of whole prompts with their dummy rows,
and the keys refused with step-wise at start."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybrid.batch_ops import compute_advantage
from hybrid.config import ConfigError, build_config
from hybrid.step_wise import (
    TRAJECTORY,
    broadcast_last_step_advantages,
    drop_trajectories,
    join_steps,
    last_steps,
    step_wise_mini_batches,
)
from protocol.data_proto import DataProto
from workers.optimizer_step import MINI_BATCH_ROWS
from workers.rollout.multi_turn import Trajectory
from workers.rollout.step_wise import STEP_WISE_LAST, Steps, trajectory_index, turn_samples

MT = "actor_rollout_ref.rollout.multi_turn"


def _two_turns() -> Trajectory:
    """Turn 1: tokens 10, 11 (reward 0.5 on 11), then an observation 30, 31, 32; turn 2 continues
    the re-rendered history [1, 2, 7, 8, 9]: tokens 12, 13, 14 (reward 1.0 on 14)."""
    return Trajectory(
        row=0,
        sample=1,
        prompt_ids=[1, 2],
        response_ids=[10, 11, 30, 31, 32, 12, 13, 14],
        mask=[1, 1, 0, 0, 0, 1, 1, 1],
        log_probs=[-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4, -0.5],
        rewards=[(1, 0.5), (7, 1.0)],
        turns=2,
        steps=Steps(history=[], prompt=[1, 2, 7, 8, 9], prompts=[[1, 2], [1, 2, 7, 8, 9]], starts=[0, 5]),
    )


def test_a_trajectory_is_a_sample_per_turn_with_its_own_reward():
    first, second = turn_samples(_two_turns(), [1, 2], length=8, placement="turn")
    assert (first.prompt_ids, first.response_ids, first.mask) == ([1, 2], [10, 11, 30, 31, 32], [1, 1, 0, 0, 0])
    assert first.log_probs == [-0.1, -0.2, 0.0, 0.0, 0.0]
    assert (first.rewards, first.last_model_position) == ([(1, 0.5)], 1)
    assert (second.prompt_ids, second.response_ids, second.mask) == ([1, 2, 7, 8, 9], [12, 13, 14], [1, 1, 1])
    assert (second.rewards, second.last_model_position) == ([(2, 1.0)], 2)
    assert first.prompt_rendered and second.prompt_rendered


def test_final_placement_puts_the_summed_reward_on_the_last_turn_and_responses_are_cut():
    first, second = turn_samples(_two_turns(), [1, 2], length=4, placement="final")
    assert first.rewards == [] and second.rewards == [(2, 1.5)]
    assert first.response_ids == [10, 11, 30, 31] and first.mask == [1, 1, 0, 0]  # cut to the response width


def test_a_trajectory_without_turns_is_one_empty_sample_and_unrecorded_turns_are_refused():
    empty = Trajectory(row=3, sample=0, finish="error")
    (only,) = turn_samples(empty, [5, 6, 7], length=8, placement="turn")
    assert (only.prompt_ids, only.response_ids, only.rewards) == ([5, 6, 7], [], [])
    with pytest.raises(ValueError, match="ran 2 model turns without recording them"):
        turn_samples(Trajectory(row=0, sample=0, turns=2), [1], length=8, placement="turn")


def test_trajectory_index_from_the_last_turn_flags():
    last = torch.tensor([False, True, True, False, False, True])
    assert trajectory_index(last).tolist() == [0, 0, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="the last sample does not end a trajectory"):
        trajectory_index(torch.tensor([True, False]))


def _samples(last: list[bool], scores: list[float], masks: list[list[int]]) -> DataProto:
    """Step samples: score s on the last position of each row's response, its mask as given."""
    width = len(masks[0])
    rewards = torch.zeros(len(last), width)
    rewards[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(
        tensors={
            STEP_WISE_LAST: torch.tensor(last),
            "token_level_rewards": rewards,
            "response_mask": torch.tensor(masks),
            "attention_mask": torch.ones(len(last), 2, dtype=torch.long),
        },
        non_tensors={"multi_turn_turns": np.array([0] * len(last), dtype=object)},
        meta_info={"n": 2},
    )


# Prompts a and b, two trajectories each: a0 2 turns, a1 1, b0 3, b1 1. The last turns score 1, 0, 2, 4;
# the earlier turns score 5, which the advantages must ignore.
LAST = [False, True, True, False, False, True, True]
SCORES = [5.0, 1.0, 0.0, 5.0, 5.0, 2.0, 4.0]
MASKS = [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]]


def _joined() -> DataProto:
    rows = DataProto.from_dict(non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)})
    batch, metrics = join_steps(rows, _samples(LAST, SCORES, MASKS))
    assert metrics == {
        "step_wise/samples": 7.0,
        "step_wise/trajectories": 4.0,
        "step_wise/samples_per_trajectory/mean": 1.75,
        "step_wise/samples_per_trajectory/max": 3.0,
    }
    return batch


def test_samples_join_their_prompt_rows_and_trajectories():
    batch = _joined()
    assert list(batch.non_tensor_batch["uid"]) == ["a", "a", "a", "b", "b", "b", "b"]
    assert list(batch.non_tensor_batch[TRAJECTORY]) == [0, 0, 1, 2, 2, 2, 3]
    rows = DataProto.from_dict(non_tensors={"uid": np.array(["a", "a", "b"], dtype=object)})
    with pytest.raises(ValueError, match="4 trajectories came back for 3 prompt rows"):
        join_steps(rows, _samples(LAST, SCORES, MASKS))


def test_padding_trajectories_are_dropped_and_last_steps_kept():
    samples = _samples(LAST, SCORES, MASKS)
    assert drop_trajectories(samples, 2).batch["token_level_rewards"][:, -1].tolist() == [5.0, 1.0, 0.0]
    assert drop_trajectories(samples, 0) is samples
    assert last_steps(samples).batch["token_level_rewards"][:, -1].tolist() == [1.0, 0.0, 2.0, 4.0]


GRPO = SimpleNamespace(adv_estimator="grpo", norm_adv_by_std_in_grpo=True)
# GRPO over the last turns: a (1, 0): mean 0.5, unbiased std sqrt(0.5); b (2, 4): mean 3, std sqrt(2).
A = 0.5 / (math.sqrt(0.5) + 1e-6)
B = 1.0 / (math.sqrt(2.0) + 1e-6)
PER_TRAJECTORY = [A, A, -A, -B, -B, -B, B]  # each sample: its trajectory's last-turn advantage


def test_the_last_turns_grpo_advantage_goes_to_every_turn_of_its_trajectory():
    batch = _joined()
    broadcast_last_step_advantages(batch, lambda last: compute_advantage(last, GRPO))
    expected = torch.tensor(PER_TRAJECTORY).unsqueeze(-1) * torch.tensor(MASKS, dtype=torch.float32)
    torch.testing.assert_close(batch.batch["advantages"], expected)
    torch.testing.assert_close(batch.batch["returns"], expected)  # GRPO's returns are its advantages


def test_the_broadcast_follows_the_trajectory_column_after_a_reorder():
    batch = _joined()
    order = [6, 2, 4, 0, 5, 1, 3]
    batch.reorder(torch.tensor(order))
    broadcast_last_step_advantages(batch, lambda last: compute_advantage(last, GRPO))
    expected = torch.tensor([PER_TRAJECTORY[i] for i in order]).unsqueeze(-1) * torch.tensor(
        [MASKS[i] for i in order], dtype=torch.float32
    )
    torch.testing.assert_close(batch.batch["advantages"], expected)


def _prompts(uids: list[str]) -> DataProto:
    rows = len(uids)
    lengths = list(range(rows + 1, 1, -1))  # row i is the (i+1)-th longest
    attention = torch.tensor([[1] * n + [0] * (rows + 1 - n) for n in lengths])
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(rows).unsqueeze(-1),  # row i holds i
            "attention_mask": attention,
            "response_mask": torch.ones(rows, 2, dtype=torch.long),
        },
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def test_mini_batches_hold_whole_prompts_padded_to_the_largest():
    # Prompts a (3 samples), b (1), c (4), d (1); 2 prompts per mini-batch: {0..3} and {4..8}.
    batch = _prompts(["a", "a", "a", "b", "c", "c", "c", "c", "d"])
    laid_out, dummies = step_wise_mini_batches(batch, prompts_per_mini_batch=2, data_parallel=2)
    # 5 rows at most -> 3 rows per group; longest first, dealt to the groups in turn; dummies copy row 0 / row 4.
    assert laid_out.batch["input_ids"][:, 0].tolist() == [0, 2, 0, 4, 6, 8, 1, 3, 0, 5, 7, 4]
    dummy = [False, False, True, False, False, False, False, False, True, False, False, True]
    assert (laid_out.batch["response_mask"].sum(-1) == 0).tolist() == dummy
    assert dummies == 3 and laid_out.meta_info[MINI_BATCH_ROWS] == 3
    assert batch.batch["response_mask"].all()  # the caller's rows keep their mask


def test_mini_batch_rows_per_group_split_over_sequence_parallel_ranks():
    batch = _prompts(["a", "a", "a", "b", "c", "c", "c", "c", "d"])
    laid_out, dummies = step_wise_mini_batches(batch, prompts_per_mini_batch=2, data_parallel=2, sequence_parallel=2)
    assert laid_out.meta_info[MINI_BATCH_ROWS] == 4 and len(laid_out) == 16 and dummies == 7
    # Group 0's block (ranks 0 and 1, 8 rows) holds its share of mini-batch 0, then of mini-batch 1.
    assert laid_out.batch["input_ids"][:8, 0].tolist() == [0, 2, 0, 0, 4, 6, 8, 4]


SKYRL_LIKE = [
    f"{MT}.enable=true",
    f"{MT}.env_class=arithmetic_retry",
    f"{MT}.step_wise_trajectories=true",
    "algorithm.adv_estimator=grpo",
]


def test_step_wise_with_an_outcome_estimator_is_accepted():
    assert build_config(SKYRL_LIKE).actor_rollout_ref.rollout.multi_turn.step_wise_trajectories is True


REFUSED = {
    f"{MT}.use_conversation_multi_turn=false": "rendered with the chat template before every turn",
    "algorithm.adv_estimator=gae": "this estimator needs per-token values and returns",
    "algorithm.filter_groups.enable=true": "algorithm.filter_groups.enable=True with",
    "actor_rollout_ref.actor.shuffle=true": "a mini-batch holds the samples of whole prompts",
    "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean": "GMPO averages its loss over a micro-batch's rows",
    "algorithm.rollout_correction.rollout_is=token": "its metrics count rows whatever their mask",
    "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent": "only the environment_agent",
}


def test_keys_that_do_not_combine_with_step_wise_are_refused_each_in_one_line():
    with pytest.raises(ConfigError) as err:
        build_config([*SKYRL_LIKE, *REFUSED])
    lines = [line for line in str(err.value).splitlines() if f"with {MT}.step_wise_trajectories=true" in line]
    for extra, reason in REFUSED.items():
        assert [line for line in lines if reason in line], (extra, str(err.value))
    assert "it counts a prompt's n rows, and a prompt has a sample per turn" in str(err.value)
    with pytest.raises(ConfigError) as err:
        build_config([*SKYRL_LIKE, f"{MT}.enable=false"])
    assert f"splits episodes into their model turns: set {MT}.enable=true" in str(err.value)
