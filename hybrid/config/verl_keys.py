"""The keys of verl's current ppo_trainer config (verl/trainer/config/_generated_ppo_trainer.yaml)
that hybrid's yaml does not hold, each with what verl does with it:

- `TARGETS`: verl's Hydra `_target_` class paths. verl instantiates its config dataclasses from
  them; hybrid builds its own (hybrid/config/schema.py). Accepted at verl's class, refused at any
  other (a class of the user's own would not be instantiated).
- `RENAMED` / `DTYPE_KEYS`: keys verl reads where hybrid has the same setting under another
  name (read under hybrid's name; both given at different values is refused by foreign_keys).
- `DEFAULT_ONLY`: keys whose other values change what verl computes in a way hybrid does not
  implement: accepted at the values that need nothing hybrid lacks, refused at any other, in one
  line naming the key and why.
- `NO_EFFECT`: keys whose value changes nothing verl computes in the configuration hybrid
  follows (verl's default, legacy FSDP workers: `trainer.use_legacy_worker_impl=auto`), or that
  only drive a service or tool hybrid does not run: accepted at any value and named at start in
  one line.

`rewrite_overrides` runs on the command line's overrides before the key check
(hybrid/config/loading.py), after foreign_keys; a key hybrid's yaml holds is left alone (the
yaml's own rules apply), so a key another part of hybrid adopts stops being handled here.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

import yaml

ARR = "actor_rollout_ref"
ROLES = (f"{ARR}.actor", f"{ARR}.ref", "critic.model")  # where verl keeps each role's fsdp_config
_W = "verl.workers.config"
_P = "verl.utils.profiler"

# ------------------------------------------------------------------ Hydra class paths
TARGETS = {
    f"{ARR}.actor._target_": f"{_W}.FSDPActorConfig",
    f"{ARR}.ref._target_": f"{_W}.FSDPActorConfig",
    f"{ARR}.actor.checkpoint._target_": "verl.trainer.config.CheckpointConfig",
    f"{ARR}.actor.optim._target_": f"{_W}.FSDPOptimizerConfig",
    f"{ARR}.actor.policy_loss._target_": f"{_W}.PolicyLossConfig",
    f"{ARR}.model._target_": f"{_W}.HFModelConfig",
    f"{ARR}.model.mtp._target_": f"{_W}.MtpConfig",
    f"{ARR}.rollout._target_": f"{_W}.RolloutConfig",
    f"{ARR}.rollout.agent._target_": f"{_W}.AgentLoopConfig",
    f"{ARR}.rollout.agent.custom_async_server._target_": f"{_W}.CustomAsyncServerConfig",
    f"{ARR}.rollout.checkpoint_engine._target_": f"{_W}.CheckpointEngineConfig",
    f"{ARR}.rollout.multi_turn._target_": f"{_W}.MultiTurnConfig",
    f"{ARR}.rollout.prometheus._target_": f"{_W}.PrometheusConfig",
    f"{ARR}.rollout.trace._target_": f"{_W}.TraceConfig",
    f"{ARR}.rollout.val_kwargs._target_": f"{_W}.SamplingConfig",
    f"{ARR}.actor.router_replay._target_": f"{_W}.RouterReplayConfig",
    f"{ARR}.ref.router_replay._target_": f"{_W}.RouterReplayConfig",
    "algorithm._target_": "verl.trainer.config.AlgoConfig",
    "algorithm.kl_ctrl._target_": "verl.trainer.config.KLControlConfig",
    "critic._target_": f"{_W}.FSDPCriticConfig",
    "critic.checkpoint._target_": "verl.trainer.config.CheckpointConfig",
    "critic.model._target_": f"{_W}.FSDPCriticModelCfg",
    "critic.optim._target_": f"{_W}.FSDPOptimizerConfig",
    "global_profiler._target_": f"{_P}.ProfilerConfig",
    "reward_manager._target_": "verl.trainer.config.config.RewardManagerConfig",
    "reward_manager.module._target_": "verl.trainer.config.config.ModuleConfig",
    "reward_model.rollout._target_": f"{_W}.RolloutConfig",
    "reward_model.model.fsdp_config._target_": f"{_W}.FSDPEngineConfig",
}
for _role in ROLES:
    TARGETS[f"{_role}.fsdp_config._target_"] = f"{_W}.FSDPEngineConfig"
for _role in (f"{ARR}.actor", f"{ARR}.ref", f"{ARR}.rollout", "critic", "reward_model"):
    TARGETS[f"{_role}.profiler._target_"] = f"{_P}.ProfilerConfig"
for _role in (f"{ARR}.actor", f"{ARR}.ref", "critic"):
    TARGETS[f"{_role}.profiler.tool_config.nsys._target_"] = f"{_P}.config.NsightToolConfig"
    TARGETS[f"{_role}.profiler.tool_config.torch._target_"] = f"{_P}.config.TorchProfilerToolConfig"
    TARGETS[f"{_role}.profiler.tool_config.torch_memory._target_"] = f"{_P}.config.TorchMemoryToolConfig"
TARGETS["global_profiler.global_tool_config.nsys._target_"] = f"{_P}.config.NsightToolConfig"
_TARGET_WHY = (
    "verl's Hydra class for this section; hybrid builds its own typed config (hybrid/config/schema.py) and "
    "instantiates no class named here: remove the key, or register your code through "
    f"{ARR}.model.external_lib"
)

# ------------------------------------------------------------------ the same setting, another name
RENAMED = {
    f"{ARR}.actor.tau_pos": f"{ARR}.actor.policy_loss.sapo_tau_pos",  # SAPO's smoothing (verl's actor section)
    f"{ARR}.actor.tau_neg": f"{ARR}.actor.policy_loss.sapo_tau_neg",
    f"{ARR}.actor.use_remove_padding": f"{ARR}.model.use_remove_padding",
    f"{ARR}.actor.use_fused_kernels": f"{ARR}.model.use_fused_kernels",
    "critic.model.external_lib": f"{ARR}.model.external_lib",  # imported once, before the config is checked
    "reward_model.model.external_lib": f"{ARR}.model.external_lib",
    "reward_manager.name": "reward_model.reward_manager",
    # the workers' torch.distributed timeout (workers/base.py reads HYBRID_DIST_TIMEOUT_S; worker_env_vars reach
    # the driver and every worker)
    f"{ARR}.nccl_timeout": "trainer.worker_env_vars.HYBRID_DIST_TIMEOUT_S",
    # vLLM engine arguments verl passes to its engine: hybrid's engine_kwargs.vllm (workers/rollout/vllm_rollout.py)
    f"{ARR}.rollout.enable_prefix_caching": f"{ARR}.rollout.engine_kwargs.vllm.enable_prefix_caching",
    f"{ARR}.rollout.disable_log_stats": f"{ARR}.rollout.engine_kwargs.vllm.disable_log_stats",
    f"{ARR}.rollout.scheduling_policy": f"{ARR}.rollout.engine_kwargs.vllm.scheduling_policy",
    f"{ARR}.rollout.logprobs_mode": f"{ARR}.rollout.engine_kwargs.vllm.logprobs_mode",
}
# verl's interpolated defaults of renamed keys: given as written they say "as the other key", which
# hybrid's key already is, so they are dropped (renamed, they would point at themselves).
INTERPOLATED = {
    f"{ARR}.actor.use_remove_padding": "${oc.select:actor_rollout_ref.model.use_remove_padding,false}",
    f"{ARR}.actor.use_fused_kernels": "${oc.select:actor_rollout_ref.model.use_fused_kernels,false}",
    "critic.model.external_lib": "${oc.select:actor_rollout_ref.model.external_lib,null}",
    "reward_model.model.external_lib": "${actor_rollout_ref.model.external_lib}",
    "reward_manager.name": "${oc.select:reward_model.reward_manager,naive}",
}
# verl's legacy workers compute in fsdp_config.dtype (FSDP's param_dtype; reductions and master
# weights fp32): hybrid's fsdp_config.mixed_precision of the same role.
DTYPE_KEYS = {f"{role}.fsdp_config.dtype": f"{role}.fsdp_config.mixed_precision" for role in ROLES}
_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}
# verl's fsdp_config.mixed_precision is a dict (param_dtype, reduce_dtype, buffer_dtype), written
# whole or key by key; hybrid's is the compute dtype (param_dtype), with gradients reduced and
# buffers kept in fp32, verl's defaults for the other two.
PRECISION_KEYS = {f"{role}.fsdp_config.mixed_precision": role for role in ROLES}
_PRECISION_PARTS = ("param_dtype", "reduce_dtype", "buffer_dtype")
_FP32_ONLY = {
    "reduce_dtype": "hybrid reduces gradients in fp32 (FSDP2's MixedPrecisionPolicy reduce_dtype)",
    "buffer_dtype": "hybrid keeps buffers (rotary caches, norms' running values) in fp32",
}


def precision_override(key: str, value: Any) -> tuple[str | None, str | None]:
    """verl's mixed_precision given as a dict (`key` the section's mixed_precision) or one of its
    keys (`key` ending in .param_dtype/.reduce_dtype/.buffer_dtype): (hybrid's override or None
    when nothing changes, a problem or None)."""
    section, _, part = key.rpartition(".")
    parts = value if part == "mixed_precision" else {part: value}
    target = key if part == "mixed_precision" else section
    if not isinstance(parts, dict) or not set(parts) <= set(_PRECISION_PARTS):
        return None, f"{key}={value}: verl's mixed_precision takes {', '.join(_PRECISION_PARTS)}"
    names = {name: str(dtype).removeprefix("torch.") for name, dtype in parts.items() if dtype is not None}
    for name, why in _FP32_ONLY.items():
        if name in names and _DTYPES.get(names[name]) != "fp32":
            return None, f"{target}.{name}={names[name]}: {why}"
    if "param_dtype" not in names:
        return None, None
    if names["param_dtype"] not in _DTYPES:
        return None, f"{target}.param_dtype={names['param_dtype']}: hybrid computes in bfloat16 or float32"
    return f"{target}={_DTYPES[names['param_dtype']]}", None


# ------------------------------------------------------------------ accepted at some values only
_FP32 = (
    "the weights hybrid loads and trains are fp32 (the master weights; the optimizer steps in fp32), as verl's "
    "default; the compute dtype is fsdp_config.dtype (hybrid: fsdp_config.mixed_precision)"
)
_ROUTER = "MoE router replay (verl's R2/R3) is not implemented: routing is recomputed in every forward"
_MTP = "multi-token prediction (MTP layers trained or used for speculative decoding) is not implemented"
_TILED = "the tiled MLP (a memory saving for long sequences) is not implemented"
_OPTIM = "hybrid's optimizer is torch.optim.AdamW (fused), with the section's lr, betas and weight_decay"
_RM_POOL = "hybrid's reward model shards over all ranks"
_PROFILE_ROLLOUT = (
    "hybrid's fused worker profiles generation as the actor's profiler section says "
    f"({ARR}.actor.profiler.*); the rollout has no section of its own"
)
_PROFILE_RM = "hybrid profiles the actor, reference and critic workers (their profiler sections), not the reward model"
_ROLLOUT_N = f"verl fills it from {ARR}.rollout.n; set that key"
DEFAULT_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    f"{ARR}.actor.calculate_sum_pi_squared": (
        (False,),
        "the sum of squared token probabilities over the vocabulary feeds verl's optimal-token-baseline "
        "estimator, which hybrid does not have",
    ),
    f"{ARR}.actor.sum_pi_squared_checkpointing": ((False,), "it only serves calculate_sum_pi_squared (not here)"),
    f"{ARR}.actor.rollout_n": (("${oc.select:actor_rollout_ref.rollout.n,1}",), _ROLLOUT_N),
    f"{ARR}.ref.rollout_n": (("${oc.select:actor_rollout_ref.rollout.n,1}",), _ROLLOUT_N),
    "critic.rollout_n": (("${oc.select:actor_rollout_ref.rollout.n,1}",), _ROLLOUT_N),
    f"{ARR}.model.custom_chat_template": (
        (None,),
        "hybrid renders prompts with the tokenizer's own chat template; put yours in the model folder's "
        "tokenizer_config.json",
    ),
    f"{ARR}.model.enable_activation_offload": ((False,), "activation offloading to CPU is not implemented"),
    "critic.model.enable_activation_offload": ((False,), "activation offloading to CPU is not implemented"),
    f"{ARR}.model.hf_config_path": ((None,), "the model's config.json is read from actor_rollout_ref.model.path"),
    f"{ARR}.model.tiled_mlp.enabled": ((False,), _TILED),
    f"{ARR}.model.tiled_mlp.num_shards": ((4,), _TILED),
    "critic.model.tiled_mlp.enabled": ((False,), _TILED),
    "critic.model.tiled_mlp.num_shards": ((4,), _TILED),
    f"{ARR}.model.mtp.enable": ((False,), _MTP),
    f"{ARR}.model.mtp.enable_train": ((False,), _MTP),
    f"{ARR}.model.mtp.enable_rollout": ((False,), _MTP),
    f"{ARR}.model.mtp.detach_encoder": ((False,), _MTP),
    f"{ARR}.model.mtp.method": (("mtp",), _MTP),
    f"{ARR}.model.mtp.mtp_loss_scaling_factor": ((0.1,), _MTP),
    f"{ARR}.model.mtp.num_speculative_tokens": ((1,), _MTP),
    f"{ARR}.model.mtp.speculative_algorithm": (("EAGLE",), _MTP),
    f"{ARR}.model.mtp.speculative_eagle_topk": ((2,), _MTP),
    f"{ARR}.model.mtp.speculative_num_draft_tokens": ((4,), _MTP),
    f"{ARR}.model.mtp.speculative_num_steps": ((2,), _MTP),
    f"{ARR}.rollout.mtp": (("${oc.select:actor_rollout_ref.model.mtp, null}", None), _MTP),
    f"{ARR}.rollout.enable_rollout_routing_replay": ((False,), _ROUTER),
    f"{ARR}.rollout.cudagraph_capture_sizes": (
        (None,),
        "hybrid's engine captures CUDA graphs at vLLM's own sizes (with enforce_eager=false); none on CPU",
    ),
    f"{ARR}.rollout.data_parallel_size": ((1,), "one engine per training rank (no vLLM data parallel)"),
    f"{ARR}.rollout.expert_parallel_size": ((1,), "hybrid's engine has no expert parallelism"),
    f"{ARR}.rollout.pipeline_model_parallel_size": ((1,), "hybrid's engine has no pipeline parallelism"),
    f"{ARR}.rollout.over_sample_rate": (
        (0, None),
        "hybrid waits for every training response (aborting the slowest would change which responses train)",
    ),
    f"{ARR}.rollout.quantization": (
        (None,),
        "the trainer's weights are loaded into the engine's parameters in place, unquantized",
    ),
    f"{ARR}.rollout.quantization_config_file": ((None,), "no quantized engine (rollout.quantization)"),
    f"{ARR}.rollout.skip_rollout": (
        (False,),
        "every step generates; verl's replay of rollouts cached in skip_dump_dir is not implemented",
    ),
    f"{ARR}.rollout.multi_turn.num_repeat_rollouts": ((None,), "verl's SGLang multi-turn option; not here"),
    f"{ARR}.rollout.multi_turn.tokenization_sanity_check_mode": (
        ("strict",),
        "hybrid builds trajectories from the engine's token ids turn by turn (no re-tokenization to check)",
    ),
    f"{ARR}.rollout.multi_turn.use_inference_chat_template": (
        (False,),
        "observations are rendered with the chat template used in training (no separate inference template)",
    ),
    f"{ARR}.rollout.profiler.enable": (
        ("${oc.select:actor_rollout_ref.actor.profiler.enable,false}", False),
        _PROFILE_ROLLOUT,
    ),
    f"{ARR}.rollout.profiler.all_ranks": (
        ("${oc.select:actor_rollout_ref.actor.profiler.all_ranks,false}", False),
        _PROFILE_ROLLOUT,
    ),
    f"{ARR}.rollout.profiler.ranks": (("${oc.select:actor_rollout_ref.actor.profiler.ranks,[]}", []), _PROFILE_ROLLOUT),
    f"{ARR}.rollout.profiler.save_path": (("${oc.select:global_profiler.save_path,null}", None), _PROFILE_ROLLOUT),
    f"{ARR}.rollout.profiler.tool": (("${oc.select:global_profiler.tool,null}", None), _PROFILE_ROLLOUT),
    f"{ARR}.rollout.profiler.tool_config": (
        ("${oc.select:actor_rollout_ref.actor.profiler.tool_config,null}", None),
        _PROFILE_ROLLOUT,
    ),
    "reward_model.profiler.enable": ((False,), _PROFILE_RM),
    "reward_model.profiler.all_ranks": ((False,), _PROFILE_RM),
    "reward_model.profiler.ranks": (([],), _PROFILE_RM),
    "reward_model.profiler.save_path": (("${oc.select:global_profiler.save_path,null}", None), _PROFILE_RM),
    "reward_model.profiler.tool": (("${oc.select:global_profiler.tool,null}", None), _PROFILE_RM),
    "reward_model.profiler.tool_config": (
        ("${oc.select:actor_rollout_ref.actor.profiler.tool_config,null}", None),
        _PROFILE_RM,
    ),
    "reward_model.model.fsdp_config.fsdp_size": ((-1,), _RM_POOL),
    "reward_model.model.override_config": (({},), "the reward model loads with its own config.json"),
    "reward_model.model.use_fused_kernels": (
        ("${actor_rollout_ref.model.use_fused_kernels}", False, None),
        "hybrid's reward model scores with its full output layer",
    ),
    "reward_model.ulysses_sequence_parallel_size": ((1,), "hybrid's reward model does not split sequences"),
    "reward_model.reward_loop_source": (
        ("register",),
        "hybrid's reward loop scores with the registered reward managers (reward_model.reward_manager); register "
        f"your own through {ARR}.model.external_lib",
    ),
    "reward_model.reward_loop_module_path": ((None,), "no reward-loop class of your own (reward_loop_source)"),
    "reward_model.reward_loop_class_name": ((None,), "no reward-loop class of your own (reward_loop_source)"),
    "reward_manager.source": (
        ("register",),
        "reward managers come from hybrid's registry: register yours with reward.manager.register_reward_manager "
        f"in a module named by {ARR}.model.external_lib",
    ),
    "reward_manager.module.path": ((None,), "no reward-manager module of your own (reward_manager.source)"),
    "reward_manager.module.name": (("custom_reward_manager",), "no reward-manager module of your own"),
    "data.datagen.name": (
        (None,),
        "verl's dynamic data generation (a dataset that grows during training) is not implemented",
    ),
    "data.datagen.path": ((None,), "verl's dynamic data generation is not implemented"),
    "data.sampler.class_name": (
        (None,),
        "the training data is drawn by hybrid's resumable loader (no sampler class of your own)",
    ),
    "data.sampler.class_path": (
        (None,),
        "the training data is drawn by hybrid's resumable loader (no sampler class of your own)",
    ),
    "data.tool_config_path": (
        ("${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path, null}", None),
        f"hybrid reads tools from {ARR}.rollout.multi_turn.tool_config_path; set that key",
    ),
    "trainer.del_local_ckpt_after_load": ((False,), "hybrid keeps the checkpoint it resumed from"),
    "transfer_queue.enable": (
        (False,),
        "verl's TransferQueue data plane is not implemented (batches travel as DataProto)",
    ),
    "ray_kwargs.ray_init.num_cpus": (
        (None,),
        "hybrid sizes Ray's CPU slots itself (a private cluster with a slot per rank at least), or joins the "
        "cluster RAY_ADDRESS names, whose resources are its own",
    ),
    "ray_kwargs.timeline_json_file": ((None,), "hybrid does not write Ray's timeline"),
}
for _role in (f"{ARR}.actor", f"{ARR}.ref"):
    DEFAULT_ONLY[f"{_role}.router_replay.mode"] = (("disabled",), _ROUTER)
    DEFAULT_ONLY[f"{_role}.router_replay.record_file"] = ((None,), _ROUTER)
    DEFAULT_ONLY[f"{_role}.router_replay.replay_file"] = ((None,), _ROUTER)
for _role in ROLES:
    DEFAULT_ONLY[f"{_role}.fsdp_config.model_dtype"] = (("fp32", "float32"), _FP32)
for _section in (f"{ARR}.actor.optim", "critic.optim"):
    DEFAULT_ONLY[f"{_section}.optimizer"] = (("AdamW",), _OPTIM)
    DEFAULT_ONLY[f"{_section}.optimizer_impl"] = (("torch.optim",), _OPTIM)
    DEFAULT_ONLY[f"{_section}.override_optimizer_config"] = ((None, {}), _OPTIM)

# ------------------------------------------------------------------ accepted at any value, named at start
_ENGINE_WORKER = (
    "read only by verl's engine workers (trainer.use_legacy_worker_impl=disable); verl's default FSDP workers, "
    "which hybrid follows, read the role's own keys instead"
)
_MEGATRON = "verl saves asynchronously with Megatron only; under FSDP checkpoints are written in the step, as here"
_TOOLS = "options of a profiler tool hybrid refuses (nsys, torch_memory): they matter only with that tool"
_SHM = "copies files into /dev/shm before loading (speed only); hybrid loads these in place"
NO_EFFECT: tuple[tuple[re.Pattern, str], ...] = (
    (
        re.compile(
            r"^(actor_rollout_ref\.(actor|ref)|critic\.model)\.fsdp_config\.(seed|full_determinism|use_torch_compile"
            r"|forward_only|strategy|ulysses_sequence_parallel_size|entropy_checkpointing"
            r"|entropy_from_logits_with_chunking)$"
        ),
        _ENGINE_WORKER,
    ),
    (
        re.compile(r"^actor_rollout_ref\.ref\.fsdp_config\.(fsdp_size|offload_policy|optimizer_offload)$"),
        _ENGINE_WORKER,
    ),
    (re.compile(r"^critic\.data_loader_seed$"), _ENGINE_WORKER),
    (re.compile(r"^(actor_rollout_ref\.actor|critic)\.optim\.clip_grad$"), _ENGINE_WORKER + " (grad_clip)"),
    (re.compile(r"^(actor_rollout_ref\.actor|critic)\.checkpoint\.async_save$"), _MEGATRON),
    (
        re.compile(
            r"^((actor_rollout_ref\.(actor|ref)|critic)\.profiler\.tool_config\.(nsys|torch_memory)"
            r"|global_profiler\.global_tool_config\.(nsys|torch_memory))(\..+)?$"
        ),
        _TOOLS,
    ),
    (re.compile(r"^actor_rollout_ref\.actor\.calculate_entropy$"), "hybrid logs actor/entropy every step either way"),
    (re.compile(r"^(data|critic\.model|reward_model\.model)\.use_shm$"), _SHM),
    (
        re.compile(r"^actor_rollout_ref\.rollout\.multi_stage_wake_up$"),
        "SGLang's staged wake-up; hybrid's engines are vllm and hf",
    ),
    (
        re.compile(r"^actor_rollout_ref\.rollout\.skip_dump_dir$"),
        "read only with rollout.skip_rollout=true, which hybrid refuses",
    ),
    (
        re.compile(r"^actor_rollout_ref\.rollout\.skip_tokenizer_init$"),
        "hybrid's engine reads token ids either way and keeps its tokenizer for stop strings",
    ),
    (
        re.compile(r"^actor_rollout_ref\.rollout\.(prometheus|trace)(\..+)?$"),
        "verl's Prometheus metrics export and rollout tracing services (weave, mlflow); hybrid runs neither",
    ),
    (
        re.compile(r"^reward_model\.(n_gpus_per_node|nnodes)$"),
        "the devices of verl's reward-model pool (with enable_resource_pool); hybrid's reward-loop workers run "
        "on CPU cores (reward_model.num_workers)",
    ),
    (
        re.compile(r"^trainer\.esi_redundant_time$"),
        "verl's save-before-expiry on Volcengine elastic instances; hybrid saves on SIGTERM (trainer.save_freq > 0)",
    ),
    (
        re.compile(r"^data\.(image_patch_size|return_multi_modal_inputs)$"),
        "multimodal inputs; hybrid trains text-only models (a data file with images is refused)",
    ),
    (re.compile(r"^data\.validation_shuffle$"), "validation covers every row; their order changes no metric"),
)


def _value(text: str) -> Any:
    """An override's value as YAML reads it (Hydra's quoting removed); unparsable text stays text."""
    text = text.strip()
    if text.startswith("${"):
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _hydra_value(raw: str) -> Any:
    """An override's value as Hydra reads it (`{a:b}` is a dict there, not in YAML)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_override(raw).value()
    except OverrideParseException:  # Hydra says what is wrong with it when it applies the override
        return _value(_split(raw)[2])


