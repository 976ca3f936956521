"""The converters of the ROLL dialect (roll.py): the functions its rules call to turn a ROLL
value into verl keys, for the top-level pipeline keys (devices, batches, the algorithm, the
run), and the reasons and key prefixes the rules share. The worker sections' converters and
rules are in roll_workers.py.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from hybrid.dialects.asynchronous import ceil, engines_apart, in_turn_apart, streamed
from hybrid.dialects.roll_episodes import agentic_advantage, is_agentic, samples_per_prompt, train_prompts
from hybrid.dialects.table import NO_DUAL_CLIP, Context, Refusal, hybrid_default, show

ARR = "actor_rollout_ref"
ACTOR = f"{ARR}.actor"
ROLLOUT = f"{ARR}.rollout"
REF = f"{ARR}.ref"

MEGATRON = "the Megatron strategy: hybrid trains with FSDP2 only"
DEEPSPEED = "the DeepSpeed strategy: hybrid trains with FSDP2 only"
TRAINING_GROUP = (
    "hybrid runs the critic in the training group, on actor_train's devices; give it actor_train's device_mapping"
)
AGENTIC = (
    "a step-wise estimator of ROLL's agentic pipeline (one sample per environment step): hybrid estimates "
    "advantages per trajectory; multi-turn episodes (custom_envs) train with grpo, gae, reinforce and the others"
)
NATIVE_TEMPLATE = "hybrid renders prompts with the tokenizer's own chat template (ROLL's `native`)"


# ---------------------------------------------------------------- devices


def parse_devices(value: Any) -> list[int]:
    """A ROLL device_mapping: a list of ids, or a string such as `list(range(0,8))`."""
    if isinstance(value, (list, tuple)):
        ids = list(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*list\(\s*range\(\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?(?:,\s*(-?\d+)\s*)?\)\s*\)\s*", value)
        if m:
            bounds = [int(x) for x in m.groups() if x is not None]
            ids = list(range(*bounds))
        else:
            try:
                ids = list(ast.literal_eval(value))
            except (ValueError, SyntaxError, TypeError):
                raise Refusal("not a device list (write [0,1,...] or list(range(a,b)))") from None
    else:
        raise Refusal("not a device list (write [0,1,...] or list(range(a,b)))")
    if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise Refusal("a device list must hold device ids >= 0")
    return ids


def _nodes(ids: list[int], ctx: Context) -> tuple[int, int]:
    """(nodes, devices per node) of a device list: ROLL's ids are global, num_gpus_per_node a node."""
    per_node = ctx.get("num_gpus_per_node")
    nodes = len({i // per_node for i in ids})
    if len(ids) % nodes:
        raise Refusal(f"{len(ids)} devices over {nodes} nodes of {per_node}: hybrid needs the same number on each node")
    return nodes, len(ids) // nodes


def _placement(ids: list[int], ctx: Context) -> dict[str, Any]:
    nodes, per_node = _nodes(ids, ctx)
    return {"trainer.nnodes": nodes, "trainer.n_gpus_per_node": per_node}


def _infer_placement(ctx: Context) -> str:
    """How actor_infer's devices relate to actor_train's: same, apart, overlap, or unknown."""
    train, infer = ctx.get("actor_train.device_mapping", None), ctx.get("actor_infer.device_mapping", None)
    if train is None or infer is None:
        return "unknown"
    try:
        train_ids, infer_ids = set(parse_devices(train)), set(parse_devices(infer))
    except Refusal:
        return "unknown"  # the device_mapping rule reports it
    if train_ids == infer_ids:
        return "same"
    return "overlap" if train_ids & infer_ids else "apart"


def _device_mapping(value: Any, ctx: Context) -> dict[str, Any]:
    ids = parse_devices(value)
    if ctx.key == "actor_train.device_mapping":
        return _placement(ids, ctx)
    train = ctx.get("actor_train.device_mapping", None)
    if train is None:
        raise Refusal("hybrid places every role relative to actor_train; give actor_train.device_mapping too")
    train_ids = sorted(parse_devices(train))
    if ctx.key == "reference.device_mapping" and train_ids != sorted(ids):
        # The reference only computes log-probs of the initial policy: hybrid computes them in the
        # training group, the same values; devices given to the reference alone stay unused.
        return {}
    if ctx.key != "actor_infer.device_mapping":
        if train_ids != sorted(ids):
            raise Refusal(f"{TRAINING_GROUP} (actor_train.device_mapping={show(train)})")
        return _placement(ids, ctx)
    relation = _infer_placement(ctx)
    if relation == "same":
        return _placement(ids, ctx)  # colocated: the fused engine generates and trains in turn
    if relation == "overlap":
        if set(ids) < set(train_ids) and _ratio(ctx) == 0:
            # ROLL generates on these devices, then trains on all of actor_train's, in turn (the rest
            # of them idle while it generates, or host a reward model). Colocated on every training
            # device, hybrid samples the same responses from more engines: only the speed differs.
            print(
                f"note: actor_infer.device_mapping={show(value)} is part of actor_train's devices; hybrid "
                f"colocates its engines on all {len(train_ids)} of them (the same generation, on more engines)"
            )
            return _placement(train_ids, ctx)
        raise Refusal(
            f"shares some of actor_train's devices (actor_train.device_mapping={show(train)}) but not all: hybrid runs "
            f"the engines either on the training devices (the same device_mapping, or a part of it with "
            f"async_generation_ratio=0: colocated, generation and training in turn) or on devices of their own (a "
            f"disjoint one: asynchronous training)"
        )
    nodes, per_node = _nodes(ids, ctx)
    return {**engines_apart(nodes, per_node), **_schedule(ctx)}


def _ratio(ctx: Context) -> float:
    """async_generation_ratio, checked as ROLL checks it."""
    ratio = ctx.get("async_generation_ratio")
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or ratio < 0:
        raise Refusal(f"async_generation_ratio must be a number >= 0 (here {show(ratio)})", shared=True)
    if 0 < ratio < 1:
        raise Refusal(
            f"ROLL's RLVR pipeline requires async_generation_ratio >= 1 when it is asynchronous (0 is synchronous); "
            f"here {ratio}",
            shared=True,
        )
    if not float(ratio).is_integer() and any(k.startswith(("custom_envs.", "train_env_manager.")) for k in ctx.given):
        raise Refusal(
            f"ROLL's agentic pipeline reads async_generation_ratio as a whole number of steps; here {ratio}",
            shared=True,
        )
    return ratio


def _schedule(ctx: Context) -> dict[str, Any]:
    """The schedule of engines on devices of their own, from async_generation_ratio: 0, in turn
    (ROLL's synchronous pipeline); r > 0, streamed (ROLL's asynchronous one, see roll_rules.py)."""
    ratio = _ratio(ctx)
    if ratio == 0:
        return in_turn_apart()
    train = train_prompts(ctx)
    if ctx.has("actor_train.training_args.per_device_train_batch_size") or ctx.has(
        "actor_train.training_args.gradient_accumulation_steps"
    ):
        mini, _ = _mini_batch("actor_train", ctx)
    else:
        mini = hybrid_default(f"{ACTOR}.ppo_mini_batch_size")
    if train % mini:
        raise Refusal(
            f"with async_generation_ratio={ratio}, a ROLL step trains rollout_batch_size={train} prompts, and hybrid's "
            f"fully asynchronous step takes whole mini batches of groups ({mini} prompts here); rollout_batch_size "
            f"must be a multiple of the mini batch",
            shared=True,
        )
    # ROLL bounds the prompts in flight only by its budget: (1 + ratio) batches beyond the ones trained.
    return streamed(ahead=ratio, bound=ceil(ratio), require_batches=train // mini, in_flight=ceil((1 + ratio) * train))


def _async_generation_ratio(value: Any, ctx: Context) -> dict[str, Any]:
    relation = _infer_placement(ctx)
    if relation == "apart":
        return _schedule(ctx)
    if _ratio(ctx) == 0 or relation == "overlap":
        return {}  # colocated and synchronous, or the device_mapping rule reports the overlap
    raise Refusal(
        "hybrid generates ahead of training only with the engines on devices of their own: give actor_infer a "
        "device_mapping disjoint from actor_train's (ROLL's agentic pipeline requires that too; its RLVR pipeline "
        "only warns when they share devices)"
    )


def _world(ctx: Context) -> int:
    """actor_train's data-parallel size: its devices / ulysses_size (ROLL's FSDP2 strategy sets
    dp_size = world_size // cp_size, cp being the Ulysses group), what its optimizer-step batch
    per_device_train_batch_size x gradient_accumulation_steps is multiplied by."""
    if ctx.has("actor_train.device_mapping"):
        devices = len(parse_devices(ctx.get("actor_train.device_mapping")))
    else:
        devices = hybrid_default("trainer.nnodes") * hybrid_default("trainer.n_gpus_per_node")
    ulysses = ctx.get("actor_train.model_args.ulysses_size", 1) or 1
    return devices // ulysses if isinstance(ulysses, int) and devices % ulysses == 0 else devices


# ---------------------------------------------------------------- batches


def _mini_batch(role: str, ctx: Context) -> tuple[int, str]:
    """verl's mini batch (prompts) from ROLL's optimizer-step batch (samples)."""
    per_device = ctx.get(f"{role}.training_args.per_device_train_batch_size")
    accumulation = ctx.get(f"{role}.training_args.gradient_accumulation_steps")
    world = _world(ctx)
    n = samples_per_prompt(ctx)
    samples = per_device * accumulation * world
    what = (
        f"per_device_train_batch_size {per_device} x gradient_accumulation_steps {accumulation} x "
        f"{world} data-parallel ranks = {samples} samples per optimizer step"
    )
    if samples % n:
        raise Refusal(
            f"{what}, not a whole number of groups of num_return_sequences_in_group={n}; hybrid's "
            f"mini batch is counted in prompts (whole groups)",
            shared=True,
        )
    return samples // n, what


def _batches(role: str, mini_key: str, micro_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        mini, _ = _mini_batch(role, ctx)
        out = {mini_key: mini}
        if ctx.key.endswith("per_device_train_batch_size"):
            out[micro_key] = value
        return out

    return convert


def _betas(role: str, verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        return {verl_key: [ctx.get(f"{role}.training_args.adam_beta1"), ctx.get(f"{role}.training_args.adam_beta2")]}

    return convert


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
