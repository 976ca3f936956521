"""The ROLL dialect: a ROLL RLVR pipeline YAML (top-level pipeline keys, and the worker
sections actor_train, actor_infer, reference, critic, validation, rewards) translated into
hybrid's verl keys.

`python -m hybrid.main_ppo --roll-config rlvr_config.yaml [key=value ...]` composes the file
with Hydra the way ROLL's launcher does (its `defaults:` list is read relative to the file,
its interpolations such as `${response_length}` resolve against it), applies the key=value
arguments as ROLL dotted keys onto it (a key the file does not have needs +key=value, as in
ROLL), then translates every leaf. `translate_roll` returns the verl overrides or raises
ConfigError naming every key that has no equivalent, with the reason.

Units that differ are transformed: ROLL's optimizer-step batch is
`per_device_train_batch_size x gradient_accumulation_steps x len(device_mapping)` samples,
verl's `ppo_mini_batch_size` is that divided by `num_return_sequences_in_group` (prompts);
ROLL's warm-up counts optimizer steps, hybrid's training steps; `sequence_length` is prompt
plus response. hybrid runs every role on the same devices, so the worker sections must share
one `device_mapping`; its length is the number of devices. The agentic pipeline's multi-turn
keys (custom_envs, the env managers) are in roll_agentic.py.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Any

from hybrid.config.dialects.roll_agentic import AGENTIC_RULES
from hybrid.config.dialects.table import (
    NO_DUAL_CLIP,
    Context,
    Dialect,
    Refusal,
    Rule,
    choice,
    custom,
    hybrid_default,
    ignore,
    refuse,
    same,
    show,
    translate,
    via,
)

ARR = "actor_rollout_ref"
ACTOR = f"{ARR}.actor"
ROLLOUT = f"{ARR}.rollout"
REF = f"{ARR}.ref"

MEGATRON = "the Megatron strategy: hybrid trains with FSDP2 only"
DEEPSPEED = "the DeepSpeed strategy: hybrid trains with FSDP2 only"
COLOCATED = (
    "hybrid runs actor_train, actor_infer, reference and critic colocated on the same devices; "
    "give them the same device_mapping"
)
AGENTIC = (
    "a step-wise estimator of ROLL's agentic pipeline (one sample per environment step): hybrid estimates "
    "advantages per trajectory; multi-turn episodes (custom_envs) train with grpo, gae, reinforce and the others"
)
ASYNC = "hybrid is synchronous and on-policy: each step generates with the current weights, then trains"
NATIVE_TEMPLATE = "hybrid renders prompts with the tokenizer's own chat template (ROLL's `native`)"

# ROLL's defaults (roll/configs, and Hugging Face TrainingArguments under training_args) for
# keys that a rule reads together with the one given, where hybrid has no key of its own.
ROLL_DEFAULTS: dict[str, Any] = {
    "adv_estimator": "gae",
    "norm_mean_type": None,
    "norm_std_type": None,
    "whiten_advantages": False,
    "pg_clip": 0.2,
    "use_pg_clip_range": False,
    "pg_clip_low": 0.2,
    "pg_clip_high": 0.2,
    "num_gpus_per_node": 8,
    "actor_train.training_args.per_device_train_batch_size": 8,
    "actor_train.training_args.gradient_accumulation_steps": 1,
    "critic.training_args.per_device_train_batch_size": 8,
    "critic.training_args.gradient_accumulation_steps": 1,
    "actor_train.training_args.adam_beta1": 0.9,
    "actor_train.training_args.adam_beta2": 0.999,
    "critic.training_args.adam_beta1": 0.9,
    "critic.training_args.adam_beta2": 0.999,
    "actor_train.strategy_args.strategy_name": "deepspeed_train",
    "reference.strategy_args.strategy_name": "deepspeed_train",
    "critic.strategy_args.strategy_name": "deepspeed_train",
}


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


def _placement(ids: list[int], ctx: Context) -> dict[str, Any]:
    per_node = ctx.get("num_gpus_per_node")
    nodes = 1 if max(ids) + 1 <= per_node else -(-(max(ids) + 1) // per_node)
    if len(ids) % nodes:
        raise Refusal(f"{len(ids)} devices over {nodes} nodes of {per_node}: hybrid needs the same number on each node")
    return {"trainer.nnodes": nodes, "trainer.n_gpus_per_node": len(ids) // nodes}


def _device_mapping(value: Any, ctx: Context) -> dict[str, Any]:
    ids = parse_devices(value)
    if ctx.key != "actor_train.device_mapping":
        train = ctx.get("actor_train.device_mapping", None)
        if train is None or sorted(parse_devices(train)) != sorted(ids):
            raise Refusal(f"{COLOCATED} (actor_train.device_mapping={show(train)})")
    return _placement(ids, ctx)


def _world(ctx: Context) -> int:
    if ctx.has("actor_train.device_mapping"):
        return len(parse_devices(ctx.get("actor_train.device_mapping")))
    return hybrid_default("trainer.nnodes") * hybrid_default("trainer.n_gpus_per_node")


# ---------------------------------------------------------------- batches


def _mini_batch(role: str, ctx: Context) -> tuple[int, str]:
    """verl's mini batch (prompts) from ROLL's optimizer-step batch (samples)."""
    per_device = ctx.get(f"{role}.training_args.per_device_train_batch_size")
    accumulation = ctx.get(f"{role}.training_args.gradient_accumulation_steps")
    world = _world(ctx)
    n = ctx.effective("num_return_sequences_in_group", f"{ROLLOUT}.n")
    samples = per_device * accumulation * world
    what = (
        f"per_device_train_batch_size {per_device} x gradient_accumulation_steps {accumulation} x "
        f"{world} devices = {samples} samples per optimizer step"
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


def _warmup(role: str, verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        train = ctx.effective("rollout_batch_size", "data.train_batch_size")
        epochs = ctx.effective("ppo_epochs", f"{ACTOR}.ppo_epochs")
        if ctx.has(f"{role}.training_args.per_device_train_batch_size") or ctx.has(f"{role}.training_args.gradient_accumulation_steps"):
            mini, _ = _mini_batch(role, ctx)
        else:
            mini = hybrid_default(f"{ACTOR}.ppo_mini_batch_size")
        if train % mini:
            return {verl_key: value}  # hybrid's own check names the batch sizes that do not divide
        per = train // mini * epochs
        if value % per:
            raise Refusal(
                f"ROLL counts warm-up in optimizer steps and hybrid steps its schedule once per "
                f"training step, which here is {per} optimizer steps; use a multiple of {per}"
            )
        return {verl_key: value // per}

    return convert


def _betas(role: str, verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        return {verl_key: [ctx.get(f"{role}.training_args.adam_beta1"), ctx.get(f"{role}.training_args.adam_beta2")]}

    return convert


# ---------------------------------------------------------------- algorithm


def _advantage(value: Any, ctx: Context) -> dict[str, Any]:
    """adv_estimator, norm_mean_type, norm_std_type and whiten_advantages, read together."""
    est, mean, std, whiten = (ctx.get(k) for k in ("adv_estimator", "norm_mean_type", "norm_std_type", "whiten_advantages"))
    combo = f"adv_estimator={est}, norm_mean_type={show(mean)}, norm_std_type={show(std)}, whiten_advantages={show(whiten)}"
    if est == "grpo":
        # ROLL's grpo normalises rewards within each group (mean and std), as hybrid's grpo.
        if whiten:
            raise Refusal(f"{combo}: hybrid's grpo does not whiten the group-normalised advantages again", shared=True)
        return {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True}
    if est == "gae":
        if mean is not None or std is not None:
            raise Refusal(f"{combo}: no key to normalise rewards before GAE", shared=True)
        if not whiten:
            raise Refusal(f"{combo}: hybrid's gae whitens the advantages over the batch (as verl's); set whiten_advantages: true", shared=True)
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
        raise Refusal(f"{base}.weight_type={kind}: hybrid has token-level truncated importance sampling only", shared=True)
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


# ---------------------------------------------------------------- workers


def _dtype_train(prefix: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        names = {"bf16": "bf16", "fp32": "fp32"}
        if value not in names:
            raise Refusal("supported: bf16, fp32 (hybrid trains fp16 nowhere)")
        return {f"{prefix}.mixed_precision": names[value]}

    return convert


def _strategy_config(role: str):
    refused_strategies = ("megatron_train", "megatron_infer", "deepspeed_train", "deepspeed_infer", "diffusion_deepspeed_train")

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if ctx.get(f"{role}.strategy_args.strategy_name") in refused_strategies:
            return {}  # the strategy itself is refused, with its reason
        raise Refusal(f"hybrid's FSDP settings are {ACTOR}.fsdp_config.* in verl keys; no ROLL strategy_config key maps to them")

    return convert


# vLLM arguments ROLL passes through strategy_config that hybrid has its own key for.
_ENGINE_KEYS = {
    "gpu_memory_utilization": f"{ROLLOUT}.gpu_memory_utilization",
    "max_model_len": f"{ROLLOUT}.max_model_len",
    "tensor_parallel_size": f"{ROLLOUT}.tensor_model_parallel_size",
    "load_format": f"{ROLLOUT}.load_format",
    "enforce_eager": f"{ROLLOUT}.enforce_eager",
    "max_num_batched_tokens": f"{ROLLOUT}.max_num_batched_tokens",
    "max_num_seqs": f"{ROLLOUT}.max_num_seqs",
    "enable_chunked_prefill": f"{ROLLOUT}.enable_chunked_prefill",
}


def _engine_config(value: Any, ctx: Context) -> dict[str, Any]:
    name = ctx.key[len("actor_infer.strategy_args.strategy_config."):]
    if ctx.get("actor_infer.strategy_args.strategy_name", "vllm") != "vllm":
        return {}
    if name in ("pipeline_parallel_size",) and value != 1:
        raise Refusal("hybrid's engine shards by tensor parallelism only")
    if name in _ENGINE_KEYS:
        return {_ENGINE_KEYS[name]: value}
    return {f"{ROLLOUT}.engine_kwargs.vllm.{name}": value}


def _num_gpus_per_worker(value: Any, ctx: Context) -> dict[str, Any]:
    tp = ctx.get("actor_infer.strategy_args.strategy_config.tensor_parallel_size", None)
    tp = tp if tp is not None else hybrid_default(f"{ROLLOUT}.tensor_model_parallel_size")
    if value != tp:
        raise Refusal(f"an engine uses tensor_parallel_size={tp} devices in hybrid")
    return {}


DEFAULT_WORKERS = {
    "actor_train": ("roll.pipeline.rlvr.actor_worker.ActorWorker", "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker"),
    "actor_infer": ("roll.pipeline.base_worker.InferWorker",),
    "reference": ("roll.pipeline.rlvr.actor_worker.ActorWorker",),
    "critic": ("roll.pipeline.base_worker.CriticWorker",),
}
RULE_REWARD_WORKERS = ("MathRuleRewardWorker",)
REWARD_WORKER_REFUSALS = {
    "CodeSandboxRewardWorker": "runs code in a sandbox: hybrid has none; write a custom_reward_function",
    "LLMJudgeRewardWorker": "asks an LLM judge: use reward_model.* or a custom_reward_function",
    "GeneralRuleRewardWorker": "no hybrid scorer for this rule; write a custom_reward_function",
    "IfEvalRuleRewardWorker": "instruction-following checks: no hybrid scorer; write a custom_reward_function",
    "CrossThinkQARuleRewardWorker": "no hybrid scorer for this rule; write a custom_reward_function",
}


def _reward_worker(value: Any, ctx: Context) -> dict[str, Any]:
    name = str(value).rsplit(".", 1)[-1]
    if name in RULE_REWARD_WORKERS:
        return {}
    raise Refusal(REWARD_WORKER_REFUSALS.get(name, (
        "hybrid's rule scorers are gsm8k, math and arithmetic, picked by each row's data_source "
        "(reward/scorers); write a custom_reward_function for others"
    )))


def _training_rules(role: str) -> list[Rule]:
    """The keys of a trained role (actor_train, critic): batches, optimizer, packing."""
    prefix = ACTOR if role == "actor_train" else "critic"
    micro = f"{ACTOR}.ppo_micro_batch_size_per_gpu" if role == "actor_train" else "critic.ppo_micro_batch_size_per_gpu"
    mini = f"{ACTOR}.ppo_mini_batch_size" if role == "actor_train" else "critic.ppo_mini_batch_size"
    optim = f"{prefix}.optim"
    return [
        custom(f"{role}.training_args.per_device_train_batch_size", (micro, mini), _batches(role, mini, micro),
               "micro = value; mini = value x gradient_accumulation_steps x devices / num_return_sequences_in_group",
               "samples per device per micro batch; the mini batch is counted in prompts"),
        custom(f"{role}.training_args.gradient_accumulation_steps", (mini,), _batches(role, mini, micro),
               "mini = per_device_train_batch_size x value x devices / num_return_sequences_in_group"),
        same(f"{role}.training_args.learning_rate", f"{optim}.lr"),
        same(f"{role}.training_args.weight_decay", f"{optim}.weight_decay"),
        custom(f"{role}.training_args.warmup_steps", (f"{optim}.lr_warmup_steps",), _warmup(role, f"{optim}.lr_warmup_steps"),
               "optimizer steps / optimizer steps per training step", "hybrid steps the learning-rate schedule once per training step"),
        same(
            f"{role}.training_args.warmup_ratio",
            f"{optim}.lr_warmup_steps_ratio",
            note="a share of the whole run in both",
        ),
        choice(f"{role}.training_args.lr_scheduler_type", f"{optim}.warmup_style",
               {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"}),
        custom(
            f"{role}.training_args.adam_beta1",
            (f"{optim}.betas",),
            _betas(role, f"{optim}.betas"),
            "[adam_beta1, adam_beta2]",
        ),
        custom(
            f"{role}.training_args.adam_beta2",
            (f"{optim}.betas",),
            _betas(role, f"{optim}.betas"),
            "[adam_beta1, adam_beta2]",
        ),
        same(f"{role}.training_args.max_grad_norm", f"{prefix}.grad_clip"),
        ignore(
            f"{role}.training_args.num_train_epochs",
            "ROLL's runs are bounded by max_steps; the trainer's epoch count is bookkeeping",
        ),
        ignore(f"{role}.training_args.max_steps", "set by ROLL from the pipeline's max_steps"),
        ignore(f"{role}.training_args.seed", "ROLL replaces it with the pipeline's seed"),
        ignore(f"{role}.training_args.output_dir", "ROLL replaces it with the pipeline's output_dir"),
        same(f"{role}.use_dynamic_batching_in_train", f"{prefix}.use_dynamic_bsz"),
        same(f"{role}.max_tokens_per_microbatch_in_train", f"{prefix}.ppo_max_token_len_per_gpu"),
        ignore(f"{role}.sequence_length_round_in_train", "hybrid packs tokens without rounding"),
        same(
            f"{role}.use_sequence_packing",
            f"{ARR}.model.use_remove_padding" if role == "actor_train" else "critic.model.use_remove_padding",
        ),
        ignore(f"{role}.sequence_packing_args.*", "hybrid packs each micro batch's valid tokens itself"),
        custom(f"{role}.strategy_args.strategy_config.*", (), _strategy_config(role), "refused"),
    ]


def _worker_rules(role: str) -> list[Rule]:
    """The keys every ROLL worker section has."""
    infer_batch = {
        "actor_train": (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",),
        "reference": (f"{REF}.log_prob_micro_batch_size_per_gpu",),
        "critic": ("critic.forward_micro_batch_size_per_gpu",),
    }
    rules = [
        custom(f"{role}.device_mapping", ("trainer.nnodes", "trainer.n_gpus_per_node"), _device_mapping,
               "len -> devices; nodes from num_gpus_per_node" + ("" if role == "actor_train" else "; must equal actor_train's"),
               "device ids are not pinned: hybrid uses that many devices (choose them with CUDA_VISIBLE_DEVICES)" if role == "actor_train" else ""),
        refuse(
            f"{role}.worker_cls",
            f"a custom {role} worker class has no counterpart in hybrid",
            accept=DEFAULT_WORKERS[role] + (None,),
        ),
        ignore(f"{role}.model_args.flash_attn", "hybrid picks the attention kernel itself"),
        ignore(f"{role}.model_args.attn_implementation", "hybrid picks the attention kernel itself"),
        refuse(
            f"{role}.model_args.model_type",
            "hybrid loads causal language models (and a value head for the critic) by itself",
            accept=(None,),
        ),
        refuse(
            f"{role}.model_args.ulysses_size",
            "not yet; see the issue on Ulysses sequence parallelism",
            accept=(None, 1),
        ),
        ignore(f"{role}.model_args.disable_gradient_checkpointing", "no training in this role") if role in ("actor_infer", "reference") else
        via(f"{role}.model_args.disable_gradient_checkpointing",
            f"{ARR}.model.enable_gradient_checkpointing" if role == "actor_train" else "critic.model.enable_gradient_checkpointing",
            lambda v, c: not v, "negated"),
        refuse(
            f"{role}.system_envs.*",
            "hybrid sets no environment variables from its config; export them in the shell",
            accept=lambda v: not v,
            accepts="{}",
        ),
        ignore(f"{role}.offload_nccl", "hybrid's weight sync uses no NCCL buffers it could offload"),
        refuse(f"{role}.logits_in_fp32", "hybrid computes log-probs from fp32 logits", accept=(True,)),
        refuse(f"{role}.apply_loss_scale", "hybrid always scales the loss to the global batch", accept=(True,)),
        ignore(f"{role}.backend_timeout", "hybrid uses torch.distributed's default timeout"),
        ignore(f"{role}.max_concurrency", "no Ray actor concurrency setting in hybrid"),
        ignore(f"{role}.model_update_frequency", "hybrid syncs the weights into the engine before every generation"),
        ignore(f"{role}.name", "set by ROLL itself"),
    ]
    if role in infer_batch:
        rules.append(same(f"{role}.infer_batch_size", *infer_batch[role], note="samples per device per forward pass"))
    else:
        rules.append(ignore(f"{role}.infer_batch_size", "vLLM batches its requests itself"))
    if role == "actor_infer":
        rules.append(custom("actor_infer.num_gpus_per_worker", (), _num_gpus_per_worker, "must equal tensor_parallel_size"))
    else:
        rules.append(refuse(f"{role}.num_gpus_per_worker", "one device per training worker", accept=(1,)))
    if role in ("actor_train", "critic"):
        rules += _training_rules(role)
    forward = {
        "actor_train": (f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
        "reference": (f"{REF}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_max_token_len_per_gpu"),
        "critic": ("critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu"),
    }
    if role in forward:
        dynamic, max_tokens = forward[role]
        rules += [
            same(f"{role}.use_dynamic_batching_in_infer", dynamic),
            same(f"{role}.max_tokens_per_microbatch_in_infer", max_tokens),
            ignore(f"{role}.sequence_length_round_in_infer", "hybrid packs tokens without rounding"),
        ]
    return rules


def _model_path(value: Any, ctx: Context) -> dict[str, Any]:
    return {} if value is None else {f"{ARR}.model.path": value}


def _ref_model_path(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {}
    policy = ctx.get("actor_train.model_args.model_name_or_path", None) or ctx.get("pretrain", None)
    if value != policy:
        raise Refusal("hybrid's reference model is the initial policy (pretrain); a different one has no key")
    return {}


def _template(value: Any, ctx: Context) -> dict[str, Any]:
    if value in ("native", None):
        return {}
    raise Refusal(f"{NATIVE_TEMPLATE}; set template: native")


def _lists(value: Any, ctx: Context) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _interleave(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None or (isinstance(value, dict) and len(value) <= 1) or (isinstance(value, str) and "," not in value):
        return {}
    raise Refusal("hybrid reads all training files as one data set; no per-domain mixing probabilities")


RULES: tuple[Rule, ...] = (
    # ---- run
    same("exp_name", "trainer.experiment_name"),
    via("seed", ("trainer.seed", "data.seed"), lambda v, c: v, "same value", "ROLL seeds everything from it"),
    same("output_dir", "trainer.default_local_dir", note="hybrid also writes metrics.jsonl there"),
    ignore("base_dir", "hybrid writes everything under trainer.default_local_dir (output_dir)"),
    ignore("logging_dir", "hybrid's logs go to stdout"),
    ignore("rpc_timeout", "no RPC timeout in hybrid"),
    ignore("local_rank", "set by the launcher"),
    ignore("num_nodes", "ROLL computes it from device_mapping; so does hybrid"),
    custom("num_gpus_per_node", (), lambda v, c: {}, "read with device_mapping to count nodes"),
    via("track_with", "trainer.logger", _logger, "tensorboard, wandb, stdout -> console; plus file",
        "`file` (metrics.jsonl) is hybrid's run record and is always kept"),
    same("tracker_kwargs.project", "trainer.project_name"),
    same("tracker_kwargs.name", "trainer.experiment_name"),
    refuse("tracker_kwargs.api_key", "hybrid reads the W&B key from WANDB_API_KEY"),
    refuse("tracker_kwargs.log_dir", "hybrid writes TensorBoard files under trainer.default_local_dir (output_dir)"),
    refuse("tracker_kwargs.notes", "no run-notes key in hybrid"),
    refuse("tracker_kwargs.tags", "no run-tags key in hybrid"),
    same("max_steps", "trainer.total_training_steps"),
    custom("save_steps", ("trainer.save_freq", f"{ACTOR}.checkpoint.save_contents"), _save_steps,
           "save_freq = value (<= 0: only the last step); save_contents + hf_model",
           "ROLL's checkpoints hold the Hugging Face model; both save the last step"),
    custom(
        "max_ckpt_to_keep",
        ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
        _keep,
        "0 -> null (keep all), N -> N",
    ),
    refuse("logging_steps", "hybrid logs every step", accept=(1,)),
    custom("eval_steps", ("trainer.test_freq", "trainer.val_before_train"), _eval_steps,
           "N > 0 -> test_freq N, val_before_train true; <= 0 -> test_freq -1, val_before_train false",
           "ROLL validates at step 0 too whenever eval_steps > 0"),
    custom("resume_from_checkpoint", ("trainer.resume_mode", "trainer.resume_from_path"), _resume,
           "false -> disable, true -> auto, a path -> resume_path + resume_from_path"),
    ignore("checkpoint_config.*", "hybrid writes checkpoints under trainer.default_local_dir (output_dir); no upload"),
    refuse("rollout_dump_dir", "no rollout dump in hybrid", accept=(None,)),
    ignore("save_logging_board_dir", "hybrid writes metrics.jsonl under trainer.default_local_dir"),
    refuse("profiler_timeline", "no profiler switch in hybrid", accept=(False,)),
    refuse("profiler_memory", "no profiler switch in hybrid", accept=(False,)),
    ignore("profiler_output_dir", "read only with the profilers, which are refused"),
    ignore("length_profiler_dir", "read only with report_length_and_rewards, which is refused"),
    refuse("report_length_and_rewards", "no such report in hybrid", accept=(False,)),
    refuse(
        "system_envs.*",
        "hybrid sets no environment variables from its config; export them in the shell",
        accept=lambda v: not v,
        accepts="{}",
    ),
    refuse("model_download_type", "hybrid loads local folders or Hugging Face hub ids", accept=(None,)),
    refuse("rollout_mock", "no rollout dump/mock in hybrid", accept=(None,)),
    refuse("rollout_mock.*", "no rollout dump/mock in hybrid"),
    refuse("global_template", NATIVE_TEMPLATE, accept=(None, "native")),
    refuse("dataset_filter.source", "no data-set filtering by source or difficulty in hybrid", accept=(None,)),
    refuse("dataset_filter.min_difficulty", "no data-set filtering by difficulty in hybrid", accept=(None,)),
    refuse("dataset_filter.max_difficulty", "no data-set filtering by difficulty in hybrid", accept=(None,)),
    refuse("dataset_filter.num_samples", "no data-set subsampling in hybrid", accept=(0,)),
    ignore("pg_variant", "a YAML variable in ROLL's examples; actor_train.pg_variant is the one read"),
    # ---- scheduling
    refuse("async_generation_ratio", ASYNC, accept=(0, 0.0)),
    ignore("generate_opt_level", "ROLL's request scheduler; hybrid sends the whole batch to vLLM"),
    ignore("is_num_return_sequences_expand", "ROLL's request scheduler; hybrid sends the whole batch to vLLM"),
    same("max_running_requests", f"{ROLLOUT}.max_num_seqs", note="the engine's limit on concurrent sequences"),
    refuse(
        "is_use_additional_prompts",
        "no over-sampling of prompts (dynamic sampling) in hybrid's scheduler",
        accept=(False,),
    ),
    ignore("max_additional_running_prompts", "read only with is_use_additional_prompts, which is refused"),
    ignore("user_defined_rollout_loop_cls", "ROLL's agentic rollout loop"),
    same(
        "model_update_buffer_size_mb",
        f"{ROLLOUT}.update_weights_bucket_megabytes",
        note="the bucket of hybrid's in-memory weight sync",
    ),
    custom("is_offload_states", (f"{ACTOR}.fsdp_config.param_offload", f"{ACTOR}.fsdp_config.optimizer_offload"),
           lambda v, c: {f"{ACTOR}.fsdp_config.param_offload": v, f"{ACTOR}.fsdp_config.optimizer_offload": v}, "same value into both"),
    refuse(
        "is_offload_optimizer_states_in_train_step",
        "hybrid keeps the optimizer state on the device during an update",
        accept=(False,),
    ),
    # ---- sizes
    same("rollout_batch_size", "data.train_batch_size", note="prompts per step, in both"),
    same("num_return_sequences_in_group", f"{ROLLOUT}.n"),
    same("val_batch_size", "data.val_batch_size"),
    same("prompt_length", "data.max_prompt_length"),
    custom("response_length", ("data.max_response_length",), _response_length,
           "same value (ROLL reads sequence_length instead when both are given)"),
    via("sequence_length", "data.max_response_length", _sequence_length, "value - prompt_length"),
    custom("val_prompt_length", (), _val_lengths, "must equal prompt_length"),
    custom("val_sequence_length", (), _val_lengths, "must equal the training sequence length"),
    # ---- algorithm
    custom("adv_estimator", ("algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo"), _advantage,
           "grpo -> grpo; gae (whiten_advantages: true) -> gae; reinforce + group norm -> grpo; "
           "reinforce + whiten_advantages -> reinforce_plus_plus",
           "read with norm_mean_type, norm_std_type and whiten_advantages"),
    custom("norm_mean_type", ("algorithm.adv_estimator",), _advantage, "read with adv_estimator"),
    custom(
        "norm_std_type",
        ("algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo"),
        _advantage,
        "read with adv_estimator",
    ),
    custom("whiten_advantages", ("algorithm.adv_estimator",), _advantage, "read with adv_estimator"),
    same("ppo_epochs", f"{ACTOR}.ppo_epochs", note="the critic follows"),
    same("max_grad_norm", f"{ACTOR}.grad_clip"),
    refuse("l2", "no L2 term besides weight decay (training_args.weight_decay)", accept=(0, 0.0)),
    same("lambd", "algorithm.lam"),
    same("gamma", "algorithm.gamma"),
    custom("pg_clip", (f"{ACTOR}.clip_ratio", f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high"), _clip,
           "clip_ratio, clip_ratio_low and clip_ratio_high = pg_clip (or pg_clip_low/high with use_pg_clip_range)"),
    custom("use_pg_clip_range", (f"{ACTOR}.clip_ratio_low", f"{ACTOR}.clip_ratio_high"), _clip, "read with pg_clip"),
    custom("pg_clip_low", (f"{ACTOR}.clip_ratio_low",), _clip, "read with use_pg_clip_range"),
    custom("pg_clip_high", (f"{ACTOR}.clip_ratio_high",), _clip, "read with use_pg_clip_range"),
    custom("dual_clip_loss", (f"{ACTOR}.clip_ratio_c",), _dual_clip,
           f"true -> 3, false -> {NO_DUAL_CLIP:g} (a bound that never binds)"),
    custom("value_clip", ("critic.cliprange_value",), _value_clip, "same value; null only without a critic"),
    via("kl_penalty", "algorithm.kl_penalty", _kl_penalty, "kl, abs, mse, full; k3 -> low_var_kl"),
    custom("target_kl", ("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.target_kl"), _target_kl,
           "null -> fixed; a value -> adaptive with that target"),
    same(
        "init_kl_coef",
        "algorithm.kl_ctrl.kl_coef",
        note="the in-reward KL coefficient (used with add_token_level_kl)",
    ),
    same("kl_horizon", "algorithm.kl_ctrl.horizon"),
    same("add_token_level_kl", "algorithm.use_kl_in_reward"),
    same("use_kl_loss", f"{ACTOR}.use_kl_loss"),
    same("kl_loss_coef", f"{ACTOR}.kl_loss_coef"),
    same("entropy_loss_coef", f"{ACTOR}.entropy_coeff"),
    choice("loss_agg_mode", f"{ACTOR}.loss_agg_mode",
           {m: m for m in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")},
           note="ROLL's default is seq-mean-token-mean, hybrid's token-mean"),
    same("critic_warmup", "trainer.critic_warmup"),
    ignore("enable_reference", "hybrid builds the reference whenever a KL term needs it"),
    custom("enable_old_logprobs_recompute", (f"{ACTOR}.skip_old_log_prob_on_policy",), _recompute, "negated"),
    custom(
        "force_disable_old_logprobs_recompute",
        (f"{ACTOR}.skip_old_log_prob_on_policy",),
        _recompute,
        "true -> skip",
    ),
    refuse("use_reward_scaling", "no reward scaling key in hybrid", accept=(False,)),
    refuse("use_reward_norm", "no reward normalisation key besides the estimator's own", accept=(False,)),
    refuse(
        "add_len_reward",
        "no length reward in hybrid (reward_model.reward_manager=dapo has an overlong penalty)",
        accept=(False,),
    ),
    refuse("reward_clip", "no reward clipping key in hybrid", accept=(None,)),
    refuse("whiten_rewards", "no reward whitening key in hybrid", accept=(False,)),
    refuse("advantage_clip", "no advantage clipping key in hybrid", accept=(None,)),
    choice("use_policy_loss_type", f"{ACTOR}.policy_loss.loss_mode", {"PPO": "vanilla", "PG": "gpg"},
           note="PG: the plain policy gradient -A log p"),
    refuse("use_topr_loss", "no TOPR loss in hybrid", accept=(False,)),
    refuse("use_topr_neg_loss_coef", "no TOPR loss in hybrid", accept=(0, 0.0)),
    refuse("postive_loss_coef", "no SFT term on positive samples in hybrid", accept=(0, 0.0)),
    refuse("rl_loss_coef", "hybrid's policy loss has no coefficient", accept=(1, 1.0)),
    refuse(
        "importance_sampling",
        "hybrid's PPO ratio is per token (policy_loss.loss_mode=gspo is GSPO's sequence ratio)",
        accept=("token",),
    ),
    refuse("difficulty_loss_weight", "no difficulty loss weight in hybrid", accept=(False,)),
    refuse("length_loss_weight", "no length loss weight in hybrid", accept=(False,)),
    refuse("max_len_mask", "no key to mask truncated responses out of the loss", accept=(False,)),
    refuse(
        "difficulty_mask",
        "no difficulty mask in hybrid (algorithm.filter_groups drops groups without variance instead)",
        accept=(False,),
    ),
    ignore("difficulty_low_threshold", "read only with difficulty_mask, which is refused"),
    ignore("difficulty_high_threshold", "read only with difficulty_mask, which is refused"),
    refuse("error_max_len_clip", "no such mask in hybrid", accept=(False,)),
    ignore("error_max_len_threshold", "read only with error_max_len_clip, which is refused"),
    refuse(
        "balance_length",
        "no length balancing in hybrid (trainer.balance_batch balances tokens across devices)",
        accept=(False,),
    ),
    refuse("minibatch_data_iter_num", "one pass per mini batch (ppo_epochs repeats the whole batch)", accept=(1,)),
    ignore("mask_type", "read only with the masks above, which are refused"),
    custom("train_infer_correction.is_weight.enabled", (f"{ACTOR}.tis_imp_ratio_cap",), _is_weight,
           "true -> tis_imp_ratio_cap = upper_bound (token weights); false -> -1"),
    custom(
        "train_infer_correction.is_weight.upper_bound",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _is_weight,
        "read with enabled=true",
    ),
    custom("train_infer_correction.is_weight.weight_type", (f"{ACTOR}.tis_imp_ratio_cap",), _is_weight, "token only"),
    refuse(
        "train_infer_correction.is_weight.detach",
        "hybrid's importance weights are always detached",
        accept=(True,),
    ),
    refuse(
        "train_infer_correction.filters",
        "no train/inference mismatch filters in hybrid",
        accept=lambda v: not v,
        accepts="[]",
    ),
    via(
        "val_greedy",
        f"{ROLLOUT}.val_kwargs.do_sample",
        lambda v, c: not v,
        "true -> greedy (do_sample false, temperature 0)",
    ),
    same("val_n_sample", f"{ROLLOUT}.val_kwargs.n"),
    # ---- models
    custom("pretrain", (f"{ARR}.model.path",), _model_path, "same value"),
    custom("reward_pretrain", ("critic.model.path",), lambda v, c: {} if v is None else {"critic.model.path": v}, "same value",
           "ROLL starts the critic from it"),
    custom("actor_train.model_args.model_name_or_path", (f"{ARR}.model.path",), _model_path, "same value"),
    custom("actor_infer.model_args.model_name_or_path", (f"{ARR}.model.path",), _model_path, "must equal the actor's",
           "the engine serves the policy being trained"),
    custom("reference.model_args.model_name_or_path", (), _ref_model_path, "must equal the actor's"),
    custom(
        "critic.model_args.model_name_or_path",
        ("critic.model.path",),
        lambda v, c: {} if v is None else {"critic.model.path": v},
        "same value",
    ),
    custom(
        "actor_train.model_args.dtype",
        (f"{ACTOR}.fsdp_config.mixed_precision",),
        _dtype_train(f"{ACTOR}.fsdp_config"),
        "bf16, fp32",
    ),
    custom(
        "reference.model_args.dtype",
        (f"{REF}.fsdp_config.mixed_precision",),
        _dtype_train(f"{REF}.fsdp_config"),
        "bf16, fp32",
    ),
    custom(
        "critic.model_args.dtype",
        ("critic.model.fsdp_config.mixed_precision",),
        _dtype_train("critic.model.fsdp_config"),
        "bf16, fp32",
    ),
    choice(
        "actor_infer.model_args.dtype",
        f"{ROLLOUT}.dtype",
        {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"},
    ),
    same("actor_train.model_args.lora_rank", f"{ARR}.model.lora_rank"),
    same("actor_train.model_args.lora_alpha", f"{ARR}.model.lora_alpha"),
    same("actor_train.model_args.lora_target", f"{ARR}.model.target_modules"),
    refuse("actor_train.model_args.lora_dropout", "hybrid's LoRA has no dropout key", accept=(None, 0, 0.0)),
    refuse(
        "actor_train.pg_variant",
        "ROLL's policy-gradient variants other than ppo have no mapping; hybrid's losses are actor_rollout_ref.actor.policy_loss.loss_mode",
        accept=(None, "ppo"),
    ),
    ignore("actor_train.topr_positive_weight", "read only with use_topr_loss, which is refused"),
    ignore("actor_train.topr_negative_weight", "read only with use_topr_loss, which is refused"),
    # ---- strategies
    choice("actor_train.strategy_args.strategy_name", f"{ACTOR}.strategy", {"fsdp2_train": "fsdp2"},
           refused={"megatron_train": MEGATRON, "deepspeed_train": DEEPSPEED, "diffusion_deepspeed_train": DEEPSPEED}),
    choice("critic.strategy_args.strategy_name", "critic.strategy", {"fsdp2_train": "fsdp2"},
           refused={"megatron_train": MEGATRON, "deepspeed_train": DEEPSPEED}),
    choice("reference.strategy_args.strategy_name", f"{REF}.strategy", {"fsdp2_infer": "fsdp2", "fsdp2_train": "fsdp2", "hf_infer": "fsdp2"},
           refused={"megatron_infer": MEGATRON, "megatron_train": MEGATRON, "deepspeed_infer": DEEPSPEED, "deepspeed_train": DEEPSPEED},
           note="the reference runs FSDP2 forward passes inside hybrid's actor worker"),
    custom("reference.strategy_args.strategy_config.*", (), _strategy_config("reference"), "refused"),
    choice("actor_infer.strategy_args.strategy_name", f"{ROLLOUT}.name", {"vllm": "vllm", "hf_infer": "hf"},
           refused={"sglang": "hybrid's engines are in-process vLLM and Hugging Face generate"}),
    custom("actor_infer.strategy_args.strategy_config.*", (f"{ROLLOUT}.<key>", f"{ROLLOUT}.engine_kwargs.vllm.<key>"), _engine_config,
           "gpu_memory_utilization, max_model_len, tensor_parallel_size, load_format, enforce_eager, max_num_batched_tokens, "
           "max_num_seqs, enable_chunked_prefill -> rollout keys; others -> engine_kwargs.vllm"),
    # ---- generation
    same("actor_infer.generating_args.max_new_tokens", "data.max_response_length"),
    same("actor_infer.generating_args.temperature", f"{ROLLOUT}.temperature"),
    same("actor_infer.generating_args.top_p", f"{ROLLOUT}.top_p"),
    same("actor_infer.generating_args.top_k", f"{ROLLOUT}.top_k"),
    same("actor_infer.generating_args.repetition_penalty", f"{ROLLOUT}.repetition_penalty"),
    same("actor_infer.generating_args.do_sample", f"{ROLLOUT}.do_sample"),
    same("actor_infer.generating_args.stop_strings", f"{ROLLOUT}.stop"),
    refuse("actor_infer.generating_args.num_beams", "hybrid samples; no beam search", accept=(1,)),
    ignore(
        "actor_infer.generating_args.num_return_sequences",
        "ROLL's RLVR pipeline overwrites it with num_return_sequences_in_group",
    ),
    # ---- data
    via("actor_train.data_args.file_name", "data.train_files", _lists, "list of files",
        "files in verl's columns (prompt, data_source, reward_model.ground_truth): parquet, JSON or JSON-lines"),
    same("actor_train.data_args.prompt", "data.prompt_key"),
    same("actor_train.data_args.messages", "data.prompt_key", note="a chat-list column"),
    custom("actor_train.data_args.template", (), _template, "native accepted"),
    ignore("actor_train.data_args.dataset_dir", "file_name is read as given"),
    ignore("actor_train.data_args.preprocessing_num_workers", "hybrid tokenises prompts as batches are drawn"),
    custom("actor_train.data_args.domain_interleave_probs", (), _interleave, "one domain accepted"),
    custom("actor_train.data_args.interleave_probs", (), _interleave, "one file accepted"),
    custom("actor_infer.data_args.template", (), _template, "native accepted"),
    custom("reference.data_args.template", (), _template, "native accepted"),
    custom("critic.data_args.template", (), _template, "native accepted"),
    # ---- validation
    via("validation.data_args.file_name", "data.val_files", _lists, "list of files"),
    custom("validation.data_args.template", (), _template, "native accepted"),
    same("validation.data_args.prompt", "data.prompt_key"),
    same("validation.data_args.messages", "data.prompt_key"),
    same("validation.generating_args.temperature", f"{ROLLOUT}.val_kwargs.temperature"),
    same("validation.generating_args.top_p", f"{ROLLOUT}.val_kwargs.top_p"),
    same("validation.generating_args.top_k", f"{ROLLOUT}.val_kwargs.top_k"),
    same("validation.generating_args.do_sample", f"{ROLLOUT}.val_kwargs.do_sample"),
    same("validation.generating_args.num_return_sequences", f"{ROLLOUT}.val_kwargs.n"),
    same(
        "validation.generating_args.max_new_tokens",
        "data.max_response_length",
        note="hybrid validates with the training response length",
    ),
    refuse("validation.generating_args.num_beams", "hybrid samples; no beam search", accept=(1,)),
    custom("validation.eval_steps", ("trainer.test_freq", "trainer.val_before_train"), _eval_steps, "as eval_steps"),
    # ---- rewards
    custom("rewards.<domain>.worker_cls", (), _reward_worker, "rule-based math workers accepted",
           "hybrid picks the scorer from each row's data_source (gsm8k, math, arithmetic)"),
    ignore("rewards.<domain>.tag_included", "hybrid routes rows to scorers by their data_source column"),
    ignore(
        "rewards.<domain>.world_size",
        "hybrid's rule scorers run in the driver (or reward_model.reward_manager=prime's pool)",
    ),
    ignore("rewards.<domain>.infer_batch_size", "rule scorers score one response at a time"),
    ignore("rewards.<domain>.model_args.*", "rule scorers load no model"),
    ignore("rewards.<domain>.data_args.*", "rule scorers read the decoded response"),
    refuse(
        "rewards.<domain>.query_filter_config.type",
        "no reward-based query filter in hybrid",
        accept=("no_filter",),
    ),
    refuse(
        "rewards.<domain>.response_filter_config.type",
        "no reward-based response filter in hybrid",
        accept=("no_filter",),
    ),
    ignore("rewards.<domain>.query_filter_config.filter_args.*", "read only with a filter type, which is refused"),
    ignore("rewards.<domain>.response_filter_config.filter_args.*", "read only with a filter type, which is refused"),
    refuse(
        "rewards.<domain>.response_length_penalty_coef",
        "no length penalty key (reward_model.reward_manager=dapo has an overlong penalty)",
        accept=(0, 0.0),
    ),
    refuse(
        "rewards.<domain>.reward_manager_config",
        "no reward plug-in system besides custom_reward_function",
        accept=lambda v: not v,
        accepts="[]",
    ),
    refuse(
        "rewards.<domain>.judge_model_name",
        "an LLM judge: use reward_model.* or a custom_reward_function",
        accept=(None,),
    ),
    refuse(
        "rewards.<domain>.judge_api_url",
        "an LLM judge: use reward_model.* or a custom_reward_function",
        accept=(None,),
    ),
    refuse("rewards.<domain>.code_url", "a code sandbox: write a custom_reward_function", accept=(None,)),
    refuse("reward_model.*", "ROLL's shared reward-model cluster: use reward_model.* in verl keys"),
    refuse("critic.generating_args.*", "the critic generates nothing"),
    *(rule for role in ("actor_train", "actor_infer", "reference", "critic") for rule in _worker_rules(role)),
    *AGENTIC_RULES,
)

DIALECT = Dialect(
    name="ROLL",
    rules=RULES,
    aliases={},
    defaults=ROLL_DEFAULTS,
    always={"trainer.merge_on_finish": False, "trainer.plot_on_finish": False},
    always_why=(
        "ROLL writes no merged folder and no plots at the end of a run; its checkpoints already hold "
        "the Hugging Face model (save_steps)"
    ),
    notes=(
        "Keys the file does not give take hybrid's defaults (hybrid/config/ppo_trainer.yaml), not ROLL's, "
        "except where one key is read together with others (the advantage settings, the clip range, the "
        "optimizer-step batch): there the missing ones take ROLL's defaults. Notably ROLL's adv_estimator "
        "defaults to gae, loss_agg_mode to seq-mean-token-mean (hybrid: token-mean), init_kl_coef to 0.2.",
        "Data files use verl's columns (prompt, data_source, reward_model.ground_truth, extra_info); "
        "ROLL's tag column does not route rows, each row's data_source picks the scorer.",
        "Multi-turn: a custom_envs section (the agentic pipeline's) sets hybrid's multi_turn section; the "
        "episodes start from the data file's rows, whose env_class column picks the environment where "
        "custom_envs names none (roll_agentic.py has the details).",
    ),
)


def translate_roll(path: str, overrides: list[str]) -> list[str]:
    """A ROLL pipeline YAML plus ROLL dotted `key=value` overrides -> verl overrides
    (`hydra.*` overrides pass through unchanged). Raises ConfigError listing every problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hybrid.config import ConfigError

    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise ConfigError(f"--roll-config {path}: no such file (working directory {os.getcwd()})")
    passthrough = [o for o in overrides if o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    roll_overrides = [o for o in overrides if o not in passthrough]
    name = os.path.splitext(os.path.basename(full))[0]
    try:
        with initialize_config_dir(config_dir=os.path.dirname(full), version_base=None):
            cfg = compose(config_name=name, overrides=roll_overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"--roll-config {path}: ROLL's file or overrides cannot be composed: {err}") from err

    problems, given = [], {}
    for key, raw in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
            given[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except OmegaConfBaseException as err:
            rule = DIALECT.rule_for(key)
            if rule is not None and rule.kind == "ignore":
                continue
            problems.append(f"{key}={show(raw)}: cannot resolve the value ({type(err).__name__}: {err})".replace("\n", " "))
    if problems:
        raise ConfigError("\n".join([f"--roll-config {path} cannot be read:"] + [f"  - {p}" for p in problems]))
    return translate(DIALECT, given) + passthrough


def _leaves(tree: Any, prefix: str = ""):
    """(dotted key, unresolved value) for every leaf; a whole-dict interpolation is a leaf."""
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, dict) and value:
            yield from _leaves(value, key)
        else:
            yield key, value


__all__ = ["DIALECT", "RULES", "parse_devices", "translate_roll"]
