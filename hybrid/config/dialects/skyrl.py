"""The SkyRL dialect: SkyRL's command-line keys (`trainer.*`, `generator.*`, `data.*`,
`environment.*`, as in skyrl-train's YAML and its config dataclasses) translated into
hybrid's verl keys.

`python -m hybrid.main_ppo --dialect skyrl trainer.train_batch_size=16 ...` reads every
`key=value` as a SkyRL key. Both spellings SkyRL accepts work: the dataclass paths
(`generator.inference_engine.backend`) and the older YAML ones (`generator.backend`), listed
in ALIASES. Values may use OmegaConf interpolation (`${oc.env:HOME}/data`, or another SkyRL
key given on the same line). `translate_skyrl` returns the verl overrides or raises
ConfigError naming every key that has no equivalent, with the reason.

Units match verl's almost everywhere (SkyRL's `policy_mini_batch_size` is in prompts, its
micro batches in samples per GPU, like verl); the exceptions are transformed here:
warm-up steps (SkyRL counts optimizer steps, hybrid training steps), the weight-transfer
bucket (GB -> MB), KL estimator and loss-reduction names, and SkyRL's plain PPO clip
(`policy_loss_type=regular`), which is hybrid's dual-clip loss with a bound that never binds.
The multi-turn keys (generator.max_turns, the token budgets, environment.*) are in
skyrl_multi_turn.py.
"""

from __future__ import annotations

from typing import Any

from hybrid.config.dialects.skyrl_multi_turn import ENVIRONMENT_RULES, GENERATOR_RULES
from hybrid.config.dialects.table import (
    NO_DUAL_CLIP,
    Context,
    Dialect,
    Refusal,
    Rule,
    choice,
    custom,
    ignore,
    refuse,
    same,
    translate,
    via,
)

ARR = "actor_rollout_ref"
ACTOR = f"{ARR}.actor"
ROLLOUT = f"{ARR}.rollout"
REF = f"{ARR}.ref"

# Reasons repeated across several keys.
COLOCATED = "hybrid always colocates training and generation on the same devices"
SAME_DEVICES = "hybrid places every role (policy, reference, critic, engine) on the same devices as the policy"
MEGATRON = "the Megatron backend: hybrid trains with FSDP2 only"
DEEPSPEED = "the DeepSpeed backend: hybrid trains with FSDP2 only"
ULYSSES = "not yet; see the issue on Ulysses sequence parallelism (hybrid shards only with FSDP)"
IN_PROCESS = "hybrid's engine runs in-process in each training worker and receives the weights in memory"
ASYNC = "hybrid is synchronous and on-policy: each step generates with the current weights, then trains"

# SkyRL defaults that a rule reads when a key it depends on is not given and hybrid has no
# key for it (from SkyRL's config dataclasses).
SKYRL_DEFAULTS: dict[str, Any] = {
    "trainer.algorithm.clip_ratio_c": 3.0,
    "trainer.algorithm.entropy_loss_coef": 0.01,
    "trainer.algorithm.tis_imp_ratio_cap": -1.0,
    "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high": 2.0,
    "trainer.algorithm.cispo.cispo_eps_clip_low": 0.0,
    "trainer.algorithm.cispo.cispo_eps_clip_high": 5.0,
    "trainer.algorithm.dynamic_sampling.max_sample_batches": 30,
    "generator.sampling_params.stop": None,
}

# Older YAML spellings (skyrl-train's ppo_base_config.yaml) -> the dataclass paths.
_ENGINE_KEYS = (
    "model_dtype", "run_engines_locally", "backend", "weight_sync_backend", "async_engine",
    "vllm_v1_disable_multiproc", "enable_prefix_caching", "enable_chunked_prefill",
    "max_num_batched_tokens", "enforce_eager", "gpu_memory_utilization", "max_num_seqs",
    "override_existing_update_group", "enable_http_endpoint", "http_endpoint_host",
    "http_endpoint_port", "served_model_name", "distributed_executor_backend",
    "fully_sharded_loras", "enable_ray_prometheus_stats", "weight_transfer_threshold_cuda_ipc_GB",
)
ALIASES: dict[str, str] = {
    **{f"generator.{k}": f"generator.inference_engine.{k}" for k in _ENGINE_KEYS},
    "generator.num_inference_engines": "generator.inference_engine.num_engines",
    "generator.inference_engine_tensor_parallel_size": "generator.inference_engine.tensor_parallel_size",
    "generator.inference_engine_pipeline_parallel_size": "generator.inference_engine.pipeline_parallel_size",
    "generator.inference_engine_expert_parallel_size": "generator.inference_engine.expert_parallel_size",
    "generator.inference_engine_data_parallel_size": "generator.inference_engine.data_parallel_size",
    "generator.remote_inference_engine_urls": "generator.inference_engine.remote_urls",
    "generator.engine_init_kwargs.": "generator.inference_engine.engine_init_kwargs.",
    "trainer.algorithm.ppo_loss_type": "trainer.algorithm.policy_loss_type",
    "trainer.num_warmup_steps": "trainer.policy.optimizer_config.num_warmup_steps",
}


# ---------------------------------------------------------------- converters


def _logger(value: Any, ctx: Context) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    for name in names:
        if name not in ("console", "wandb", "tensorboard", "mlflow"):
            raise Refusal(f"logger {name!r} is not one of hybrid's (console, wandb, tensorboard, mlflow, file)")
    # `file` (metrics.jsonl) is hybrid's run record; it never replaces what SkyRL logs.
    return names + ([] if "file" in names else ["file"])