def _split(raw: str) -> tuple[str, str, str]:
    prefix = re.match(r"^(\+\+|\+|~)?", raw).group(0)
    key, _, value = raw[len(prefix) :].partition("=")
    return prefix, key, value


def _allowed(value: Any, allowed: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `allowed` (1 and 1.0 alike; True is not 1)."""
    for accepted in allowed:
        if isinstance(accepted, bool) or isinstance(value, bool) or accepted is None or value is None:
            if type(value) is type(accepted) and value == accepted:
                return True
        elif value == accepted:
            return True
    return False


def rewrite_overrides(overrides: Sequence[str], known: Collection[str]) -> tuple[list[str], str | None, list[str]]:
    """(the overrides with the keys above rewritten or removed, one line naming those accepted with
    no effect or None, one problem per refused value). `known`: the paths of hybrid's default config;
    a key among them is left as given."""
    result: list[str] = []
    no_effect: dict[str, list[str]] = {}
    problems: list[str] = []
    renamed: dict[str, list[tuple[Any, str]]] = {}  # hybrid's key -> [(value, the verl override)]
    given: dict[str, tuple[Any, str]] = {}  # keys given under their own name
    for raw in overrides:
        prefix, key, text = _split(raw)
        precision_key = key if key in PRECISION_KEYS else key.rpartition(".")[0]
        if precision_key in PRECISION_KEYS and prefix != "~":
            value = _hydra_value(raw)
            if key != precision_key or isinstance(value, dict):
                translated, problem = precision_override(key, value)
                problems += [problem] if problem else []
                if translated is not None:
                    result.append(translated)
                    renamed.setdefault(precision_key, []).append((translated.partition("=")[2], raw))
                continue
        if key in known:
            result.append(raw)
            if prefix != "~":
                given[key] = (_value(text), raw)
            continue
        reason = next((why for pattern, why in NO_EFFECT if pattern.match(key)), None)
        if reason is not None:
            no_effect.setdefault(reason, []).append(key)
            continue
        if prefix == "~" and (key in TARGETS or key in DEFAULT_ONLY or key in RENAMED or key in DTYPE_KEYS):
            continue  # deleting a key hybrid does not hold: nothing to delete
        value = _value(text)
        if key in TARGETS:
            if value != TARGETS[key]:
                problems.append(f"{key}={text}: {_TARGET_WHY}")
        elif key in DEFAULT_ONLY:
            allowed, why = DEFAULT_ONLY[key]
            if not _allowed(value, allowed):
                accepted = " or ".join(str(a) if a is not None else "null" for a in allowed)
                problems.append(f"{key}={text}: {why}" + (f" (accepted: {accepted})" if accepted else ""))
        elif key in DTYPE_KEYS:
            name = str(value).removeprefix("torch.")
            if name not in _DTYPES:
                problems.append(f"{key}={text}: hybrid computes in bfloat16 or float32 (no fp16 loss scaling)")
            else:
                result.append(f"{DTYPE_KEYS[key]}={_DTYPES[name]}")
                renamed.setdefault(DTYPE_KEYS[key], []).append((_DTYPES[name], raw))
        elif key in RENAMED:
            if INTERPOLATED.get(key) != text.strip():
                result.append(f"{prefix}{RENAMED[key]}={text}")
                renamed.setdefault(RENAMED[key], []).append((value, raw))
        else:
            result.append(raw)
    for target, sources in renamed.items():
        if target in given:
            sources = [*sources, given[target]]
        if len({repr(value) for value, _ in sources}) > 1:
            problems.append(f"{target} is given as {' and as '.join(raw for _, raw in sources)}: give one of them")
    note = "; ".join(f"{', '.join(keys)}: {why}" for why, keys in no_effect.items())
    return result, (f"accepted with no effect here: {note}" if note else None), problems


__all__ = ["DEFAULT_ONLY", "DTYPE_KEYS", "NO_EFFECT", "RENAMED", "TARGETS", "rewrite_overrides"]
