"""The converters of the SkyRL dialect (skyrl.py): the functions its rules call to turn a
SkyRL value into verl keys (units, names and the checks of keys read together), and the
reasons and key prefixes the rules share. The policy-loss and off-policy ones are in
skyrl_off_policy.py.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.asynchronous import engines_apart, in_turn_apart, streamed, whole
from hybrid.dialects.table import Context, Refusal, Rule, custom

ARR = "actor_rollout_ref"
ACTOR = f"{ARR}.actor"
ROLLOUT = f"{ARR}.rollout"
REF = f"{ARR}.ref"

# Reasons repeated across several keys.
SAME_DEVICES = (
    "hybrid places the reference, the critic and the reward model in the training group, on the policy's "
    "devices (trainer.placement.policy_num_*)"
)
MEGATRON = "the Megatron backend: hybrid trains with FSDP2 only"
DEEPSPEED = "the DeepSpeed backend: hybrid trains with FSDP2 only"
IN_PROCESS = (
    "hybrid starts its engines itself (inside the training workers, or in Ray actors of their own with "
    "trainer.placement.colocate_all=false) and hands them the weights directly"
)
FULLY_ASYNC_KEYS = ("trainer.fully_async.max_staleness_steps", "trainer.fully_async.num_parallel_generation_workers")


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
    if value == 0:  # no warm-up, however many optimizer steps a training step takes
        return 0
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


def _overlong_buffer(value: Any, ctx: Context) -> dict[str, Any]:
    # SkyRL's DAPO entry point (examples/train/algorithms/dapo/main_dapo.py) always applies its soft
    # overlong punishment, with these defaults for the key not given; hybrid's dapo manager is the same
    # formula: -(length - (max_response_length - len)) / len x penalty_factor over the buffer.
    buffer = "reward_model.reward_kwargs.overlong_buffer"
    return {
        "reward_model.reward_manager": "dapo",
        f"{buffer}.enable": True,
        f"{buffer}.len": ctx.get("trainer.algorithm.overlong_buffer_len", 512),
        f"{buffer}.penalty_factor": ctx.get("trainer.algorithm.overlong_buffer_penalty_factor", 1.0),
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


def _epochs(value: Any, ctx: Context) -> dict[str, Any]:
    # hybrid's default job stops after trainer.total_training_steps; SkyRL runs whole epochs.
    return {"trainer.total_epochs": value, "trainer.total_training_steps": None}


def _max_training_steps(value: Any, ctx: Context) -> dict[str, Any]:
    # SkyRL: min(epochs x steps per epoch, this); its epochs default to 1, which hybrid's
    # default job (a fixed total_training_steps) would not honour.
    if value is None:
        return {}
    return {
        "trainer.max_training_steps": value,
        "trainer.total_training_steps": None,
        "trainer.total_epochs": ctx.get("trainer.epochs", 1),
    }


def _shard_group(value: Any, ctx: Context) -> Any:
    """An fsdp_size as the layout it gives (SkyRL's create_device_mesh, verl's): -1 for full
    sharding (-1, or at least the policy's ranks), else the group size."""
    nodes = ctx.effective("trainer.placement.policy_num_nodes", "trainer.nnodes")
    gpus = ctx.effective("trainer.placement.policy_num_gpus_per_node", "trainer.n_gpus_per_node")
    whole = isinstance(value, int) and isinstance(nodes, int) and isinstance(gpus, int) and value >= nodes * gpus
    return -1 if whole or (isinstance(value, int) and value < 0) else value


def _ref_fsdp_size(value: Any, ctx: Context) -> dict[str, Any]:
    """The reference runs in the policy's workers, on the policy's device mesh (verl's fused
    worker): its fsdp_size is honoured when it gives the policy's layout."""
    policy = ctx.effective("trainer.policy.fsdp_config.fsdp_size", f"{ACTOR}.fsdp_config.fsdp_size")
    if _shard_group(value, ctx) != _shard_group(policy, ctx):
        raise Refusal(
            f"hybrid's reference runs in the policy's workers and is sharded over the policy's shard groups "
            f"(trainer.policy.fsdp_config.fsdp_size={policy}); give both the same size"
        )
    return {}


def _same_as_policy(policy_key: str, verl_key: str):
    def check(value: Any, ctx: Context) -> dict[str, Any]:
        policy = ctx.effective(policy_key, verl_key)
        if value != policy:
            raise Refusal(f"{SAME_DEVICES} ({policy_key}={policy})")
        return {}

    return check


def _ref_sequence_parallel(value: Any, ctx: Context) -> dict[str, Any]:
    policy = ctx.effective("trainer.policy.sequence_parallel_size", f"{ACTOR}.ulysses_sequence_parallel_size")
    if value != policy:
        raise Refusal(
            f"hybrid's reference runs in the policy's worker and splits sequences as the policy does "
            f"(trainer.policy.sequence_parallel_size={policy}); give both the same size"
        )
    return {f"{REF}.ulysses_sequence_parallel_size": value}


def _ref_path(value: Any, ctx: Context) -> dict[str, Any]:
    """SkyRL's ref.model.path defaults to the policy's; another model (a distillation teacher)
    is hybrid's ref.model.path, which hybrid refuses when nothing reads the reference (SkyRL
    then never loads it)."""
    if value is None:
        return {}
    if ctx.has("trainer.policy.model.path") and ctx.get("trainer.policy.model.path") == value:
        return {}
    return {f"{REF}.model.path": value}


def _colocated(ctx: Context) -> bool:
    """SkyRL's trainer.placement.colocate_all (default true): engines on the training devices."""
    return ctx.get("trainer.placement.colocate_all", True) is not False


def remote_servers_given(ctx: Context) -> bool:
    """external_server_urls given as a non-empty value (hybrid/dialects/skyrl_remote.py)."""
    return ctx.get("generator.inference_engine.external_server_urls", None) not in (None, "", [])


def _remote_engines(ctx: Context) -> bool:
    """SkyRL's external_proxy_url / external_server_urls: engines of a separate deployment."""
    return ctx.get("generator.inference_engine.external_proxy_url", None) is not None or remote_servers_given(ctx)


def _engine_devices(ctx: Context) -> int:
    """The engines' own devices with colocate_all=false: num_engines x tensor_parallel_size."""
    engines = ctx.get("generator.inference_engine.num_engines")
    tp = ctx.effective("generator.inference_engine.tensor_parallel_size", f"{ROLLOUT}.tensor_model_parallel_size")
    if not (isinstance(engines, int) and not isinstance(engines, bool) and engines >= 1):
        raise Refusal(
            f"generator.inference_engine.num_engines must be a whole number >= 1 (here {engines})", shared=True
        )
    if not (isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1):
        raise Refusal(
            f"generator.inference_engine.tensor_parallel_size must be a whole number >= 1 (here {tp})", shared=True
        )
    return engines * tp


def _colocate_all(value: Any, ctx: Context) -> dict[str, Any]:
    if value is True:
        return {}
    if value is not False:
        raise Refusal("true or false")
    # Remote engines (skyrl_remote.py) run on the deployment's devices, none of this run's.
    out = engines_apart(1, 0 if _remote_engines(ctx) else _engine_devices(ctx))
    # SkyRL's trainer is chosen by its entry point: with only placement keys, the synchronous
    # one (generate with the current weights, then train); trainer.fully_async.* keys stand
    # for its fully async entry point, whose rule writes that schedule.
    if not any(ctx.has(k) for k in FULLY_ASYNC_KEYS) and ctx.get("trainer.fully_async.enabled", False) is not True:
        if ctx.get("trainer.algorithm.dynamic_sampling.type", None) == "filter":
            raise Refusal(
                "with the engines apart, hybrid runs SkyRL's synchronous trainer as one batch generated per step "
                "(async_training.mode=one_step_off at lag 0), which cannot draw further batches for dynamic "
                "sampling (trainer.algorithm.dynamic_sampling.type=filter); keep colocate_all=true for it"
            )
        out.update(in_turn_apart())
    return out


def _num_engines(value: Any, ctx: Context) -> dict[str, Any]:
    if not _colocated(ctx):
        _engine_devices(ctx)  # colocate_all=false reads it: the engines' own devices
        return {}
    nodes = ctx.effective("trainer.placement.policy_num_nodes", "trainer.nnodes")
    gpus = ctx.effective("trainer.placement.policy_num_gpus_per_node", "trainer.n_gpus_per_node")
    tp = ctx.effective("generator.inference_engine.tensor_parallel_size", f"{ROLLOUT}.tensor_model_parallel_size")
    if value * tp != nodes * gpus:
        raise Refusal(
            f"with trainer.placement.colocate_all=true the engines share the policy's {nodes * gpus} devices, "
            f"one per tensor-parallel group ({nodes * gpus // tp} engines of tensor_parallel_size {tp}); "
            f"engines on devices of their own need colocate_all=false"
        )
    return {}


def _fully_async(value: Any, ctx: Context) -> dict[str, Any]:
    """SkyRL's fully async trainer (examples/fully_async), read from trainer.fully_async.*.

    SkyRL's AsyncStalenessManager lets `accepted + running <= (S + step) x B` groups be started
    at step `step` (B = policy_mini_batch_size, S = max_staleness_steps): generation runs S
    steps' worth of groups ahead, no group is trained more than S steps after it was scheduled,
    each step takes B groups and the weights go to the engines after every step. That is
    verl's staleness_threshold = S in sync windows of one step, with the bound S.
    """
    if _colocated(ctx):
        raise Refusal(
            "SkyRL's fully async trainer requires trainer.placement.colocate_all=false (it asserts so): the "
            "engines generate on devices of their own while the policy trains; set colocate_all=false with "
            "generator.inference_engine.num_engines x tensor_parallel_size engine devices",
            shared=True,
        )
    bound = ctx.get("trainer.fully_async.max_staleness_steps")
    if not (whole(bound) and bound >= 0):
        raise Refusal(
            f"trainer.fully_async.max_staleness_steps must be a whole number of steps >= 0 (here {bound})", shared=True
        )
    bound = int(bound)
    mini = ctx.effective("trainer.policy_mini_batch_size", f"{ACTOR}.ppo_mini_batch_size")
    train = ctx.effective("trainer.train_batch_size", "data.train_batch_size")
    if train != mini:
        raise Refusal(
            f"SkyRL's fully async trainer requires trainer.train_batch_size ({train}) to equal "
            f"trainer.policy_mini_batch_size ({mini}): a step trains one mini batch of groups",
            shared=True,
        )
    workers = None
    if ctx.has("trainer.fully_async.num_parallel_generation_workers"):
        workers = ctx.get("trainer.fully_async.num_parallel_generation_workers")
        top = mini * (bound + 1)
        if not (isinstance(workers, int) and not isinstance(workers, bool) and mini <= workers <= top):
            raise Refusal(
                f"SkyRL requires policy_mini_batch_size <= trainer.fully_async.num_parallel_generation_workers <= "
                f"policy_mini_batch_size x (max_staleness_steps + 1), here {mini}..{top} (given {workers})",
                shared=True,
            )
    return streamed(ahead=bound, bound=bound, require_batches=1, in_flight=workers)


def _fully_async_enabled(value: Any, ctx: Context) -> dict[str, Any]:
    """SkyRL's switch for its fully async trainer (which its fully async entry points assert)."""
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if value:
        return _fully_async(value, ctx)
    others = [k for k in ctx.given if k.startswith("trainer.fully_async.") and k != ctx.key]
    if others:
        raise Refusal(f"false with {', '.join(sorted(others))} given: say true, or leave those keys out")
    return {}


def _simulate_training(value: Any, ctx: Context) -> dict[str, Any]:
    """SkyRL's simulated trainer (FullyAsyncTrainerSim), a variant of its fully async one."""
    if not isinstance(value, bool):
        raise Refusal("true or false")
    fully_async = any(ctx.has(k) for k in FULLY_ASYNC_KEYS) or ctx.get("trainer.fully_async.enabled", False) is True
    if value and not fully_async:
        raise Refusal(
            "SkyRL simulates the steps of its fully async trainer only: give trainer.fully_async.enabled=true "
            "(with trainer.placement.colocate_all=false)"
        )
    return {"async_training.simulate_training": value}


def _offload_after_step(verl_key: str):
    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        # SkyRL offloads the optimizer state after a step only with colocate_all=true.
        return {verl_key: value} if _colocated(ctx) else {}

    return convert


def _bucket_mb(value: Any, ctx: Context) -> int:
    return max(1, int(round(float(value) * 1024)))


def free_form(key: str, verl_prefix: str) -> Rule:
    """`<dict>.*` -> the same names below a verl dict that is passed through as keyword
    arguments (model config fields, vLLM engine arguments, chat-template arguments)."""
    start = len(key) - 1  # the dialect key without its `*`

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if len(ctx.key) < start:  # the whole dict at once (engine_init_kwargs='{"k": v}'): each entry
            if not isinstance(value, dict):
                raise Refusal(f"a dict of keyword arguments, not {value!r}")
            return {f"{verl_prefix}.{name}": item for name, item in value.items()}
        return {f"{verl_prefix}.{ctx.key[start:]}": value}

    return custom(key, (f"{verl_prefix}.<key>",), convert, "same name and value")


def _additional_sampling(value: Any, ctx: Context) -> dict[str, Any]:
    known = ("presence_penalty", "frequency_penalty", "stop_token_ids", "repetition_penalty", "min_p", "ignore_eos")
    if ctx.key.endswith(".additional_kwargs"):  # the whole dict at once (null: SkyRL's default, none)
        if not isinstance(value, (dict, type(None))):
            raise Refusal(f"a dict of sampling parameters, not {value!r}")
        entries = dict(value or {})
    else:
        entries = {ctx.key.rsplit(".", 1)[-1]: value}
    unknown = [name for name in entries if name not in known]
    if unknown:
        raise Refusal(f"hybrid passes only these further SamplingParams to vLLM: {', '.join(known)} (not {unknown[0]})")
    return {f"{ROLLOUT}.{name}": item for name, item in entries.items()}


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
    # SkyRL asks for the sampled token's log-prob (logprobs=N) for off-policy correction; null asks for none.
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


__all__ = ["ACTOR", "ARR", "REF", "ROLLOUT", "free_form"]
