"""SkyRL's defaults for the keys a SkyRL user does not give: which of them the SkyRL dialect
applies, and why the others are left at hybrid's defaults.

A SkyRL launch script relies on SkyRL's defaults for every key it does not set: a script with
no `generator.n_samples_per_prompt` samples 5 responses per prompt, trains with the KL loss
(`use_kl_loss=true`, k3, coefficient 0.001), PPO's plain clip at 0.2 on both sides, lr 1e-6 and
so on. The values are SkyRL's own (skyrl_default_values.py, generated from
skyrl/train/config/config.py by scripts/peer_config_keys.py). Every key there whose rule maps
it onto hybrid (`map` rules; `refuse` and `ignore` rules write nothing) is translated with its
default when not given, as if written on the line (hybrid/dialects/table.py, `Dialect.fill`),
except the keys in UNFILLED: values that name SkyRL's developers' machine (paths, a logger that
needs an account), keys whose default means "the value of another key", vLLM settings whose
SkyRL default is vLLM's own, and dtypes that hybrid's `auto` already sets to SkyRL's value on
the devices SkyRL runs on.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_default_values import COMMIT
from hybrid.dialects.skyrl_default_values import DEFAULTS as FIELD_DEFAULTS

_MACHINE = "SkyRL's default is a path on SkyRL's developers' machines; hybrid keeps its own"
_AUTO_DTYPE = (
    "hybrid's auto computes in bf16 on every device that supports it, which is every GPU SkyRL runs on "
    "(SkyRL's default: bf16), and in fp32 on a CPU"
)
_PLACED = (
    "read by SkyRL only for a reference or critic model, which hybrid places on the policy's devices; when given, "
    "the rule checks it against the policy's placement"
)
_REF_LAYOUT = (
    "the reference runs in the policy's workers, laid out as the policy (SkyRL's default, the same as the "
    "policy's own default, is a separate layout there); when given, the rule checks it equals the policy's"
)
_VLLM_DEFAULT = "SkyRL's default is vLLM's own, which hybrid's engine takes when the key is not given"

# Keys whose SkyRL default is not applied when not given: key (or `section.*`) -> why.
UNFILLED: dict[str, str] = {
    "data.train_data": _MACHINE,
    "data.val_data": _MACHINE,
    "trainer.ckpt_path": _MACHINE,
    "trainer.export_path": _MACHINE,
    "trainer.policy.model.path": "no default: the policy model must be given",
    "trainer.logger": (
        "SkyRL's default logger is wandb, which needs the package and an account; hybrid logs to the console "
        "unless trainer.logger is given"
    ),
    "environment.skyrl_gym.*": (
        "read by the environment, which takes SkyRL's defaults for the leaves not given (skyrl_multi_turn.py)"
    ),
    "generator.max_input_length": "SkyRL's null means trainer.max_prompt_length, which is filled",
    "generator.eval_sampling_params.max_generate_length": (
        "hybrid validates with the training length (sampling_params.max_generate_length); it has no separate key"
    ),
    "trainer.critic.model.path": (
        "SkyRL's null (no critic model); hybrid's critic, which runs only with advantage_estimator=gae, defaults "
        "to the policy's model"
    ),
    "trainer.ref.fsdp_config.fsdp_size": _REF_LAYOUT,
    "trainer.ref.sequence_parallel_size": _REF_LAYOUT,
    "generator.inference_engine.num_engines": (
        "with colocate_all=true SkyRL asserts num_engines x tensor_parallel_size = the policy's devices; hybrid "
        "derives the engines from the policy's devices (one per tensor-parallel group) and checks a value given"
    ),
    "trainer.placement.critic_num_nodes": _PLACED,
    "trainer.placement.critic_num_gpus_per_node": _PLACED,
    "trainer.placement.ref_num_nodes": _PLACED,
    "trainer.placement.ref_num_gpus_per_node": _PLACED,
    "trainer.fully_async.*": "read only by SkyRL's fully async trainer, when its keys are given",
    "trainer.bf16": _AUTO_DTYPE,
    "trainer.policy.fsdp_config.mixed_precision.param_dtype": _AUTO_DTYPE,
    "trainer.ref.fsdp_config.mixed_precision.param_dtype": _AUTO_DTYPE,
    "trainer.critic.fsdp_config.mixed_precision.param_dtype": _AUTO_DTYPE,
    "generator.inference_engine.enable_prefix_caching": _VLLM_DEFAULT,
    "generator.inference_engine.fully_sharded_loras": _VLLM_DEFAULT,
    "generator.inference_engine.language_model_only": _VLLM_DEFAULT,
    "generator.inference_engine.model_dtype": (
        "hybrid's auto: the model's own dtype (bf16 for the models SkyRL's examples train; SkyRL's default: bfloat16)"
    ),
}

# What SkyRL's __post_init__ methods make of a default (the classes' field defaults are in
# skyrl_default_values.py): GeneratorConfig.eval_sampling_params defaults to None, which becomes
# SamplingParams(temperature=0.0, max_generate_length=sampling_params.max_generate_length).
POST_INIT: dict[str, Any] = {"generator.eval_sampling_params.temperature": 0.0}

# SkyRL's defaults as its trainer sees them.
DEFAULTS: dict[str, Any] = {**FIELD_DEFAULTS, **POST_INIT}

__all__ = ["COMMIT", "DEFAULTS", "POST_INIT", "UNFILLED"]
