"""`actor_rollout_ref.rollout.calculate_log_probs=false` (verl's default, SkyRL's
`generator.sampling_params.logprobs=null`): accepted, and each setting that reads the engine's
log-probs is refused at start with its key (hybrid/config/rules_log_probs.py)."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError, load_config, validate_config
from hybrid.config.rules_log_probs import drop_unrequested, log_prob_readers
from protocol.data_proto import DataProto

OFF = "actor_rollout_ref.rollout.calculate_log_probs=false"
TAIL = ": that reads the engine's log-probs (rollout_log_probs), which are then not kept; set calculate_log_probs=true"


def test_off_without_readers_validates_and_hybrids_default_stays_on():
    assert load_config([]).actor_rollout_ref.rollout.calculate_log_probs is True
    validate_config(load_config([OFF]))


@pytest.mark.parametrize(
    "reader, named",
    [
        ("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is='token'"),
        (
            "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
            "algorithm.rollout_correction.rollout_rs='seq_mean_k1'",
        ),
        ("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.bypass_mode=true"),
        ("actor_rollout_ref.actor.tis_imp_ratio_cap=2.0", "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"),
        (
            "async_training.mode=one_step_off",
            "async_training.mode=one_step_off and use_rollout_log_probs=true (the loss's anchor; "
            "use_rollout_log_probs=false computes old log-probs instead)",
        ),
    ],
)
def test_each_reader_of_the_engines_log_probs_is_refused_with_it(reader, named):
    with pytest.raises(ConfigError) as err:
        validate_config(load_config([OFF, reader]))
    assert f"  - actor_rollout_ref.rollout.calculate_log_probs=false with {named}{TAIL}" in str(err.value).splitlines()


def test_asynchronous_training_with_its_own_old_log_probs_needs_none():
    for anchor in ("async_training.use_rollout_log_probs=false", "async_training.compute_prox_log_prob=true"):
        cfg = load_config([OFF, "async_training.mode=one_step_off", anchor])
        assert log_prob_readers(cfg) == [], anchor
    assert log_prob_readers(load_config([OFF, "async_training.mode=one_step_off"]))


def test_skyrls_logprobs_null_is_calculate_log_probs_false():
    from hybrid.dialects import translate_argv

    argv = ["--dialect", "skyrl", "trainer.policy.model.path=/m", "generator.sampling_params.logprobs=null"]
    cfg = load_config(translate_argv(argv))
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is False
    # With SkyRL's off-policy correction on, the same line is refused at start.
    tis = "trainer.algorithm.off_policy_correction.tis_ratio_type=token"
    with pytest.raises(
        ConfigError, match="calculate_log_probs=false with actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"
    ):
        validate_config(load_config(translate_argv([*argv, tis])))


def test_the_generated_batch_keeps_no_engine_log_probs_when_off():
    import torch

    def batch():
        return DataProto.from_dict(tensors={"responses": torch.ones(2, 3), "rollout_log_probs": torch.zeros(2, 3)})

    assert "rollout_log_probs" not in drop_unrequested(batch(), load_config([OFF])).batch.keys()
    assert "rollout_log_probs" in drop_unrequested(batch(), load_config([])).batch.keys()
