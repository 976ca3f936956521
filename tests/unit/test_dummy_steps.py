"""trainer.num_dummy_steps (SkyRL's full-context trainer, hybrid/dummy_steps.py): the dummy
batch's shapes, masks, rewards and seeding, the rules that refuse it where it cannot run, and the
SkyRL dialect's mapping of the key."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.dummy_steps import dummy_batch, dummy_generator


def _batch(seed: int = 1, step: int = 1, eos: int | None = 7):
    # 3 prompts x 2 samples, 5 prompt + 4 response tokens, a vocabulary of 50 ids
    return dummy_batch(3, 2, 5, 4, 50, eos, dummy_generator(seed, step), step)


def test_the_batch_is_max_length_rows_with_every_token_attended_and_trained():
    b = _batch()
    t = b.batch
    assert len(b) == 6
    assert t["prompts"].shape == (6, 5) and t["responses"].shape == (6, 4)
    assert t["input_ids"].shape == (6, 9)
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], dim=-1))
    assert t["attention_mask"].dtype == torch.long and bool((t["attention_mask"] == 1).all())
    assert t["response_mask"].shape == (6, 4) and bool((t["response_mask"] == 1).all())
    assert torch.equal(t["position_ids"], torch.arange(9).repeat(6, 1))
    assert int(t["input_ids"].min()) >= 0 and int(t["input_ids"].max()) < 50
    # every response ends with EOS (not truncated), the rest is drawn
    assert t["responses"][:, -1].tolist() == [7] * 6
    assert t["responses"][:, :-1].unique().numel() > 1
    # a uniform draw over 50 ids
    torch.testing.assert_close(t["rollout_log_probs"], torch.full((6, 4), -math.log(50)))


def test_samples_of_a_prompt_share_its_tokens_and_uid():
    b = _batch()
    prompts, uids = b.batch["prompts"], b.non_tensor_batch["uid"].tolist()
    assert uids == ["dummy-1-0", "dummy-1-0", "dummy-1-1", "dummy-1-1", "dummy-1-2", "dummy-1-2"]
    for group in range(3):
        assert torch.equal(prompts[2 * group], prompts[2 * group + 1])
    assert not torch.equal(prompts[0], prompts[2])
    # responses are drawn per sample
    assert not torch.equal(b.batch["responses"][0], b.batch["responses"][1])


def test_rewards_are_zero_but_a_coin_on_the_last_token():
    scores = _batch().batch["token_level_scores"]
    assert scores.shape == (6, 4) and bool((scores[:, :-1] == 0).all())
    assert set(scores[:, -1].tolist()) <= {0.0, 1.0}
    # over many rows both outcomes occur
    many = dummy_batch(64, 1, 1, 2, 10, None, dummy_generator(1, 1)).batch["token_level_scores"][:, -1]
    assert set(many.tolist()) == {0.0, 1.0}


def test_seeded_by_trainer_seed_and_step():
    a, b = _batch(seed=3, step=2), _batch(seed=3, step=2)
    for key in ("input_ids", "token_level_scores"):
        assert torch.equal(a.batch[key], b.batch[key])
    assert not torch.equal(a.batch["input_ids"], _batch(seed=3, step=1).batch["input_ids"])
    assert not torch.equal(a.batch["input_ids"], _batch(seed=4, step=2).batch["input_ids"])


def test_without_an_eos_token_the_last_response_token_is_drawn_too():
    t = _batch(eos=None).batch
    assert torch.equal(t["responses"][:, :3], _batch().batch["responses"][:, :3])
    assert t["responses"][:, -1].unique().numel() > 1


def _problems(*overrides: str) -> str:
    from hybrid.config import ConfigError, build_config

    with pytest.raises(ConfigError) as info:
        build_config(list(overrides))
    return str(info.value)


def test_refused_with_val_only_and_without_the_fused_engine():
    assert (
        "trainer.num_dummy_steps=2 with trainer.val_only=true: one runs only dummy steps, the other only validation; "
        "set trainer.num_dummy_steps=0 or trainer.val_only=false"
    ) in _problems("trainer.num_dummy_steps=2", "trainer.val_only=true")
    assert (
        "trainer.num_dummy_steps=2 runs on the fused trainer only: set actor_rollout_ref.hybrid_engine=true "
        "(SkyRL: trainer.placement.colocate_all=true) for the dummy run"
    ) in _problems(
        "trainer.num_dummy_steps=2",
        "actor_rollout_ref.hybrid_engine=false",
        "rollout.n_gpus_per_node=1",
        "trainer.n_gpus_per_node=1",
    )
    assert "trainer.num_dummy_steps=-1 must be an integer >= 0" in _problems("trainer.num_dummy_steps=-1")


def test_skyrl_key_maps_to_hybrids_and_zero_is_refused():
    from hybrid.config import ConfigError
    from hybrid.dialects import translate_argv

    argv = translate_argv(["--dialect", "skyrl", "trainer.num_dummy_steps=5"])
    assert "trainer.num_dummy_steps=5" in argv
    with pytest.raises(ConfigError) as info:
        translate_argv(["--dialect", "skyrl", "trainer.num_dummy_steps=0"])
    assert "full-context trainer with no dummy step runs nothing at all; give N >= 1" in str(info.value)
