"""SkyRL's `trainer.algorithm.*` keys (advantage estimators, KL, the policy loss and its
clipping, loss reduction, DAPO's overlong penalty, off-policy correction, dynamic sampling) as
rules of the SkyRL dialect (skyrl.py), which puts them after skyrl_trainer.py's.
"""

from __future__ import annotations

from hybrid.dialects.skyrl_convert import (
    ACTOR,
    _dynamic_sampling,
    _entropy,
    _kl_estimator,
    _legacy_kl_flag,
    _max_sample_batches,
    _normalize_values,
    _overlong_buffer,
    _temperature,
)
from hybrid.dialects.skyrl_off_policy import (
    _cispo_bound,
    _clip_ratio_c,
    _eps_clip,
    _policy_loss,
    _sequence_mask,
    _tis_cap,
    _tis_ratio_type,
    _token_tis_clip,
    _use_tis,
)
from hybrid.dialects.table import NO_DUAL_CLIP, choice, custom, ignore, refuse, same


def _read_elsewhere(value, ctx) -> dict:
    """A bound that another key's rule reads (named in the rule's `how`); writes nothing itself."""
    return {}


ALGORITHM_RULES = (
    # ---- algorithm
    choice(
        "trainer.algorithm.advantage_estimator",
        "algorithm.adv_estimator",
        {
            "grpo": "grpo",
            "gae": "gae",
            "rloo": "rloo",
            "reinforce++": "reinforce_plus_plus",
            "maxrl": "maxrl",
            "simple_baseline": "simple_baseline",
            "no_op": "no_op",
        },
        note="simple_baseline: the estimator SkyRL's custom-estimator example registers in its entry point "
        "(the response reward minus the batch mean), built into hybrid; no_op: the one its on-policy distillation "
        "example registers (the token rewards are the advantages), built in too",
    ),
    same("trainer.algorithm.grpo_norm_by_std", "algorithm.norm_adv_by_std_in_grpo"),
    same("trainer.algorithm.lambd", "algorithm.lam"),
    same("trainer.algorithm.gamma", "algorithm.gamma"),
    same("trainer.algorithm.use_kl_loss", f"{ACTOR}.use_kl_loss"),
    same("trainer.algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward"),
    same(
        "trainer.algorithm.kl_loss_coef",
        f"{ACTOR}.kl_loss_coef",
        "algorithm.kl_ctrl.kl_coef",
        note="SkyRL's in-reward KL starts from the same coefficient",
    ),
    custom(
        "trainer.algorithm.kl_estimator_type",
        (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"),
        _kl_estimator,
        "k1 -> kl, k2 -> mse, k3 -> low_var_kl, abs -> abs",
    ),
    custom(
        "trainer.algorithm.use_kl_estimator_k3",
        (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"),
        _legacy_kl_flag("k3"),
        "true -> low_var_kl",
    ),
    custom(
        "trainer.algorithm.use_abs_kl",
        (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"),
        _legacy_kl_flag("abs"),
        "true -> abs",
    ),
    same("trainer.algorithm.kl_ctrl.type", "algorithm.kl_ctrl.type"),
    same("trainer.algorithm.kl_ctrl.kl_target", "algorithm.kl_ctrl.target_kl"),
    same("trainer.algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.horizon"),
    custom(
        "trainer.algorithm.use_entropy_loss",
        (f"{ACTOR}.entropy_coeff",),
        _entropy,
        "true -> entropy_loss_coef, false -> 0",
    ),
    custom(
        "trainer.algorithm.entropy_loss_coef",
        (f"{ACTOR}.entropy_coeff",),
        _entropy,
        "read with use_entropy_loss=true",
    ),
    custom("trainer.algorithm.temperature", (), _temperature, "null or the sampling temperature accepted"),
    custom(
        "trainer.algorithm.policy_loss_type",
        (
            f"{ACTOR}.policy_loss.loss_mode",
            f"{ACTOR}.clip_ratio_c",
            "algorithm.rollout_correction.bypass_mode",
            "algorithm.rollout_correction.loss_type",
        ),
        _policy_loss,
        f"regular -> vanilla with clip_ratio_c={NO_DUAL_CLIP:g} (never binds), dual_clip -> vanilla, cispo -> cispo "
        "with clip_ratio_low/high from trainer.algorithm.cispo.*, gspo, clip_cov, kl_cov, sapo, importance_sampling "
        f"-> vanilla with clip_ratio_low/high/c={NO_DUAL_CLIP:g} (unclipped -ratio x A), reinforce -> gpg "
        "(-log pi x A), rollout_is -> rollout_is with rollout_correction.bypass_mode=true (the ratio to the "
        "engine's log-probs, zeroed outside the clip band; refused with use_kl_in_reward or TIS); refused: dppo, "
        "cross_entropy",
        "reinforce is the loss SkyRL's custom-loss example registers in its entry point; it averages over "
        "every position of the padded batch, hybrid aggregates by loss_reduction. rollout_is is GLM-5's agentic "
        "loss (workers/losses.py, checked against SkyRL's function in tests/unit/test_skyrl_oracle_off_policy.py)",
    ),
    choice(
        "trainer.algorithm.loss_reduction",
        f"{ACTOR}.loss_agg_mode",
        {
            "token_mean": "token-mean",
            "token_mean_legacy": "token-mean",
            "sequence_mean": "seq-mean-token-mean",
            "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
        },
        note="token_mean and token_mean_legacy (SkyRL's older token_mean) are both the mean over the "
        "mini-batch's valid tokens in hybrid, whose micro-batches weigh by their tokens; "
        "seq-mean-token-sum-norm divides by trainer.algorithm.max_seq_len (loss_scale_factor), else by the "
        "response horizon (data.max_response_length), where SkyRL takes max_input_length + max_generate_length",
    ),
    custom(
        "trainer.algorithm.overlong_buffer_len",
        (
            "reward_model.reward_manager",
            "reward_model.reward_kwargs.overlong_buffer.enable",
            "reward_model.reward_kwargs.overlong_buffer.len",
            "reward_model.reward_kwargs.overlong_buffer.penalty_factor",
        ),
        _overlong_buffer,
        "reward_manager=dapo, overlong_buffer.enable=true, len = value (512 when only the factor is given)",
        "the DAPO keys of SkyRL's DAPO entry point (examples/train/algorithms/dapo): the soft overlong penalty on "
        "training rewards; hybrid's dapo manager applies it to validation rewards too",
    ),
    custom(
        "trainer.algorithm.overlong_buffer_penalty_factor",
        (
            "reward_model.reward_manager",
            "reward_model.reward_kwargs.overlong_buffer.enable",
            "reward_model.reward_kwargs.overlong_buffer.len",
            "reward_model.reward_kwargs.overlong_buffer.penalty_factor",
        ),
        _overlong_buffer,
        "overlong_buffer.penalty_factor = value (1.0 when only the length is given), as above",
    ),
    custom(
        "trainer.algorithm.eps_clip_low",
        (f"{ACTOR}.clip_ratio_low",),
        _eps_clip(f"{ACTOR}.clip_ratio_low"),
        "same value (not read by cispo)",
    ),
    custom(
        "trainer.algorithm.eps_clip_high",
        (f"{ACTOR}.clip_ratio_high",),
        _eps_clip(f"{ACTOR}.clip_ratio_high"),
        "same value (not read by cispo)",
    ),
    custom("trainer.algorithm.clip_ratio_c", (f"{ACTOR}.clip_ratio_c",), _clip_ratio_c, "same value (dual clip)"),
    custom(
        "trainer.algorithm.cispo.cispo_eps_clip_low",
        (f"{ACTOR}.clip_ratio_low",),
        _cispo_bound(f"{ACTOR}.clip_ratio_low"),
        "with policy_loss_type=cispo",
    ),
    custom(
        "trainer.algorithm.cispo.cispo_eps_clip_high",
        (f"{ACTOR}.clip_ratio_high",),
        _cispo_bound(f"{ACTOR}.clip_ratio_high"),
        "with policy_loss_type=cispo",
    ),
    same("trainer.algorithm.sapo.tau_pos", f"{ACTOR}.policy_loss.sapo_tau_pos"),
    same("trainer.algorithm.sapo.tau_neg", f"{ACTOR}.policy_loss.sapo_tau_neg"),
    same("trainer.algorithm.clip_cov.clip_ratio", f"{ACTOR}.policy_loss.clip_cov_ratio"),
    same("trainer.algorithm.clip_cov.clip_cov_lb", f"{ACTOR}.policy_loss.clip_cov_lb"),
    same("trainer.algorithm.clip_cov.clip_cov_ub", f"{ACTOR}.policy_loss.clip_cov_ub"),
    same(
        "trainer.algorithm.kl_cov.kl_cov_frac",
        f"{ACTOR}.policy_loss.kl_cov_ratio",
        note="a fraction of the valid tokens in both",
    ),
    same("trainer.algorithm.kl_cov.ppo_kl_coef", f"{ACTOR}.policy_loss.ppo_kl_coef"),
    same("trainer.algorithm.value_clip", "critic.cliprange_value"),
    refuse(
        "trainer.algorithm.value_head_prefix",
        "hybrid's critic names its value head itself",
        accept=("value_head",),
    ),
    refuse(
        "trainer.algorithm.advantage_batch_normalize",
        "no key to normalise advantages over the batch",
        accept=(False,),
    ),
    refuse(
        "trainer.algorithm.zero_variance_filter",
        "no key to mask zero-variance groups; algorithm.filter_groups "
        "(trainer.algorithm.dynamic_sampling.type=filter) drops and resamples them instead",
        accept=(False,),
    ),
    custom(
        "trainer.algorithm.normalize_reward",
        (),
        _normalize_values,
        "accepted without a critic; true refused with gae",
    ),
    same(
        "trainer.algorithm.max_seq_len",
        f"{ACTOR}.loss_scale_factor",
        note="Dr. GRPO's constant: seq_mean_token_sum_norm divides each sequence's token sum by it (verl's "
        "loss_scale_factor); null: the response horizon",
    ),
    custom(
        "trainer.algorithm.use_tis",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _use_tis,
        "true -> tis_imp_ratio_cap, false -> -1",
    ),
    custom("trainer.algorithm.tis_imp_ratio_cap", (f"{ACTOR}.tis_imp_ratio_cap",), _tis_cap, "read with use_tis=true"),
    custom(
        "trainer.algorithm.off_policy_correction.tis_ratio_type",
        (
            f"{ACTOR}.tis_imp_ratio_cap",
            "algorithm.rollout_correction.rollout_is",
            "algorithm.rollout_correction.rollout_is_threshold",
        ),
        _tis_ratio_type,
        "token -> tis_imp_ratio_cap = token_tis_ratio_clip_high; sequence -> rollout_correction.rollout_is="
        "sequence, rollout_is_threshold = sequence_tis_ratio_clip_high; null: nothing",
        "sequence: the product of pi_old / pi_rollout over the response, truncated; the same formula in both",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _token_tis_clip,
        "read with tis_ratio_type=token",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.sequence_tis_ratio_clip_high",
        (),
        _read_elsewhere,
        "read with tis_ratio_type=sequence",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.sequence_mask_metric",
        ("algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs_threshold"),
        _sequence_mask,
        "geometric -> rollout_rs=seq_geo_ratio, product -> seq_prod_ratio, rollout_rs_threshold = "
        "'<low>_<high>' of the metric's bounds; with policy_loss_type=rollout_is and one optimizer step per batch "
        "(else refused); null: nothing",
        "the same formula: the sequence's geometric mean or product of pi_old / pi_rollout, masked out of the "
        "policy loss's numerator only (tests/unit/test_skyrl_oracle_off_policy.py)",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.geo_mask_high",
        (),
        _read_elsewhere,
        "read with sequence_mask_metric=geometric",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.geo_mask_low",
        (),
        _read_elsewhere,
        "read with sequence_mask_metric=geometric",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.product_mask_high",
        (),
        _read_elsewhere,
        "read with sequence_mask_metric=product",
    ),
    custom(
        "trainer.algorithm.off_policy_correction.product_mask_low",
        (),
        _read_elsewhere,
        "read with sequence_mask_metric=product",
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.outlier_token_is_threshold_low",
        "no outlier masking by importance ratio in hybrid",
        accept=(None,),
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.outlier_token_is_threshold_high",
        "no outlier masking by importance ratio in hybrid",
        accept=(None,),
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.token_mask_is_threshold_low",
        "no token masking by importance ratio in hybrid",
        accept=(None,),
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.token_mask_is_threshold_high",
        "no token masking by importance ratio in hybrid",
        accept=(None,),
    ),
    custom(
        "trainer.algorithm.dynamic_sampling.type",
        (
            "algorithm.filter_groups.enable",
            "algorithm.filter_groups.metric",
            "algorithm.filter_groups.max_num_gen_batches",
        ),
        _dynamic_sampling,
        "filter -> filter_groups on seq_reward; null -> off",
    ),
    custom(
        "trainer.algorithm.dynamic_sampling.max_sample_batches",
        ("algorithm.filter_groups.max_num_gen_batches",),
        _max_sample_batches,
        "-1 -> 0 (no limit), N -> N",
    ),
    ignore("trainer.algorithm.dynamic_sampling.min_replace_ratio", "read only with type=replace, which is refused"),
)


__all__ = ["ALGORITHM_RULES"]
