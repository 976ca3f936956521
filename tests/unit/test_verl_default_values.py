"""verl's default values of keys hybrid used to refuse at them: `actor.use_torch_compile=true`
(ref follows the actor; the compiled entropy itself: tests/integration/test_compiled_entropy.py)
and `data.seed=null` (verl's RandomSampler with an unseeded torch.Generator: torch's default
seed, one fixed order; max_samples rows drawn from fresh entropy)."""

from __future__ import annotations

from types import SimpleNamespace

from hybrid.config import build_config
from hybrid.data import max_samples_indices
from hybrid.data_loader import RLSampler, create_rl_sampler

ARR = "actor_rollout_ref"
TORCH_DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val: a new torch.Generator()'s seed


def test_use_torch_compile_true_builds_for_actor_and_ref():
    arr = build_config([f"{ARR}.actor.use_torch_compile=true"]).actor_rollout_ref
    assert arr.actor.use_torch_compile is True and arr.ref.use_torch_compile is True  # ref follows the actor
    arr = build_config([f"{ARR}.ref.use_torch_compile=true"]).actor_rollout_ref
    assert arr.actor.use_torch_compile is False and arr.ref.use_torch_compile is True


def test_a_null_data_seed_shuffles_with_torchs_default_seed():
    data = build_config(["data.seed=null"]).data
    assert data.seed is None and data.shuffle
    sampler = create_rl_sampler(data, range(50))
    assert sampler.seed == TORCH_DEFAULT_SEED
    assert sampler.indices_for_epoch(0) == RLSampler(50, True, TORCH_DEFAULT_SEED).indices_for_epoch(0)
    assert sampler.indices_for_epoch(0) != list(range(50))
    assert create_rl_sampler(SimpleNamespace(shuffle=True, seed=4), range(50)).seed == 4


def test_a_null_data_seed_draws_max_samples_rows_at_random():
    # numpy's default_rng() without a seed, as verl's RLHFDataset: two draws of 8 of a million differ
    assert max_samples_indices(10**6, 8, True, None) != max_samples_indices(10**6, 8, True, None)
    assert max_samples_indices(10**6, 8, True, 3) == max_samples_indices(10**6, 8, True, 3)
