"""Small pieces of the workers: the role enum, the mini-batch arithmetic, micro-batch index
lists, and `on_device` moving parameters and optimizer state only as the section's offload
switches say (and always back to the host, also when the call raises)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import workers.fsdp_utils as fsdp_utils
from workers.config import mini_batch_samples_per_rank
from workers.config.batching import MicroBatching
from workers.micro_batch import micro_batch_indices
from workers.roles import Role


def test_role_parses_verl_strings_and_names_what_it_holds():
    assert Role.parse("actor_rollout_ref") is Role.ACTOR_ROLLOUT_REF and Role.parse(Role.ACTOR) is Role.ACTOR
    holds = {r: (r.has_actor, r.has_rollout, r.has_ref) for r in Role}
    assert holds == {
        Role.ACTOR: (True, False, False),
        Role.ROLLOUT: (False, True, False),
        Role.REF: (False, False, True),
        Role.ACTOR_ROLLOUT: (True, True, False),
        Role.ACTOR_ROLLOUT_REF: (True, True, True),
        Role.ACTOR_REF: (True, False, True),
    }
    with pytest.raises(
        ValueError,
        match=r"role='critic' is not one of actor, rollout, ref, actor_rollout, actor_rollout_ref, actor_ref",
    ):
        Role.parse("critic")


def test_mini_batch_samples_per_rank_counts_prompts_times_n_over_ranks():
    assert mini_batch_samples_per_rank(8, 4, 1) == 32  # the default job: 8 prompts x 4 responses
    assert mini_batch_samples_per_rank(8, 4, 2) == 16
    assert mini_batch_samples_per_rank(1, 1, 4) == 1  # never zero


def test_micro_batch_indices_by_count_and_by_token_budget():
    mask = torch.tensor([[1] * 5 + [0] * 5, [1] * 10, [1] * 2 + [0] * 8, [1] * 7 + [0] * 3])
    assert micro_batch_indices(mask, MicroBatching(3, False, 0), world_size=1) == [[0, 1, 2], [3]]
    groups = micro_batch_indices(mask, MicroBatching(None, True, 12), world_size=1)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    assert all(mask[g].sum() <= 12 for g in groups)


class _Moves:
    """Stands in for the device moves: records them (on CPU the real ones are no-ops)."""

    def __init__(self, monkeypatch):
        self.log = []
        for name in ("load_params", "offload_params", "load_optimizer", "offload_optimizer"):
            monkeypatch.setattr(fsdp_utils, name, lambda obj, name=name: self.log.append(name))


def _fsdp(params: bool, optimizer: bool):
    return SimpleNamespace(param_offload=params, optimizer_offload=optimizer)


def test_on_device_moves_only_what_the_switches_say(monkeypatch):
    moves = _Moves(monkeypatch)
    module, optimizer = torch.nn.Linear(2, 2), object()
    with fsdp_utils.on_device(module, _fsdp(True, True), optimizer):
        assert moves.log == ["load_params", "load_optimizer"]
    assert moves.log[2:] == ["offload_optimizer", "offload_params"]
    moves.log.clear()
    with fsdp_utils.on_device(module, _fsdp(True, True)):  # no optimizer asked for
        pass
    assert moves.log == ["load_params", "offload_params"]
    moves.log.clear()
    with fsdp_utils.on_device(module, _fsdp(False, False), optimizer):
        pass
    assert moves.log == []
    # A section without optimizer state (reference policy, reward model) has no optimizer_offload key.
    with fsdp_utils.on_device(module, SimpleNamespace(param_offload=False)):
        pass


def test_on_device_puts_state_back_when_the_call_raises(monkeypatch):
    moves = _Moves(monkeypatch)
    with pytest.raises(RuntimeError, match="boom"):
        with fsdp_utils.on_device(torch.nn.Linear(2, 2), _fsdp(True, True), object()):
            raise RuntimeError("boom")
    assert moves.log == ["load_params", "load_optimizer", "offload_optimizer", "offload_params"]


@pytest.mark.parametrize(
    ("setting", "n", "remove_padding", "shared"),
    [
        (None, 4, True, True),
        (None, 1, True, False),
        (None, 4, False, False),
        (True, 1, False, True),
        (True, 4, False, True),
        (False, 4, True, False),
    ],
)
def test_prompt_once_packing_is_on_by_default_where_rows_are_packed_and_prompts_repeat(
    setting, n, remove_padding, shared
):
    from workers.config import shares_prompts

    assert shares_prompts(setting, n, remove_padding) is shared
