"""The SkyRL dialect: SkyRL's command-line keys (`trainer.*`, `generator.*`, `data.*`,
`environment.*`, as in skyrl-train's YAML and its config dataclasses) translated into
hybrid's verl keys.

`python -m hybrid.main_ppo --dialect skyrl trainer.train_batch_size=16 ...` reads every
`key=value` as a SkyRL key. Both spellings SkyRL accepts work: the dataclass paths
(`generator.inference_engine.backend`) and the older YAML ones (`generator.backend`), listed
in ALIASES. Values may use OmegaConf interpolation (`${oc.env:HOME}/data`, or another SkyRL
key given on the same line). `translate_skyrl` returns the verl overrides or raises
ConfigError naming every key that has no equivalent, with the reason.

Keys not given take SkyRL's own defaults, as a SkyRL launch script relies on them
(n_samples_per_prompt 5, use_kl_loss true, eps_clip 0.2, lr 1e-6, ...): every key of SkyRL's
config classes with a `map` rule is translated with its default (skyrl_default_values.py, from
skyrl/train/config/config.py) unless given, except the keys skyrl_defaults.py UNFILLED lists
with the reason (machine paths, the wandb logger, values hybrid derives); hybrid/dialects/table.py
`Dialect.fill` does the filling, and `--cfg job` shows the result.

SkyRL picks its trainer by entry module, which no key says; hybrid's own `async_training.*`
keys and `algorithm.on_policy_distillation` (HYBRID_KEYS) may therefore be added to a SkyRL
line and pass through unchanged, replacing what the SkyRL keys would write there. SkyRL's
one-step-off entry module (examples/train/async/main_async) is
`async_training.max_staleness_steps=1` on the line, its on-policy distillation one
(examples/train/on_policy_distillation/main_on_policy_distill)
`algorithm.on_policy_distillation=true`.

Units match verl's almost everywhere (SkyRL's `policy_mini_batch_size` is in prompts, its
micro batches in samples per GPU, like verl); the exceptions are transformed here:
warm-up steps (SkyRL counts optimizer steps, hybrid training steps), the weight-transfer
bucket (GB -> MB), KL estimator and loss-reduction names, and SkyRL's plain PPO clip
(`policy_loss_type=regular`), which is hybrid's dual-clip loss with a bound that never binds.
The multi-turn keys (generator.max_turns, the token budgets, environment.*) are in
skyrl_multi_turn.py, the `data.*` and `trainer.*` rules in skyrl_trainer.py, the
`trainer.algorithm.*` rules in skyrl_algorithm.py and the converters the rules call in
skyrl_convert.py.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_algorithm import ALGORITHM_RULES
from hybrid.dialects.skyrl_convert import (
    IN_PROCESS,
    ROLLOUT,
    _additional_sampling,
    _bucket_mb,
    _eval_equal,
    _eval_temperature,
    _logprobs,
    _num_engines,
    _remote_urls,
    free_form,
)
from hybrid.dialects.skyrl_defaults import DEFAULTS, UNFILLED
from hybrid.dialects.skyrl_language_model import LANGUAGE_MODEL_RULES
from hybrid.dialects.skyrl_multi_turn import ENVIRONMENT_RULES, GENERATOR_RULES
from hybrid.dialects.skyrl_profiler import PROFILER_RULES
from hybrid.dialects.skyrl_remote import REMOTE_RULES
from hybrid.dialects.skyrl_trainer import TRAINER_RULES
from hybrid.dialects.skyrl_tuning import TUNING_RULES
from hybrid.dialects.skyrl_vision import VISION_RULE
from hybrid.dialects.table import Dialect, Refusal, choice, custom, ignore, refuse, same, translate, via

# Older YAML spellings (skyrl-train's ppo_base_config.yaml) -> the dataclass paths.
_ENGINE_KEYS = (
    "model_dtype",
    "run_engines_locally",
    "backend",
    "weight_sync_backend",
    "async_engine",
    "vllm_v1_disable_multiproc",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "enforce_eager",
    "gpu_memory_utilization",
    "max_num_seqs",
    "override_existing_update_group",
    "enable_http_endpoint",
    "http_endpoint_host",
    "http_endpoint_port",
    "served_model_name",
    "distributed_executor_backend",
    "fully_sharded_loras",
    "enable_ray_prometheus_stats",
    "weight_transfer_threshold_cuda_ipc_GB",
)


def _expert_parallel(value: Any, ctx: Any) -> dict[str, Any]:
    if value == 1:
        return {}
    tp = ctx.effective("generator.inference_engine.tensor_parallel_size", f"{ROLLOUT}.tensor_model_parallel_size")
    if value != tp:
        raise Refusal(
            f"SkyRL requires data_parallel_size x tensor_parallel_size = expert_parallel_size; hybrid's engines have "
            f"data_parallel_size 1, so expert_parallel_size must be 1 or tensor_parallel_size ({tp})"
        )
    return {f"{ROLLOUT}.engine_kwargs.vllm.enable_expert_parallel": True}


def _http_endpoint(value: Any, ctx: Any) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    return {f"{ROLLOUT}.agent.enable_http_endpoint": True, f"{ROLLOUT}.mode": "async"} if value else {}


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
    "trainer.use_sample_packing": "trainer.remove_microbatch_padding",
}


# Remote engines (skyrl_remote.py) get the weights another way than the engines hybrid starts.
_REMOTE_PUSH = "a remote deployment (external_proxy_url / external_server_urls) gets the full weights over HTTP"

RULES = (
    *TRAINER_RULES,
    *ALGORITHM_RULES,
    *TUNING_RULES,
    *PROFILER_RULES,
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
    via(
        "generator.sampling_params.logprobs",
        f"{ROLLOUT}.calculate_log_probs",
        _logprobs,
        "null -> false, N -> true",
        "true keeps the sampled token's log-prob (rollout_log_probs); with null none is kept, and off-policy "
        "correction, which reads them, is refused at start (hybrid/config/rules_log_probs.py)",
    ),
    custom(
        "generator.sampling_params.additional_kwargs.*",
        (f"{ROLLOUT}.<name>",),
        _additional_sampling,
        "presence_penalty, frequency_penalty, stop_token_ids, repetition_penalty, min_p, ignore_eos",
    ),
    custom(
        "generator.eval_sampling_params.temperature",
        (f"{ROLLOUT}.val_kwargs.temperature", f"{ROLLOUT}.val_kwargs.do_sample"),
        _eval_temperature,
        "temperature; do_sample = temperature > 0",
    ),
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
    same(
        "generator.apply_overlong_filtering",
        "algorithm.mask_truncated_responses",
        note="DAPO's overlong filtering: a response cut at the length limit (no EOS) leaves every loss; SkyRL "
        "tells them by the engine's stop reason, hybrid by a full-length response not ending in EOS",
    ),
    refuse(
        "generator.rope_scaling",
        "the engine uses the policy's model config (trainer.rope_scaling)",
        accept=(None,),
    ),
    refuse("generator.rope_theta", "the engine uses the policy's model config (trainer.rope_theta)", accept=(None,)),
    VISION_RULE,
    ignore(
        "generator.inference_engine.enable_pd",
        "SkyRL's prefill/decode disaggregation (num_prefill of its num_engines engines prefill, the rest decode) "
        "places the work of sampling; each hybrid engine prefills and decodes its own requests, "
        "from the same num_engines engines and the same sampling settings",
    ),
    ignore("generator.inference_engine.num_prefill", "read with enable_pd (see there)"),
    *LANGUAGE_MODEL_RULES,
    # ---- inference engine (older spellings in ALIASES)
    choice(
        "generator.inference_engine.backend",
        f"{ROLLOUT}.name",
        {"vllm": "vllm"},
        refused={"sglang": "hybrid's engines are in-process vLLM and Hugging Face generate"},
    ),
    choice(
        "generator.inference_engine.model_dtype",
        f"{ROLLOUT}.dtype",
        {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "auto": "auto"},
    ),
    *REMOTE_RULES,
    custom(
        "generator.inference_engine.remote_urls",
        (),
        _remote_urls,
        "accepted with run_engines_locally=true (SkyRL ignores them then)",
    ),
    custom(
        "generator.inference_engine.enable_http_endpoint",
        (f"{ROLLOUT}.agent.enable_http_endpoint", f"{ROLLOUT}.mode"),
        _http_endpoint,
        "true -> agent.enable_http_endpoint=true and mode=async (the endpoint serves agent loops)",
    ),
    same("generator.inference_engine.http_endpoint_host", f"{ROLLOUT}.agent.http_endpoint_host"),
    same("generator.inference_engine.http_endpoint_port", f"{ROLLOUT}.agent.http_endpoint_port"),
    ignore(
        "generator.inference_engine.served_model_name",
        "hybrid's endpoint serves the one policy model whatever name a request gives",
    ),
    ignore(
        "generator.inference_engine.async_engine",
        "single-turn batched generation is the same with either engine; hybrid drives vLLM's offline engine in-process",
    ),
    custom(
        "generator.inference_engine.num_engines",
        (),
        _num_engines,
        "colocate_all=true: must equal the policy's devices / tensor_parallel_size; colocate_all=false: read by "
        "colocate_all (the engines' devices)",
    ),
    same("generator.inference_engine.tensor_parallel_size", f"{ROLLOUT}.tensor_model_parallel_size"),
    refuse(
        "generator.inference_engine.pipeline_parallel_size",
        "hybrid's engine shards by tensor parallelism only",
        accept=(1,),
    ),
    custom(
        "generator.inference_engine.expert_parallel_size",
        (f"{ROLLOUT}.engine_kwargs.vllm.enable_expert_parallel",),
        _expert_parallel,
        "1: nothing; = tensor_parallel_size -> engine_kwargs.vllm.enable_expert_parallel=true; other sizes refused",
        "SkyRL requires expert_parallel_size = data_parallel_size x tensor_parallel_size and passes vLLM "
        "enable_expert_parallel; hybrid's engines have no data parallelism, so the experts are split over the "
        "tensor-parallel group, as vLLM does",
    ),
    refuse(
        "generator.inference_engine.data_parallel_size",
        "one engine per tensor-parallel group; no engine data parallelism",
        accept=(1,),
    ),
    ignore("generator.inference_engine.weight_sync_backend", f"no collective: {IN_PROCESS}; {_REMOTE_PUSH}"),
    ignore(
        "generator.inference_engine.delta_weight_sync.*",
        "SkyRL's transport of checkpoint deltas through shared storage to engines of their own "
        f"(weight_sync_backend=delta); the engines get the same weights: {IN_PROCESS}; {_REMOTE_PUSH}",
    ),
    via(
        "generator.inference_engine.weight_transfer_threshold_cuda_ipc_GB",
        f"{ROLLOUT}.update_weights_bucket_megabytes",
        _bucket_mb,
        "GB x 1024 -> MB",
        "the bucket size of hybrid's in-memory weight sync",
    ),
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
    ignore(
        "generator.inference_engine.enable_ray_prometheus_stats",
        "SkyRL's export of the engines' metrics to Ray's Prometheus endpoint (a monitor; hybrid has none): "
        "nothing sampled or trained changes",
    ),
    free_form("generator.inference_engine.engine_init_kwargs.*", f"{ROLLOUT}.engine_kwargs.vllm"),
    # ---- environment
    *ENVIRONMENT_RULES,
)

DIALECT = Dialect(
    name="SkyRL",
    rules=RULES,
    aliases=ALIASES,
    defaults=DEFAULTS,
    fill=True,
    unfilled=UNFILLED,
    always={"trainer.merge_on_finish": False, "trainer.plot_on_finish": False},
    always_why=(
        "SkyRL writes no merged Hugging Face folder and no plots at the end of a run (its Hugging Face "
        "exports follow trainer.hf_save_interval)"
    ),
    notes=(
        "Keys you do not give take SkyRL's defaults (its config classes, skyrl/train/config/config.py, as "
        "hybrid/dialects/skyrl_default_values.py holds them), as a SkyRL launch script expects: "
        "n_samples_per_prompt 5, use_kl_loss true (k3, kl_loss_coef 0.001), eps_clip_low/high 0.2, policy_loss_type "
        "regular, lr 1e-6, train_batch_size 1024, policy_mini_batch_size 256, micro batches 1, max_prompt_length 512, "
        "max_generate_length 1024, eval temperature 0, ckpt_interval 10, seed 42 and the rest. Not applied "
        "(hybrid/dialects/skyrl_defaults.py UNFILLED says why, key by key): paths on SkyRL's machines (data, "
        "ckpt_path, export_path), trainer.logger (SkyRL's wandb; hybrid logs to the console unless given), "
        "num_engines and the reference's and critic's placement (derived from the policy's devices), dtypes hybrid's "
        "auto already sets to bf16 on a GPU, and vLLM settings whose SkyRL default is vLLM's own.",
        "Data files use verl's columns (prompt, data_source, reward_model.ground_truth, extra_info) or SkyRL's "
        "(reward_spec instead of reward_model, read as it; env_class). "
        "Single-turn, the scorer is picked by each row's data_source. In episodes (generator.max_turns > 1, "
        "or environment.env_class naming an environment) the environment is environment.env_class, else "
        "the row's env_class column (SkyRL's datasets), and it reads the row's columns (reward_spec, or "
        "verl's reward_model as reward_spec).",
        "Placement and asynchronous training: trainer.placement.policy_num_nodes / policy_num_gpus_per_node are "
        "the training group (trainer.nnodes / n_gpus_per_node). With colocate_all=true (SkyRL's default) the "
        "engines share those devices, as hybrid's fused engine does. With colocate_all=false they run on "
        "generator.inference_engine.num_engines x tensor_parallel_size devices of their own "
        "(actor_rollout_ref.hybrid_engine=false, rollout.n_gpus_per_node). SkyRL picks its trainer by entry "
        "point: hybrid reads trainer.fully_async.* as its fully async trainer (async_training.mode=fully_async), "
        "and otherwise runs SkyRL's synchronous trainer's schedule (one_step_off at lag 0). SkyRL's one-step-off "
        "trainer (entry module examples.train.async.main_async) has no key of its own: add hybrid's "
        "async_training.max_staleness_steps=1 to the line (hybrid's async_training.* keys pass through a SkyRL "
        "line): one_step_off at lag 1, the batch of step s + 1 generated with the weights of step s - 1 while "
        "step s trains, as SkyRL's. One difference: SkyRL restarts its generation loop at every epoch, so the "
        "first step of an epoch trains a batch generated with the current weights; hybrid keeps the one-step lag "
        "across epochs.",
        "On-policy distillation (entry module examples.train.on_policy_distillation.main_on_policy_distill) has no "
        "key of its own either: add hybrid's algorithm.on_policy_distillation=true to the line. The teacher is "
        "trainer.ref.model.path (hybrid's actor_rollout_ref.ref.model.path, the student's tokenizer); each token's "
        "reward is -(student log-prob - teacher log-prob), the environment's reward dropped, and "
        "advantage_estimator=no_op passes it through, as SkyRL's trainer does after its log-prob passes.",
    ),
)


# hybrid keys a SkyRL line may carry (SkyRL has no section of this name): what a SkyRL entry
# module chooses (a schedule, on-policy distillation's reward), written by the user in hybrid's words.
ASYNC_KEYS = ("async_training.",)
# The verifiers entry module (examples/train_integrations/verifiers) is hybrid's agent loop
# verifiers_env: its environment and the multi-turn switch it needs (workers/rollout/verifiers_env.py).
VERIFIERS_KEYS = ("actor_rollout_ref.rollout.agent.verifiers_env=", "actor_rollout_ref.rollout.multi_turn.enable=")
HYBRID_KEYS = (*ASYNC_KEYS, "algorithm.on_policy_distillation=", *VERIFIERS_KEYS)


def _hybrid_key(raw: str) -> str | None:
    key = raw.split("=", 1)[0]
    return key if raw.startswith(HYBRID_KEYS) else None


def translate_skyrl(overrides: list[str]) -> list[str]:
    """SkyRL `key=value` overrides -> verl overrides (`hydra.*` ones pass through unchanged).
    Raises ConfigError naming every key that has no equivalent."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from hybrid.config import ConfigError
    from hybrid.config.override_values import json_values

    # SkyRL's scripts pass dicts as JSON (engine_init_kwargs='{"key": value}'), which Hydra's
    # grammar does not read; rewritten first, or named in one line.
    overrides, problems = json_values(overrides)
    hybrid_lines = [raw for raw in overrides if _hybrid_key(raw)]
    overrides = [raw for raw in overrides if not _hybrid_key(raw)]
    passthrough, given, order = [], {}, []
    for raw in overrides:
        try:
            override = OverridesParser.create().parse_override(raw)
        except HydraException as err:  # OverrideParseException and the lexer's own
            problems.append(f"cannot parse {raw!r}: {str(err).splitlines()[0]}")
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
            problems.append(
                f"{key}={given[key]}: cannot resolve the value ({type(err).__name__}: {err})".replace("\n", " ")
            )
    async_lines = [raw for raw in hybrid_lines if raw.startswith(ASYNC_KEYS)]
    if async_lines and resolved.get("trainer.placement.colocate_all", True) is not False:
        problems.append(
            f"{async_lines[0]}: hybrid's asynchronous schedules run the engines apart, and SkyRL's asynchronous "
            "trainers assert so too: add trainer.placement.colocate_all=false"
        )
    if problems:
        raise ConfigError("\n".join(["the SkyRL command line cannot be read:"] + [f"  - {p}" for p in problems]))
    translated = translate(DIALECT, resolved, order)
    if hybrid_lines:  # the user's own schedule wins over what the SkyRL keys would write there
        mine = {_hybrid_key(raw) for raw in hybrid_lines}
        translated = [line for line in translated if line.split("=", 1)[0] not in mine] + hybrid_lines
    return translated + passthrough


__all__ = ["ALIASES", "DIALECT", "HYBRID_KEYS", "RULES", "translate_skyrl"]