def _lists(value: Any, ctx: Context) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _optimizer_steps_per_training_step(ctx: Context) -> tuple[int, str]:
    train = ctx.effective("trainer.train_batch_size", "data.train_batch_size")
    mini = ctx.effective("trainer.policy_mini_batch_size", f"{ACTOR}.ppo_mini_batch_size")
    epochs = ctx.effective("trainer.update_epochs_per_batch", f"{ACTOR}.ppo_epochs")
    if not all(isinstance(v, int) and v > 0 for v in (train, mini, epochs)) or train % mini:
        raise Refusal(
            f"cannot count optimizer steps per training step from train_batch_size={train}, "
            f"policy_mini_batch_size={mini}, update_epochs_per_batch={epochs}"
        )
    per = train // mini * epochs
    return per, (
        f"{per} optimizer steps (train_batch_size {train} / policy_mini_batch_size {mini} x "
        f"update_epochs_per_batch {epochs})"
    )


def _warmup(value: Any, ctx: Context) -> int:
    if not isinstance(value, int) or value < 0:
        raise Refusal("must be an integer >= 0")
    per, what = _optimizer_steps_per_training_step(ctx)
    if value % per:
        raise Refusal(
            f"SkyRL counts warm-up in optimizer steps and hybrid steps its schedule once per training "
            f"step, which here is {what}; use a multiple of {per}"
        )
    return value // per


def _kl_kind(value: Any) -> str:
    kinds = {"k1": "kl", "k2": "mse", "k3": "low_var_kl", "abs": "abs"}
    if value not in kinds:
        raise Refusal("supported: k1, k2, k3, abs")
    return kinds[value]


def _kl_estimator(value: Any, ctx: Context) -> dict[str, Any]:
    kind = _kl_kind(value)
    # SkyRL uses one estimator for the KL loss and the KL in the reward.
    return {f"{ACTOR}.kl_loss_type": kind, "algorithm.kl_penalty": kind}


