"""SkyRL's policy-loss and off-policy-correction keys (trainer.algorithm.policy_loss_type, its
clip bounds, TIS, the sequence masks of off_policy_correction) as convert functions of the
rules in skyrl_algorithm.py; the rest of the SkyRL converts are in skyrl_convert.py.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_convert import ACTOR
from hybrid.dialects.table import NO_DUAL_CLIP, Context, Refusal


def _policy_loss(value: Any, ctx: Context) -> dict[str, Any]:
    loss = f"{ACTOR}.policy_loss.loss_mode"
    if value == "regular":
        return {loss: "vanilla", f"{ACTOR}.clip_ratio_c": NO_DUAL_CLIP}
    if value == "dual_clip":
        return {loss: "vanilla", f"{ACTOR}.clip_ratio_c": ctx.get("trainer.algorithm.clip_ratio_c")}
    if value == "cispo":
        return {
            loss: "cispo",
            f"{ACTOR}.clip_ratio_low": ctx.get("trainer.algorithm.cispo.cispo_eps_clip_low"),
            f"{ACTOR}.clip_ratio_high": ctx.get("trainer.algorithm.cispo.cispo_eps_clip_high"),
        }
    if value in ("gspo", "clip_cov", "kl_cov", "sapo"):
        return {loss: value}
    if value == "importance_sampling":  # -ratio * A, unclipped: PPO's clip at bounds no ratio reaches
        return {
            loss: "vanilla",
            f"{ACTOR}.clip_ratio_low": NO_DUAL_CLIP,
            f"{ACTOR}.clip_ratio_high": NO_DUAL_CLIP,
            f"{ACTOR}.clip_ratio_c": NO_DUAL_CLIP,
        }
    if value == "reinforce":  # SkyRL's custom-loss example: -log pi * A, which is hybrid's gpg
        return {loss: "gpg"}
    if value == "rollout_is":
        return _rollout_is(ctx)
    if value in _LOSSES_REFUSED:
        raise Refusal(_LOSSES_REFUSED[value])
    raise Refusal(
        "supported: regular, dual_clip, gspo, clip_cov, kl_cov, cispo, sapo, importance_sampling, reinforce "
        "(a loss from SkyRL's PolicyLossRegistry can be registered in hybrid through "
        "actor_rollout_ref.model.external_lib)"
    )


def _rollout_is(ctx: Context) -> dict[str, Any]:
    # GLM-5's loss anchors on the engine's log-probs: hybrid's bypass mode, where the loss's old
    # log-probs are rollout_log_probs. There old_log_probs is never computed, so what SkyRL
    # reads from its recomputed old log-probs besides the loss must be exactly the same:
    # a KL penalty in the reward would read the engine's instead, and TIS weights are not
    # applied in bypass mode.
    if ctx.get("trainer.algorithm.use_kl_in_reward", False) is True:
        raise Refusal(
            "with use_kl_in_reward=true SkyRL's reward KL reads its recomputed old log-probs; hybrid runs "
            "rollout_is in bypass mode, whose old log-probs are the engine's; use use_kl_loss instead"
        )
    if ctx.get("trainer.algorithm.off_policy_correction.tis_ratio_type", None) is not None or ctx.get(
        "trainer.algorithm.use_tis", False
    ):
        raise Refusal(
            "TIS weights (off_policy_correction.tis_ratio_type / use_tis) are not applied by hybrid's bypass mode, "
            "where rollout_is runs (the loss's own ratio is already to the engine's log-probs)"
        )
    return {
        f"{ACTOR}.policy_loss.loss_mode": "rollout_is",
        "algorithm.rollout_correction.bypass_mode": True,
        "algorithm.rollout_correction.loss_type": "ppo_clip",
    }


def _sequence_mask(value: Any, ctx: Context) -> dict[str, Any]:
    """SkyRL's sequence mask -> hybrid's rejection option of the same formula (seq_geo_ratio /
    seq_prod_ratio). SkyRL takes the masked sequences out of the policy loss's numerator only,
    with pi_old recomputed at the start of the step: hybrid's bypass mode does both (its
    rejection reads the current weights, which are pi_old for one optimizer step per batch),
    so it is mapped with policy_loss_type=rollout_is and one optimizer step per batch."""
    if value is None:
        return {}
    metrics = {"geometric": ("seq_geo_ratio", "geo"), "product": ("seq_prod_ratio", "product")}
    if value not in metrics:
        raise Refusal("supported: geometric, product")
    if not _policy_loss_is(ctx, "rollout_is"):
        raise Refusal(
            "mapped with policy_loss_type=rollout_is only: SkyRL masks sequences out of the policy loss's numerator "
            "alone, hybrid's decoupled rejection (the other losses) also out of its denominator and of the KL and "
            "entropy terms"
        )
    train = ctx.effective("trainer.train_batch_size", "data.train_batch_size")
    mini = ctx.effective("trainer.policy_mini_batch_size", f"{ACTOR}.ppo_mini_batch_size")
    epochs = ctx.effective("trainer.update_epochs_per_batch", f"{ACTOR}.ppo_epochs")
    if epochs != 1 or mini != train:
        raise Refusal(
            f"SkyRL masks by the log-probs recomputed before the update; hybrid's bypass mode by the current "
            f"weights, the same only for one optimizer step per batch (update_epochs_per_batch={epochs}, "
            f"policy_mini_batch_size={mini}, train_batch_size={train})"
        )
    option, prefix = metrics[value]
    low = ctx.get(f"trainer.algorithm.off_policy_correction.{prefix}_mask_low")
    high = ctx.get(f"trainer.algorithm.off_policy_correction.{prefix}_mask_high")
    if not (isinstance(low, (int, float)) and isinstance(high, (int, float)) and 0 < low <= high):
        raise Refusal(f"needs 0 < {prefix}_mask_low ({low}) <= {prefix}_mask_high ({high})")
    return {
        "algorithm.rollout_correction.rollout_rs": option,
        "algorithm.rollout_correction.rollout_rs_threshold": f"{float(low)!r}_{float(high)!r}",
    }


_LOSSES_REFUSED = {
    "dppo": "hybrid has no DPPO loss (probability divergences instead of ratios)",
    "cross_entropy": "a supervised loss: use hybrid's SFT trainer (python -m hybrid.sft_trainer)",
}


def _policy_loss_is(ctx: Context, *names: str) -> bool:
    return ctx.has("trainer.algorithm.policy_loss_type") and ctx.get("trainer.algorithm.policy_loss_type") in names


def _eps_clip(verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        # SkyRL's cispo reads its own bounds (trainer.algorithm.cispo.*), and its importance_sampling
        # and reinforce losses no bounds: not these.
        return {} if _policy_loss_is(ctx, "cispo", "importance_sampling", "reinforce") else {verl_key: value}

    return convert


def _cispo_bound(verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        return {verl_key: value} if _policy_loss_is(ctx, "cispo") else {}

    return convert


def _clip_ratio_c(value: Any, ctx: Context) -> dict[str, Any]:
    # With policy_loss_type=regular SkyRL never reads it (the loss rule writes the bound).
    return (
        {}
        if _policy_loss_is(
            ctx,
            "regular",
            "cispo",
            "gspo",
            "clip_cov",
            "kl_cov",
            "sapo",
            "importance_sampling",
            "reinforce",
            "rollout_is",
        )
        else {f"{ACTOR}.clip_ratio_c": value}
    )


def _use_tis(value: Any, ctx: Context) -> dict[str, Any]:
    if value is not True:
        return {f"{ACTOR}.tis_imp_ratio_cap": -1.0}
    cap = ctx.get("trainer.algorithm.tis_imp_ratio_cap")
    if not isinstance(cap, (int, float)) or cap <= 0:
        raise Refusal("use_tis=true needs trainer.algorithm.tis_imp_ratio_cap > 0")
    return {f"{ACTOR}.tis_imp_ratio_cap": float(cap)}


def _tis_cap(value: Any, ctx: Context) -> dict[str, Any]:
    # SkyRL reads the cap only with use_tis=true (the deprecated spelling of token TIS).
    return _use_tis(True, ctx) if ctx.get("trainer.algorithm.use_tis", False) is True else {}


def _tis_ratio_type(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {}
    if value == "token":
        return {
            f"{ACTOR}.tis_imp_ratio_cap": float(
                ctx.get("trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high")
            )
        }
    if value == "sequence":
        # The product of the token ratios pi_old / pi_rollout, truncated: rollout_is=sequence
        # (decoupled), the same formula (tests/unit/test_skyrl_oracle_off_policy.py).
        cap = ctx.get("trainer.algorithm.off_policy_correction.sequence_tis_ratio_clip_high")
        return {
            "algorithm.rollout_correction.rollout_is": "sequence",
            "algorithm.rollout_correction.rollout_is_threshold": float(cap),
        }
    raise Refusal("supported: token, sequence")


def _token_tis_clip(value: Any, ctx: Context) -> dict[str, Any]:
    if ctx.get("trainer.algorithm.off_policy_correction.tis_ratio_type", None) == "token":
        return {f"{ACTOR}.tis_imp_ratio_cap": float(value)}
    return {}
