"""The converters of the ROLL dialect (roll.py): the functions its rules call to turn a ROLL
value into verl keys, for the top-level pipeline keys (devices, batches, the algorithm, the
run), and the reasons and key prefixes the rules share. The worker sections' converters and
rules are in roll_workers.py, the devices and batch sizes in roll_placement.py.
"""

from __future__ import annotations

import re
from typing import Any

from hybrid.dialects.roll_episodes import agentic_advantage, is_agentic
from hybrid.dialects.roll_placement import ACTOR, ARR, REF, ROLLOUT, parse_devices
from hybrid.dialects.table import NO_DUAL_CLIP, Context, Refusal, show

MEGATRON = "the Megatron strategy: hybrid trains with FSDP2 only"
DEEPSPEED = "the DeepSpeed strategy: hybrid trains with FSDP2 only"
AGENTIC = (
    "a step-wise estimator of ROLL's agentic pipeline (one sample per environment step): hybrid estimates "
    "advantages per trajectory; multi-turn episodes (custom_envs) train with grpo, gae, reinforce and the others"
)
NATIVE_TEMPLATE = "hybrid renders prompts with the tokenizer's own chat template (ROLL's `native`)"


# ---------------------------------------------------------------- algorithm


def _advantage(value: Any, ctx: Context) -> dict[str, Any]:
    """adv_estimator, norm_mean_type, norm_std_type and whiten_advantages, read together (in an
    agentic file with reward_normalization instead of norm_mean_type / norm_std_type)."""
    if is_agentic(ctx) and ctx.get("adv_estimator") not in ("gigpo", "step_reinforce", "agentic_reinforce"):
        return agentic_advantage(ctx)
    est, mean, std, whiten = (
        ctx.get(k) for k in ("adv_estimator", "norm_mean_type", "norm_std_type", "whiten_advantages")
    )
    combo = (
        f"adv_estimator={est}, norm_mean_type={show(mean)}, norm_std_type={show(std)}, whiten_advantages={show(whiten)}"
    )
    if est == "grpo":
        # ROLL's grpo normalises rewards within each group (mean and std), as hybrid's grpo.
        if whiten:
            raise Refusal(f"{combo}: hybrid's grpo does not whiten the group-normalised advantages again", shared=True)
        return {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True}
    if est == "gae":
        if mean is not None or std is not None:
            raise Refusal(f"{combo}: no key to normalise rewards before GAE", shared=True)
        if not whiten:
            raise Refusal(
                f"{combo}: hybrid's gae whitens the advantages over the batch (as verl's); set whiten_advantages: true",
                shared=True,
            )
        return {"algorithm.adv_estimator": "gae"}
    if est == "reinforce":
        if mean == "group" and std in ("group", None) and not whiten:
            # Group-normalised reward as the advantage of every token: GRPO (Dr. GRPO without std).
            return {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": std == "group"}
        if mean in ("batch", None) and std in ("batch", None) and whiten:
            # Whitening over the batch undoes any batch-level normalisation before it: REINFORCE++.
            return {"algorithm.adv_estimator": "reinforce_plus_plus"}
        raise Refusal(
            f"{combo}: hybrid has reinforce with group normalisation (-> grpo) or with whitened "
            f"advantages (-> reinforce_plus_plus), not this combination",
            shared=True,
        )
    if est in ("gigpo", "step_reinforce", "agentic_reinforce"):
        raise Refusal(f"adv_estimator={est}: {AGENTIC}", shared=True)
    raise Refusal(f"adv_estimator={est}: supported gae, grpo, reinforce", shared=True)


def _clip(value: Any, ctx: Context) -> dict[str, Any]:
    """pg_clip, use_pg_clip_range, pg_clip_low and pg_clip_high, read together."""
    if ctx.get("use_pg_clip_range"):
        low, high = ctx.get("pg_clip_low"), ctx.get("pg_clip_high")
    else:
        low = high = ctx.get("pg_clip")
    return {f"{ACTOR}.clip_ratio": ctx.get("pg_clip"), f"{ACTOR}.clip_ratio_low": low, f"{ACTOR}.clip_ratio_high": high}


def _target_kl(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {"algorithm.kl_ctrl.type": "fixed"}
    return {"algorithm.kl_ctrl.type": "adaptive", "algorithm.kl_ctrl.target_kl": value}


def _resume(value: Any, ctx: Context) -> dict[str, Any]:
    if value is False or value is None:
        return {"trainer.resume_mode": "disable"}
    if value is True:
        return {"trainer.resume_mode": "auto"}
    return {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": value}


def _keep(value: Any, ctx: Context) -> dict[str, Any]:
    keep = None if value <= 0 else value
    return {"trainer.max_actor_ckpt_to_keep": keep, "trainer.max_critic_ckpt_to_keep": keep}


def _max_steps(value: Any, ctx: Context) -> dict[str, Any]:
    # ROLL's pipeline runs max_steps steps and starts the data over whenever it runs out (its
    # scheduler's dataset_epoch); hybrid's run, like verl's, ends with trainer.total_epochs, so
    # it gets max_steps passes, enough for any data size (a pass is at least one step).
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Refusal(f"ROLL needs max_steps >= 1 (got {value!r})")
    return {"trainer.total_training_steps": value, "trainer.total_epochs": value}


def _save_steps(value: Any, ctx: Context) -> dict[str, Any]:
    # ROLL saves every save_steps steps and always the last step; its checkpoints hold the
    # Hugging Face model. save_steps <= 0 keeps only the last step.
    freq = value if value > 0 else ctx.effective("max_steps", "trainer.total_training_steps")
    return {"trainer.save_freq": freq, f"{ACTOR}.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"]}


def _eval_steps(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None or value <= 0:
        return {"trainer.test_freq": -1, "trainer.val_before_train": False}
    return {"trainer.test_freq": value, "trainer.val_before_train": True}


def _response_length(value: Any, ctx: Context) -> dict[str, Any]:
    # ROLL derives the response budget from sequence_length whenever that is set.
    return {} if ctx.get("sequence_length", None) is not None else {"data.max_response_length": value}


def _sequence_length(value: Any, ctx: Context) -> int:
    prompt = ctx.effective("prompt_length", "data.max_prompt_length")
    if value <= prompt:
        raise Refusal(f"must exceed prompt_length={prompt} (the response gets sequence_length - prompt_length)")
    return value - prompt


def _val_lengths(value: Any, ctx: Context) -> dict[str, Any]:
    prompt = ctx.effective("prompt_length", "data.max_prompt_length")
    if ctx.has("sequence_length"):
        sequence = ctx.get("sequence_length")
    else:
        sequence = prompt + ctx.effective("response_length", "data.max_response_length")
    train = prompt if ctx.key == "val_prompt_length" else sequence
    if value is None or value == train:
        return {}
    raise Refusal(f"hybrid validates with the training lengths ({train} here); it has no separate key")


def _logger(value: Any, ctx: Context) -> list[str]:
    names = {"tensorboard": "tensorboard", "wandb": "wandb", "stdout": "console"}
    if value not in names:
        raise Refusal("supported: tensorboard, wandb, stdout")
    # `file` (metrics.jsonl) is hybrid's run record; it never replaces what ROLL tracks.
    return [names[value], "file"]


def _value_clip(value: Any, ctx: Context) -> dict[str, Any]:
    if value is not None:
        return {"critic.cliprange_value": value}
    if ctx.get("adv_estimator") == "gae":
        raise Refusal("hybrid always clips the value loss (critic.cliprange_value); give a value")
    return {}


def _dual_clip(value: Any, ctx: Context) -> dict[str, Any]:
    # hybrid's vanilla loss is always dual-clip with bound clip_ratio_c (3, as ROLL's).
    return {f"{ACTOR}.clip_ratio_c": 3.0 if value else NO_DUAL_CLIP}


def _kl_penalty(value: Any, ctx: Context) -> str:
    kinds = {"kl": "kl", "abs": "abs", "mse": "mse", "k3": "low_var_kl", "full": "full"}
    if value not in kinds:
        raise Refusal("supported: kl, abs, mse, k3, full")
    return kinds[value]


def _is_weight(value: Any, ctx: Context) -> dict[str, Any]:
    base = "train_infer_correction.is_weight"
    if ctx.get(f"{base}.enabled", False) is not True:
        return {f"{ACTOR}.tis_imp_ratio_cap": -1.0} if ctx.key == f"{base}.enabled" else {}
    kind = ctx.get(f"{base}.weight_type", "token")
    if kind != "token":
        raise Refusal(
            f"{base}.weight_type={kind}: hybrid has token-level truncated importance sampling only", shared=True
        )
    cap = ctx.get(f"{base}.upper_bound", 1.2)
    if cap is None:
        raise Refusal(f"{base}.upper_bound=null: hybrid's importance weights are always capped", shared=True)
    return {f"{ACTOR}.tis_imp_ratio_cap": float(cap)}


def _recompute(value: Any, ctx: Context) -> dict[str, Any]:
    if ctx.get("force_disable_old_logprobs_recompute", False) is True:
        return {f"{ACTOR}.skip_old_log_prob_on_policy": True}
    return {f"{ACTOR}.skip_old_log_prob_on_policy": not value}


def _val_greedy(value: Any, ctx: Context) -> dict[str, Any]:
    if value:
        return {f"{ROLLOUT}.val_kwargs.do_sample": False, f"{ROLLOUT}.val_kwargs.temperature": 0}
    return {f"{ROLLOUT}.val_kwargs.do_sample": True}


# ---------------------------------------------------------------- models and data


def _model_path(value: Any, ctx: Context) -> dict[str, Any]:
    return {} if value is None else {f"{ARR}.model.path": value}


def _ref_model_path(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {}
    policy = ctx.get("actor_train.model_args.model_name_or_path", None) or ctx.get("pretrain", None)
    if value != policy:
        raise Refusal("hybrid's reference model is the initial policy (pretrain); a different one has no key")
    return {}


# ROLL's chat templates (roll/datasets/chat_template.py) that are the tokenizer's own: `native` and
# `qwen2_5` call tokenizer.apply_chat_template as it is; `qwen3` adds enable_thinking=True.
_TEMPLATES = {"native": {}, "qwen2_5": {}, "qwen3": {"data.apply_chat_template_kwargs.enable_thinking": True}}
ROLL_TEMPLATES = ("native", "qwen2_5", "qwen3", "chatml", "base", "empty", "longCOT_qwen2.5", "longcot_V3")


def _template(value: Any, ctx: Context) -> dict[str, Any]:
    """The template ROLL's RLVR pipeline encodes prompts with: global_template, else actor_train's."""
    if ctx.key != "global_template" and ctx.get("global_template", None) is not None:
        return {}  # global_template replaces it
    if value is None:
        return {}
    if value not in _TEMPLATES:
        raise Refusal(
            f"{NATIVE_TEMPLATE}: ROLL's native, qwen2_5 (the same) and qwen3 (the same with enable_thinking=True) "
            f"map; {value} renders prompts its own way"
        )
    return dict(_TEMPLATES[value])


def _unread_template(value: Any, ctx: Context) -> dict[str, Any]:
    # ROLL's RLVR pipeline encodes every prompt with global_template or actor_train's template; the
    # other sections' templates are not read for the policy's prompts.
    if value is None or value in ROLL_TEMPLATES:
        return {}
    raise Refusal(f"not one of ROLL's chat templates ({', '.join(ROLL_TEMPLATES)})")


def _difficulty(value: Any, ctx: Context) -> dict[str, Any]:
    """difficulty_mask with its two bounds, read together (ROLL's defaults 0.0 and 1.0)."""
    enable = ctx.get("difficulty_mask", False)
    if not enable:
        return {"algorithm.difficulty_mask.enable": False} if ctx.key == "difficulty_mask" else {}
    low, high = ctx.get("difficulty_low_threshold", 0.0), ctx.get("difficulty_high_threshold", 1.0)
    return {
        "algorithm.difficulty_mask.enable": True,
        "algorithm.difficulty_mask.low": float(low),
        "algorithm.difficulty_mask.high": float(high),
    }


# tracker_kwargs.<name> -> the environment variable the logger reads, per track_with.
_TRACKER_VARIABLES = {
    ("tensorboard", "log_dir"): "TENSORBOARD_DIR",
    ("wandb", "log_dir"): "WANDB_DIR",
    ("wandb", "api_key"): "WANDB_API_KEY",
    ("wandb", "notes"): "WANDB_NOTES",
    ("wandb", "tags"): "WANDB_TAGS",
}
UNSET_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _tracker(value: Any, ctx: Context) -> dict[str, Any]:
    """tracker_kwargs.* onto the variables hybrid's loggers read (set in the driver before they start)."""
    name = ctx.key.rsplit(".", 1)[-1]
    variable = _TRACKER_VARIABLES.get((ctx.get("track_with", None), name))
    if variable is None or value is None:
        return {}  # the tracker in use does not read it (ROLL passes it to that tracker only)
    unset = UNSET_ENV.fullmatch(value) if isinstance(value, str) else None
    if unset:  # roll.py keeps an ${oc.env:NAME} of an unset variable as written
        if unset.group(1) == variable:
            return {}  # the logger reads that variable itself when it starts
        raise Refusal(f"the environment variable {unset.group(1)} is not set; set it, or set {variable}")
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return {f"trainer.worker_env_vars.{variable}": str(value)}


def _lists(value: Any, ctx: Context) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


INTERLEAVE = "actor_train.data_args.domain_interleave_probs"
# ROLL gives a row whose tag no rewards.<domain>.tag_included lists this domain (update_dataset_domain).
ROLL_DEFAULT_DOMAIN = "math_rule"


def roll_domains(ctx: Context) -> list[str]:
    """The domains of domain_interleave_probs, in the order given (ROLL's batch order)."""
    if ctx.has(INTERLEAVE):
        value = ctx.get(INTERLEAVE)
        return list(value) if isinstance(value, dict) else ([] if value is None else str(value).split(","))
    return [key[len(INTERLEAVE) + 1 :] for key in ctx.given if key.startswith(INTERLEAVE + ".")]


def multi_domain(ctx: Context) -> bool:
    """Several domains: ROLL's per-domain quotas (hybrid/domains.py), routed by each row's domain."""
    return len(roll_domains(ctx)) > 1


def _interleave(value: Any, ctx: Context) -> dict[str, Any]:
    """ROLL's {domain: probability} mapping, read whole: a YAML mapping arrives as one key per
    domain (`...domain_interleave_probs.math_rule`), a command line may give it as one value.
    One domain: every prompt comes from it, as from hybrid's single data set. Several: hybrid's
    data.domain_quotas, the same per-domain quotas of every batch, each row's domain from its
    domain column or tag (data.domain_tags), else math_rule, as ROLL's update_dataset_domain."""
    if not multi_domain(ctx):
        return {}
    if ctx.key == INTERLEAVE:
        if not isinstance(value, dict):
            raise Refusal("give the domains as a mapping {domain: probability}", shared=True)
        items = dict(value)
    else:
        items = {ctx.key[len(INTERLEAVE) + 1 :]: value}
    for domain, p in items.items():
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            raise Refusal(f"the probability of domain {domain} must be a number")
    if ctx.get("add_token_level_kl", False) and ctx.get("target_kl", None) is not None:
        raise Refusal(
            "with several domains ROLL updates its adaptive KL controller once per domain each step (compute_token_"
            "reward on each domain's rows); hybrid's updates once per step: set target_kl: null (a fixed coefficient) "
            "or add_token_level_kl: false",
            shared=True,
        )
    return {
        **{f"data.domain_quotas.{domain}": float(p) for domain, p in items.items()},
        "data.reward_fn_key": "domain",
        "data.default_domain": ROLL_DEFAULT_DOMAIN,
        # ROLL computes each domain's rewards and advantages apart (rlvr_pipeline.py, batch.group_by("domain"))
        "algorithm.advantages_per_domain": True,
    }


__all__ = ["ACTOR", "ARR", "REF", "ROLLOUT", "parse_devices"]