def _legacy_kl_flag(kind: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if value is not True:
            return {}
        if ctx.has("trainer.algorithm.kl_estimator_type") and ctx.get("trainer.algorithm.kl_estimator_type") != kind:
            raise Refusal("contradicts trainer.algorithm.kl_estimator_type; give only kl_estimator_type")
        return _kl_estimator(kind, ctx)

    return convert


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
    raise Refusal(
        "supported: regular, dual_clip, gspo, clip_cov, kl_cov, cispo, sapo (a loss from SkyRL's "
        "PolicyLossRegistry can be registered in hybrid through actor_rollout_ref.model.external_lib)"
    )


def _policy_loss_is(ctx: Context, *names: str) -> bool:
    return ctx.has("trainer.algorithm.policy_loss_type") and ctx.get("trainer.algorithm.policy_loss_type") in names


def _eps_clip(verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        # SkyRL's cispo reads its own bounds (trainer.algorithm.cispo.*), not these.
        return {} if _policy_loss_is(ctx, "cispo") else {verl_key: value}

    return convert


def _cispo_bound(verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        return {verl_key: value} if _policy_loss_is(ctx, "cispo") else {}

    return convert


def _clip_ratio_c(value: Any, ctx: Context) -> dict[str, Any]:
    # With policy_loss_type=regular SkyRL never reads it (the loss rule writes the bound).
    return {} if _policy_loss_is(ctx, "regular", "cispo", "gspo", "clip_cov", "kl_cov", "sapo") else {
        f"{ACTOR}.clip_ratio_c": value
    }


def _entropy(value: Any, ctx: Context) -> dict[str, Any]:
    use = ctx.get("trainer.algorithm.use_entropy_loss", False)
    if ctx.key == "trainer.algorithm.entropy_loss_coef" and use is not True:
        return {}  # SkyRL reads the coefficient only with use_entropy_loss=true
    return {f"{ACTOR}.entropy_coeff": ctx.get("trainer.algorithm.entropy_loss_coef") if use is True else 0.0}


def _temperature(value: Any, ctx: Context) -> dict[str, Any]:
    sampling = ctx.effective("generator.sampling_params.temperature", f"{ROLLOUT}.temperature")
    if value is None or value == sampling:
        return {}
    raise Refusal(
        f"hybrid scales the policy's logits by the sampling temperature ({sampling}, "
        f"generator.sampling_params.temperature); a different one has no key"
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
        return {f"{ACTOR}.tis_imp_ratio_cap": float(ctx.get("trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high"))}
    raise Refusal("only token-level truncated importance sampling exists in hybrid (actor_rollout_ref.actor.tis_imp_ratio_cap)")


def _token_tis_clip(value: Any, ctx: Context) -> dict[str, Any]:
    if ctx.get("trainer.algorithm.off_policy_correction.tis_ratio_type", None) == "token":
        return {f"{ACTOR}.tis_imp_ratio_cap": float(value)}
    return {}


def _dynamic_sampling(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {"algorithm.filter_groups.enable": False}
    if value == "filter":
        batches = ctx.get("trainer.algorithm.dynamic_sampling.max_sample_batches")
        return {
            "algorithm.filter_groups.enable": True,
            # SkyRL keeps the groups whose rewards vary: the sum of the token-level scores.
            "algorithm.filter_groups.metric": "seq_reward",
            "algorithm.filter_groups.max_num_gen_batches": 0 if batches < 0 else batches,
        }
    raise Refusal("only type=filter exists in hybrid (algorithm.filter_groups); replace has no equivalent")


def _max_sample_batches(value: Any, ctx: Context) -> dict[str, Any]:
    if ctx.get("trainer.algorithm.dynamic_sampling.type", None) != "filter":
        return {}
    return {"algorithm.filter_groups.max_num_gen_batches": 0 if value < 0 else value}


def _resume_mode(value: Any, ctx: Context) -> str:
    modes = {None: "disable", "none": "disable", "latest": "auto", "from_path": "resume_path"}
    if value not in modes:
        raise Refusal("supported: none, latest, from_path")
    return modes[value]


def _max_ckpts(value: Any, ctx: Context) -> dict[str, Any]:
    if value == 0:
        raise Refusal("0 keeps nothing; use -1 (keep all) or N > 0")
    keep = None if value < 0 else value
    return {"trainer.max_actor_ckpt_to_keep": keep, "trainer.max_critic_ckpt_to_keep": keep}


def _hf_save_interval(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None or value <= 0:
        return {}
    ckpt = ctx.effective("trainer.ckpt_interval", "trainer.save_freq")
    if value != ckpt:
        raise Refusal(
            f"hybrid writes Hugging Face folders with its checkpoints (save_contents hf_model), every "
            f"trainer.ckpt_interval={ckpt} steps; give both the same interval"
        )
    return {f"{ACTOR}.checkpoint.save_contents": ["model", "optimizer", "extra", "hf_model"]}


def _epochs(value: Any, ctx: Context) -> dict[str, Any]:
    # hybrid's default job stops after trainer.total_training_steps; SkyRL runs whole epochs.
    return {"trainer.total_epochs": value, "trainer.total_training_steps": None}


def _same_as_policy(policy_key: str, verl_key: str):
    def check(value: Any, ctx: Context) -> dict[str, Any]:
        policy = ctx.effective(policy_key, verl_key)
        if value != policy:
            raise Refusal(f"{SAME_DEVICES} ({policy_key}={policy})")
        return {}

    return check


def _ref_path(value: Any, ctx: Context) -> dict[str, Any]:
    if value is None:
        return {}
    if ctx.has("trainer.policy.model.path") and ctx.get("trainer.policy.model.path") == value:
        return {}
    raise Refusal(
        "hybrid's reference model is the initial policy (trainer.policy.model.path); a different "
        "reference model has no key"
    )


def _num_engines(value: Any, ctx: Context) -> dict[str, Any]:
    nodes = ctx.effective("trainer.placement.policy_num_nodes", "trainer.nnodes")
    gpus = ctx.effective("trainer.placement.policy_num_gpus_per_node", "trainer.n_gpus_per_node")
    tp = ctx.effective("generator.inference_engine.tensor_parallel_size", f"{ROLLOUT}.tensor_model_parallel_size")
    if value * tp != nodes * gpus:
        raise Refusal(
            f"hybrid runs one engine per tensor-parallel group of the policy's {nodes * gpus} devices "
            f"({nodes * gpus // tp} engines of tensor_parallel_size {tp})"
        )
    return {}


def _bucket_mb(value: Any, ctx: Context) -> int:
    return max(1, int(round(float(value) * 1024)))


def free_form(key: str, verl_prefix: str) -> Rule:
    """`<dict>.*` -> the same names below a verl dict that is passed through as keyword
    arguments (model config fields, vLLM engine arguments, chat-template arguments)."""
    start = len(key) - 1  # the dialect key without its `*`

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        return {f"{verl_prefix}.{ctx.key[start:]}": value}

    return custom(key, (f"{verl_prefix}.<key>",), convert, "same name and value")


def _additional_sampling(value: Any, ctx: Context) -> dict[str, Any]:
    name = ctx.key.rsplit(".", 1)[-1]
    known = ("presence_penalty", "frequency_penalty", "stop_token_ids", "repetition_penalty", "min_p", "ignore_eos")
    if name not in known:
        raise Refusal(f"hybrid passes only these further SamplingParams to vLLM: {', '.join(known)}")
    return {f"{ROLLOUT}.{name}": value}


def _eval_equal(train_key: str, verl_key: str, what: str):
    def check(value: Any, ctx: Context) -> dict[str, Any]:
        train = ctx.effective(train_key, verl_key) if verl_key else ctx.get(train_key)
        if value != train:
            raise Refusal(f"hybrid validates with the training {what} ({train_key}={train}); it has no separate key")
        return {}

    return check


def _eval_temperature(value: Any, ctx: Context) -> dict[str, Any]:
    return {f"{ROLLOUT}.val_kwargs.temperature": value, f"{ROLLOUT}.val_kwargs.do_sample": value > 0}


def _logprobs(value: Any, ctx: Context) -> bool:
    # SkyRL keeps the sampled token's log-prob for off-policy correction, as hybrid does.
    return value is not None


def _lora_init(value: Any, ctx: Context) -> dict[str, Any]:
    if value == "kaiming":
        return {}  # PEFT's default init_lora_weights=True: Kaiming-uniform A, zero B
    raise Refusal("hybrid initialises LoRA with PEFT's default (kaiming); no key for another")


def _fsdp_mixed_precision(prefix: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        leaf = ctx.key.rsplit(".", 1)[-1]
        if leaf == "param_dtype":
            names = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32"}
            if value not in names:
                raise Refusal("supported: bf16, fp32")
            return {f"{prefix}.mixed_precision": names[value]}
        if value in ("fp32", "float32"):
            return {}  # hybrid reduces gradients and keeps buffers in fp32
        raise Refusal("hybrid reduces gradients and keeps buffers in fp32")

    return convert


def _remote_urls(value: Any, ctx: Context) -> dict[str, Any]:
    if not value or ctx.get("generator.inference_engine.run_engines_locally", True) is True:
        return {}
    raise Refusal(f"remote engines: {IN_PROCESS}")


def _normalize_values(value: Any, ctx: Context) -> dict[str, Any]:
    # SkyRL normalises the critic's values; without a critic (grpo, rloo, ...) it is unread.
    if value is not True or ctx.effective("trainer.algorithm.advantage_estimator", "algorithm.adv_estimator") != "gae":
        return {}
    raise Refusal("no key to normalise the critic's values")


def _critic_path(value: Any, ctx: Context) -> dict[str, Any]:
    return {} if value is None else {"critic.model.path": value}


RULES = (
    # ---- data
    via(
        "data.train_data",
        "data.train_files",
        _lists,
        "list of files",
        "parquet (or JSON-lines) files in verl's columns: prompt, data_source, reward_model.ground_truth; single-turn scorers read reward_model, environments reward_spec (or reward_model)",
    ),
    via("data.val_data", "data.val_files", _lists, "list of files"),
    # ---- models
    same("trainer.policy.model.path", f"{ARR}.model.path"),
    same("trainer.policy.model.lora.rank", f"{ARR}.model.lora_rank"),
    same("trainer.policy.model.lora.alpha", f"{ARR}.model.lora_alpha"),
    same("trainer.policy.model.lora.target_modules", f"{ARR}.model.target_modules"),
    same("trainer.policy.model.lora.exclude_modules", f"{ARR}.model.exclude_modules"),
    refuse("trainer.policy.model.lora.dropout", "hybrid's LoRA has no dropout key", accept=(0, 0.0)),
    custom("trainer.policy.model.lora.init_method", (), _lora_init, "kaiming accepted"),
    ignore(
        "trainer.policy.model.lora.lora_sync_path",
        "hybrid loads LoRA weights into its in-process engine in memory, not through a folder",
    ),
    custom("trainer.ref.model.path", (), _ref_path, "null or the policy's path accepted"),
    custom("trainer.critic.model.path", ("critic.model.path",), _critic_path, "same value"),
    free_form("trainer.policy.model_config_kwargs.*", f"{ARR}.model.override_config"),
    free_form("trainer.critic.model_config_kwargs.*", "critic.model.override_config"),
    refuse(
        "trainer.ref.model_config_kwargs.*",
        "the reference model is built like the policy (trainer.policy.model_config_kwargs)",
    ),
    same("trainer.rope_scaling", f"{ARR}.model.override_config.rope_scaling", note="a Hugging Face model-config field"),
    same("trainer.rope_theta", f"{ARR}.model.override_config.rope_theta", note="a Hugging Face model-config field"),
    # ---- optimizers
    same("trainer.policy.optimizer_config.lr", f"{ACTOR}.optim.lr"),
    same("trainer.policy.optimizer_config.adam_betas", f"{ACTOR}.optim.betas"),
    same("trainer.policy.optimizer_config.weight_decay", f"{ACTOR}.optim.weight_decay"),
    same("trainer.policy.optimizer_config.max_grad_norm", f"{ACTOR}.grad_clip"),
    via("trainer.policy.optimizer_config.num_warmup_steps", f"{ACTOR}.optim.lr_warmup_steps", _warmup,
        "optimizer steps / (train_batch_size / policy_mini_batch_size x update_epochs_per_batch)",
        "hybrid steps the learning-rate schedule once per training step"),
    choice("trainer.policy.optimizer_config.scheduler", f"{ACTOR}.optim.warmup_style",
           {"constant_with_warmup": "constant", "constant": "constant", "linear": "linear", "cosine": "cosine"}),
    same("trainer.policy.optimizer_config.offload_after_step", f"{ACTOR}.fsdp_config.optimizer_offload",
         note="the optimizer state leaves the device between updates"),
    same("trainer.critic.optimizer_config.lr", "critic.optim.lr"),
    same("trainer.critic.optimizer_config.adam_betas", "critic.optim.betas"),
    same("trainer.critic.optimizer_config.weight_decay", "critic.optim.weight_decay"),
    same("trainer.critic.optimizer_config.max_grad_norm", "critic.grad_clip"),
    via("trainer.critic.optimizer_config.num_warmup_steps", "critic.optim.lr_warmup_steps", _warmup,
        "optimizer steps / (train_batch_size / policy_mini_batch_size x update_epochs_per_batch)"),
    choice("trainer.critic.optimizer_config.scheduler", "critic.optim.warmup_style",
           {"constant_with_warmup": "constant", "constant": "constant", "linear": "linear", "cosine": "cosine"}),
    same("trainer.critic.optimizer_config.offload_after_step", "critic.model.fsdp_config.optimizer_offload"),
    # ---- FSDP
    choice("trainer.strategy", (f"{ACTOR}.strategy", f"{REF}.strategy", "critic.strategy"),
           {"fsdp2": "fsdp2", "fsdp": "fsdp"}, refused={"megatron": MEGATRON, "deepspeed": DEEPSPEED}),
    same(
        "trainer.policy.fsdp_config.cpu_offload",
        f"{ACTOR}.fsdp_config.offload_policy",
        note="FSDP2's CPUOffloadPolicy",
    ),
    same("trainer.policy.fsdp_config.reshard_after_forward", f"{ACTOR}.fsdp_config.reshard_after_forward"),
    same("trainer.policy.fsdp_config.fsdp_size", f"{ACTOR}.fsdp_config.fsdp_size"),
    custom("trainer.policy.fsdp_config.mixed_precision.*", (f"{ACTOR}.fsdp_config.mixed_precision",),
           _fsdp_mixed_precision(f"{ACTOR}.fsdp_config"), "param_dtype bf16|fp32; reduce/buffer fp32 accepted"),
    refuse(
        "trainer.policy.fsdp_config.wrap_policy.*",
        "hybrid wraps every decoder layer; its only wrap key is fsdp_config.wrap_policy.min_num_params",
    ),
    same(
        "trainer.ref.fsdp_config.cpu_offload",
        f"{REF}.fsdp_config.param_offload",
        note="the reference's parameters stay on the CPU between uses",
    ),
    same("trainer.ref.fsdp_config.reshard_after_forward", f"{REF}.fsdp_config.reshard_after_forward"),
    refuse("trainer.ref.fsdp_config.fsdp_size", "the reference is sharded like the policy", accept=(-1,)),
    custom("trainer.ref.fsdp_config.mixed_precision.*", (f"{REF}.fsdp_config.mixed_precision",),
           _fsdp_mixed_precision(f"{REF}.fsdp_config"), "param_dtype bf16|fp32"),
    refuse("trainer.ref.fsdp_config.wrap_policy.*", "hybrid wraps every decoder layer"),
    same("trainer.critic.fsdp_config.cpu_offload", "critic.model.fsdp_config.offload_policy"),
    same("trainer.critic.fsdp_config.reshard_after_forward", "critic.model.fsdp_config.reshard_after_forward"),
    same("trainer.critic.fsdp_config.fsdp_size", "critic.model.fsdp_config.fsdp_size"),
    custom("trainer.critic.fsdp_config.mixed_precision.*", ("critic.model.fsdp_config.mixed_precision",),
           _fsdp_mixed_precision("critic.model.fsdp_config"), "param_dtype bf16|fp32"),
    refuse("trainer.critic.fsdp_config.wrap_policy.*", "hybrid wraps every decoder layer"),
    via(
        "trainer.bf16",
        f"{ACTOR}.fsdp_config.mixed_precision",
        lambda v, c: "bf16" if v else "fp32",
        "true -> bf16, false -> fp32",
    ),
    refuse("trainer.policy.sequence_parallel_size", ULYSSES, accept=(1,)),
    refuse("trainer.ref.sequence_parallel_size", ULYSSES, accept=(1,)),
    refuse("trainer.critic.sequence_parallel_size", ULYSSES, accept=(1,)),
    refuse("trainer.sequence_parallel_backend", ULYSSES, accept=("ulysses",)),
    refuse("trainer.policy.megatron_config.*", MEGATRON),
    refuse("trainer.ref.megatron_config.*", MEGATRON),
    refuse("trainer.policy.deepspeed_config.*", DEEPSPEED),
    refuse("trainer.ref.deepspeed_config.*", DEEPSPEED),
    refuse("trainer.critic.deepspeed_config.*", DEEPSPEED),
    refuse("deepspeed_config.*", DEEPSPEED),
    refuse("trainer.policy.use_torch_compile", "hybrid does not torch.compile its models", accept=(False,)),
    refuse("trainer.policy.record_memory", "no memory-snapshot switch in hybrid", accept=(False,)),
    same(
        "trainer.gradient_checkpointing",
        f"{ARR}.model.enable_gradient_checkpointing",
        "critic.model.enable_gradient_checkpointing",
    ),
    refuse(
        "trainer.gradient_checkpointing_use_reentrant",
        "hybrid checkpoints activations non-reentrantly",
        accept=(False,),
    ),
    same(
        "trainer.use_sample_packing",
        f"{ARR}.model.use_remove_padding",
        note="hybrid packs the valid tokens of a micro batch",
    ),
    ignore("trainer.flash_attn", "hybrid picks the attention kernel itself (packed varlen attention where available)"),
    refuse("trainer.disable_fast_tokenizer", "hybrid loads the tokenizer with transformers' defaults", accept=(False,)),
    # ---- placement
    refuse("trainer.placement.colocate_all", COLOCATED, accept=(True,)),
    refuse(
        "trainer.placement.colocate_policy_ref",
        "the reference model lives in hybrid's fused actor worker",
        accept=(True,),
    ),
    refuse(
        "trainer.placement.colocate_critic_reward",
        "hybrid has no separate reward-model placement",
        accept=(False,),
    ),
    same("trainer.placement.policy_num_nodes", "trainer.nnodes"),
    same("trainer.placement.policy_num_gpus_per_node", "trainer.n_gpus_per_node"),
    *(
        custom(f"trainer.placement.{role}_num_{what}", (), _same_as_policy(f"trainer.placement.policy_num_{what}", verl),
               f"must equal policy_num_{what}")
        for role in ("ref", "critic", "reward")
        for what, verl in (("nodes", "trainer.nnodes"), ("gpus_per_node", "trainer.n_gpus_per_node"))
    ),
    # ---- batches and schedule
    same("trainer.train_batch_size", "data.train_batch_size", note="prompts per step"),
    same("trainer.policy_mini_batch_size", f"{ACTOR}.ppo_mini_batch_size", note="prompts per optimizer step, in both"),
    same("trainer.critic_mini_batch_size", "critic.ppo_mini_batch_size"),
    same(
        "trainer.micro_train_batch_size_per_gpu",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu",
        note="samples per device; the critic follows",
    ),
    same("trainer.micro_forward_batch_size_per_gpu", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
         f"{REF}.log_prob_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu"),
    same("trainer.update_epochs_per_batch", f"{ACTOR}.ppo_epochs", note="the critic follows"),
    custom("trainer.epochs", ("trainer.total_epochs", "trainer.total_training_steps"), _epochs,
           "total_epochs = value, total_training_steps = null", "SkyRL has no step limit: the run covers whole epochs"),
    refuse("trainer.update_ref_every_epoch", "hybrid's reference stays the initial policy", accept=(False,)),
    same("trainer.max_prompt_length", "data.max_prompt_length"),
    same("trainer.eval_batch_size", "data.val_batch_size"),
    same("trainer.eval_before_train", "trainer.val_before_train"),
    same("trainer.eval_interval", "trainer.test_freq", note="-1 disables in both"),
    via(
        "trainer.seed",
        ("trainer.seed", "data.seed"),
        lambda v, c: v,
        "same value",
        "SkyRL seeds the data order with it too",
    ),
    # ---- checkpoints and logging
    via(
        "trainer.resume_mode",
        "trainer.resume_mode",
        _resume_mode,
        "none -> disable, latest -> auto, from_path -> resume_path",
    ),
    same("trainer.resume_path", "trainer.resume_from_path"),
    same("trainer.ckpt_path", "trainer.default_local_dir", note="hybrid also writes metrics.jsonl there"),
    same("trainer.ckpt_interval", "trainer.save_freq"),
    custom("trainer.max_ckpts_to_keep", ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
           _max_ckpts, "-1 -> null (keep all), N -> N"),
    custom("trainer.hf_save_interval", (f"{ACTOR}.checkpoint.save_contents",), _hf_save_interval,
           "-1: nothing; = ckpt_interval: save_contents + hf_model"),
    ignore("trainer.export_path", "hybrid writes everything under trainer.default_local_dir (trainer.ckpt_path)"),
    ignore("trainer.log_path", "hybrid's logs go to stdout"),
    same("trainer.project_name", "trainer.project_name"),
    same("trainer.run_name", "trainer.experiment_name"),
    via(
        "trainer.logger",
        "trainer.logger",
        _logger,
        "[value, file]",
        "`file` (metrics.jsonl) is hybrid's run record and is always kept",
    ),
    refuse("trainer.dump_data_batch", "hybrid has no batch dump", accept=(False,)),
    ignore(
        "trainer.dump_eval_results",
        "hybrid writes validation samples to val_generations.jsonl (trainer.log_val_generations)",
    ),
    refuse("trainer.fully_async.*", ASYNC),
    # ---- algorithm
    choice("trainer.algorithm.advantage_estimator", "algorithm.adv_estimator",
           {"grpo": "grpo", "gae": "gae", "rloo": "rloo", "reinforce++": "reinforce_plus_plus"}),
    same("trainer.algorithm.grpo_norm_by_std", "algorithm.norm_adv_by_std_in_grpo"),
    same("trainer.algorithm.lambd", "algorithm.lam"),
    same("trainer.algorithm.gamma", "algorithm.gamma"),
    same("trainer.algorithm.use_kl_loss", f"{ACTOR}.use_kl_loss"),
    same("trainer.algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward"),
    same("trainer.algorithm.kl_loss_coef", f"{ACTOR}.kl_loss_coef", "algorithm.kl_ctrl.kl_coef",
         note="SkyRL's in-reward KL starts from the same coefficient"),
    custom("trainer.algorithm.kl_estimator_type", (f"{ACTOR}.kl_loss_type", "algorithm.kl_penalty"), _kl_estimator,
           "k1 -> kl, k2 -> mse, k3 -> low_var_kl, abs -> abs"),
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
    custom("trainer.algorithm.policy_loss_type", (f"{ACTOR}.policy_loss.loss_mode", f"{ACTOR}.clip_ratio_c"), _policy_loss,
           f"regular -> vanilla with clip_ratio_c={NO_DUAL_CLIP:g} (never binds), dual_clip -> vanilla, cispo -> cispo "
           "with clip_ratio_low/high from trainer.algorithm.cispo.*, gspo, clip_cov, kl_cov, sapo"),
    choice("trainer.algorithm.loss_reduction", f"{ACTOR}.loss_agg_mode",
           {"token_mean": "token-mean", "sequence_mean": "seq-mean-token-mean", "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"},
           note="seq-mean-token-sum-norm divides by the response horizon (data.max_response_length), SkyRL by max_input_length + max_generate_length: a constant factor"),
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
    refuse("trainer.algorithm.zero_variance_filter",
           "no key to mask zero-variance groups; algorithm.filter_groups (trainer.algorithm.dynamic_sampling.type=filter) drops and resamples them instead",
           accept=(False,)),
    custom(
        "trainer.algorithm.normalize_reward",
        (),
        _normalize_values,
        "accepted without a critic; true refused with gae",
    ),
    refuse("trainer.algorithm.max_seq_len",
           "hybrid divides seq-mean-token-sum-norm by the response horizon; no key for another divisor", accept=(None,)),
    custom(
        "trainer.algorithm.use_tis",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _use_tis,
        "true -> tis_imp_ratio_cap, false -> -1",
    ),
    custom("trainer.algorithm.tis_imp_ratio_cap", (f"{ACTOR}.tis_imp_ratio_cap",), _tis_cap, "read with use_tis=true"),
    custom("trainer.algorithm.off_policy_correction.tis_ratio_type", (f"{ACTOR}.tis_imp_ratio_cap",), _tis_ratio_type,
           "token -> tis_imp_ratio_cap = token_tis_ratio_clip_high; null: nothing"),
    custom(
        "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high",
        (f"{ACTOR}.tis_imp_ratio_cap",),
        _token_tis_clip,
        "read with tis_ratio_type=token",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.sequence_tis_ratio_clip_high",
        "read only with tis_ratio_type=sequence, which is refused",
    ),
    refuse(
        "trainer.algorithm.off_policy_correction.sequence_mask_metric",
        "no sequence masking by importance ratio in hybrid",
        accept=(None,),
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.geo_mask_high",
        "read only with sequence_mask_metric, which is refused",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.geo_mask_low",
        "read only with sequence_mask_metric, which is refused",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.product_mask_high",
        "read only with sequence_mask_metric, which is refused",
    ),
    ignore(
        "trainer.algorithm.off_policy_correction.product_mask_low",
        "read only with sequence_mask_metric, which is refused",
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
    custom("trainer.algorithm.dynamic_sampling.type", ("algorithm.filter_groups.enable", "algorithm.filter_groups.metric",
           "algorithm.filter_groups.max_num_gen_batches"), _dynamic_sampling, "filter -> filter_groups on seq_reward; null -> off"),
    custom("trainer.algorithm.dynamic_sampling.max_sample_batches", ("algorithm.filter_groups.max_num_gen_batches",),
           _max_sample_batches, "-1 -> 0 (no limit), N -> N"),
    ignore("trainer.algorithm.dynamic_sampling.min_replace_ratio", "read only with type=replace, which is refused"),
    # ---- generator
    same("generator.n_samples_per_prompt", f"{ROLLOUT}.n"),
    *GENERATOR_RULES,
    refuse(
        "generator.chat_template.name_or_path",
        "hybrid renders prompts with the tokenizer's own chat template",
        accept=(None,),
    ),
    ignore("generator.chat_template.source", "read only with chat_template.name_or_path, which is refused"),
    free_form("generator.chat_template_kwargs.*", "data.apply_chat_template_kwargs"),
    same("generator.sampling_params.temperature", f"{ROLLOUT}.temperature"),
    same("generator.sampling_params.top_p", f"{ROLLOUT}.top_p"),
    same("generator.sampling_params.top_k", f"{ROLLOUT}.top_k"),
    same("generator.sampling_params.min_p", f"{ROLLOUT}.min_p"),
    same("generator.sampling_params.repetition_penalty", f"{ROLLOUT}.repetition_penalty"),
    same("generator.sampling_params.stop", f"{ROLLOUT}.stop"),
    via("generator.sampling_params.logprobs", f"{ROLLOUT}.calculate_log_probs", _logprobs, "null -> false, N -> true",
        "hybrid keeps the sampled token's log-prob"),
    custom("generator.sampling_params.additional_kwargs.*", (f"{ROLLOUT}.<name>",), _additional_sampling,
           "presence_penalty, frequency_penalty, stop_token_ids, repetition_penalty, min_p, ignore_eos"),
    custom("generator.eval_sampling_params.temperature", (f"{ROLLOUT}.val_kwargs.temperature", f"{ROLLOUT}.val_kwargs.do_sample"),
           _eval_temperature, "temperature; do_sample = temperature > 0"),
    same("generator.eval_sampling_params.top_p", f"{ROLLOUT}.val_kwargs.top_p"),
    same("generator.eval_sampling_params.top_k", f"{ROLLOUT}.val_kwargs.top_k"),
    refuse(
        "generator.eval_sampling_params.min_p",
        "no validation min_p key (actor_rollout_ref.rollout.val_kwargs has none)",
        accept=(0, 0.0),
    ),
    refuse(
        "generator.eval_sampling_params.repetition_penalty",
        "no validation repetition_penalty key",
        accept=(1, 1.0),
    ),
    custom(
        "generator.eval_sampling_params.stop",
        (),
        _eval_equal("generator.sampling_params.stop", "", "stop strings"),
        "must equal sampling_params.stop",
    ),
    ignore("generator.eval_sampling_params.logprobs", "validation keeps no log-probs"),
    refuse("generator.eval_sampling_params.additional_kwargs", "no further validation sampling keys", accept=(None,)),
    same("generator.eval_n_samples_per_prompt", f"{ROLLOUT}.val_kwargs.n"),
    refuse("generator.zero_reward_on_non_stop", "no key to zero the reward of truncated responses", accept=(False,)),
    refuse(
        "generator.apply_overlong_filtering",
        "no key to mask truncated responses out of the loss (DAPO's overlong filter)",
        accept=(False,),
    ),
    refuse(
        "generator.rope_scaling",
        "the engine uses the policy's model config (trainer.rope_scaling)",
        accept=(None,),
    ),
    refuse("generator.rope_theta", "the engine uses the policy's model config (trainer.rope_theta)", accept=(None,)),
    # ---- inference engine (older spellings in ALIASES)
    choice("generator.inference_engine.backend", f"{ROLLOUT}.name", {"vllm": "vllm"},
           refused={"sglang": "hybrid's engines are in-process vLLM and Hugging Face generate"}),
    choice("generator.inference_engine.model_dtype", f"{ROLLOUT}.dtype",
           {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "auto": "auto"}),
    refuse("generator.inference_engine.run_engines_locally", f"remote engines: {IN_PROCESS}", accept=(True,)),
    custom(
        "generator.inference_engine.remote_urls",
        (),
        _remote_urls,
        "accepted with run_engines_locally=true (SkyRL ignores them then)",
    ),
    refuse("generator.inference_engine.external_proxy_url", f"remote engines: {IN_PROCESS}", accept=(None,)),
    refuse(
        "generator.inference_engine.external_server_urls",
        f"remote engines: {IN_PROCESS}",
        accept=lambda v: not v,
        accepts="null, []",
    ),
    refuse(
        "generator.inference_engine.enable_http_endpoint",
        "hybrid's engine serves no HTTP endpoint",
        accept=(False,),
    ),
    ignore("generator.inference_engine.http_endpoint_host", "read only with enable_http_endpoint, which is refused"),
    ignore("generator.inference_engine.http_endpoint_port", "read only with enable_http_endpoint, which is refused"),
    ignore("generator.inference_engine.served_model_name", "read only with enable_http_endpoint, which is refused"),
    ignore(
        "generator.inference_engine.async_engine",
        "single-turn batched generation is the same with either engine; hybrid drives vLLM's offline engine in-process",
    ),
    custom("generator.inference_engine.num_engines", (), _num_engines, "must equal devices / tensor_parallel_size"),
    same("generator.inference_engine.tensor_parallel_size", f"{ROLLOUT}.tensor_model_parallel_size"),
    refuse(
        "generator.inference_engine.pipeline_parallel_size",
        "hybrid's engine shards by tensor parallelism only",
        accept=(1,),
    ),
    refuse(
        "generator.inference_engine.expert_parallel_size",
        "hybrid's engine shards by tensor parallelism only",
        accept=(1,),
    ),
    refuse(
        "generator.inference_engine.data_parallel_size",
        "one engine per tensor-parallel group; no engine data parallelism",
        accept=(1,),
    ),
    ignore("generator.inference_engine.weight_sync_backend", f"no collective: {IN_PROCESS}"),
    via("generator.inference_engine.weight_transfer_threshold_cuda_ipc_GB", f"{ROLLOUT}.update_weights_bucket_megabytes",
        _bucket_mb, "GB x 1024 -> MB", "the bucket size of hybrid's in-memory weight sync"),
    ignore("generator.inference_engine.override_existing_update_group", f"no update group: {IN_PROCESS}"),
    ignore("generator.inference_engine.vllm_v1_disable_multiproc", "hybrid's engine runs in the worker process anyway"),
    ignore("generator.inference_engine.distributed_executor_backend", "hybrid's engine runs in the worker process"),
    via(
        "generator.inference_engine.enable_prefix_caching",
        f"{ROLLOUT}.engine_kwargs.vllm.enable_prefix_caching",
        lambda v, c: v,
        "same value",
    ),
    same("generator.inference_engine.enable_chunked_prefill", f"{ROLLOUT}.enable_chunked_prefill"),
    same("generator.inference_engine.max_num_batched_tokens", f"{ROLLOUT}.max_num_batched_tokens"),
    same("generator.inference_engine.enforce_eager", f"{ROLLOUT}.enforce_eager"),
    same("generator.inference_engine.gpu_memory_utilization", f"{ROLLOUT}.gpu_memory_utilization"),
    same("generator.inference_engine.max_num_seqs", f"{ROLLOUT}.max_num_seqs"),
    via(
        "generator.inference_engine.fully_sharded_loras",
        f"{ROLLOUT}.engine_kwargs.vllm.fully_sharded_loras",
        lambda v, c: v,
        "same value",
    ),
    refuse(
        "generator.inference_engine.enable_ray_prometheus_stats",
        "no engine metrics export in hybrid",
        accept=(False,),
    ),
    free_form("generator.inference_engine.engine_init_kwargs.*", f"{ROLLOUT}.engine_kwargs.vllm"),
    # ---- environment
    *ENVIRONMENT_RULES,
)

DIALECT = Dialect(
    name="SkyRL",
    rules=RULES,
    aliases=ALIASES,
    defaults=SKYRL_DEFAULTS,
    always={"trainer.merge_on_finish": False, "trainer.plot_on_finish": False},
    always_why=(
        "SkyRL writes no merged Hugging Face folder and no plots at the end of a run (its Hugging Face "
        "exports follow trainer.hf_save_interval)"
    ),
    notes=(
        "Keys you do not give take hybrid's defaults (hybrid/config/ppo_trainer.yaml), not SkyRL's. "
        "Where they differ and it matters, give the key: SkyRL's use_kl_loss defaults to true "
        "(hybrid: false), eps_clip_high to 0.2 (hybrid: clip_ratio_high 0.28), policy_loss_type to "
        "regular (hybrid: the dual-clip vanilla loss), lr to 1e-6 (hybrid: 2e-5), n_samples_per_prompt "
        "to 5 (hybrid: 4), and hybrid stops after trainer.total_training_steps=15 unless "
        "trainer.epochs is given.",
        "Data files use verl's columns (prompt, data_source, reward_model.ground_truth, extra_info). "
        "Single-turn, the scorer is picked by each row's data_source. In episodes (generator.max_turns > 1, "
        "or environment.env_class naming an environment) the environment is environment.env_class, else "
        "the row's env_class column (SkyRL's datasets), and it reads the row's columns (reward_spec, or "
        "verl's reward_model as reward_spec).",
    ),
)


def translate_skyrl(overrides: list[str]) -> list[str]:
    """SkyRL `key=value` overrides -> verl overrides (`hydra.*` ones pass through unchanged).
    Raises ConfigError naming every key that has no equivalent."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    from omegaconf import OmegaConf

    from hybrid.config import ConfigError

    passthrough, given, order, problems = [], {}, [], []
    for raw in overrides:
        try:
            override = OverridesParser.create().parse_override(raw)
        except OverrideParseException as err:
            problems.append(f"cannot parse {raw!r}: {err}")
            continue
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            passthrough.append(raw)
            continue
        if override.is_add() or override.is_force_add() or override.is_delete():
            problems.append(f"{raw}: SkyRL keys are set with key=value (SkyRL refuses + too; ~ deletes nothing here)")
            continue
        given[key] = override.value()
        order.append(key)
    # SkyRL values may interpolate other SkyRL keys of the same command line, or oc.env.
    tree = OmegaConf.create({})
    for key in order:
        OmegaConf.update(tree, key, given[key], force_add=True, merge=False)
    resolved = {}
    for key in order:
        try:
            value = OmegaConf.select(tree, key, throw_on_missing=True)
            resolved[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception as err:  # noqa: BLE001 - OmegaConf raises several kinds; all mean the same here
            problems.append(f"{key}={given[key]}: cannot resolve the value ({type(err).__name__}: {err})".replace("\n", " "))
    if problems:
        raise ConfigError("\n".join(["the SkyRL command line cannot be read:"] + [f"  - {p}" for p in problems]))
    return translate(DIALECT, resolved, order) + passthrough


__all__ = ["ALIASES", "DIALECT", "RULES", "translate_skyrl"]
