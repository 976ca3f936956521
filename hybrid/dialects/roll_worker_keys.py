"""The rest of ROLL's worker sections and pipeline fields, as rules of the ROLL dialect: every
field of WorkerConfig (roll/configs/worker_config.py, with the ModelArguments, TrainingArguments,
DataArguments and GeneratingArguments it holds) for each section the RLVR and agentic pipelines
have, and the remaining top-level fields of RLVRConfig / AgenticConfig, that roll_sections.py,
roll_workers.py and roll_rules.py do not map.

A field is ignored only where ROLL itself never reads it for that role (the note says where ROLL
reads it instead, e.g. an inference worker's optimizer settings, the validation section's model
and strategy, a field defined and read nowhere); a field that would change what is trained is
accepted at ROLL's default (and values that mean the same) and refused otherwise, with the
reason. Places in ROLL's code are named at the mirror's commit (tests/data/peer_config_keys.json).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.roll_episodes import is_agentic
from hybrid.dialects.roll_placement import ROLLOUT, parse_devices
from hybrid.dialects.table import Context, Refusal, Rule, custom, ignore, refuse

MAIN_ROLES = ("actor_train", "actor_infer", "reference", "critic")
TRAINED = ("actor_train", "critic")

_OPD = (
    "ROLL's on-policy distillation (a teacher's KL in the reward, use_opd / is_pure_opd) has no mapping; "
    "hybrid's own is algorithm.on_policy_distillation in verl keys (the teacher as the reference model)"
)
_NO_OPTIMIZER = {
    "actor_infer": "ROLL's inference worker (InferWorker on vLLM) builds no optimizer and trains nothing",
    "reference": "ROLL's reference only computes log-probs (ActorWorker.compute_log_probs); it never steps an "
    "optimizer",
}
_NOT_TRAINED = {
    "actor_infer": "ROLL's vLLM strategy loads the checkpoint itself; model_providers.load_model (where ROLL "
    "reads it) builds the trained roles",
    "reference": "read only for a trainable model (model_providers.setup_lora_training / freeze_model act on "
    "is_trainable); ROLL's reference is loaded frozen",
}
_VLM_DATA = {
    "image_max_pixels": 4096 * 4096,
    "image_min_pixels": 4 * 28 * 28,
    "video_max_pixels": 2048 * 2048,
    "video_min_pixels": 4 * 28 * 28,
    "video_total_pixels": 16384 * 28 * 28,
    "video_fps": 2.0,
    "video_max_frames": 128,
    "video_resize_chunk_frames": 64,
    "image_folder": None,
    "video_folder": None,
    "audio_folder": None,
    "custom_data_kwargs_func": None,
}
_VALIDATION_UNREAD = (
    "the validation section gives ROLL's RLVR pipeline its data_args (the validation file) and generating_args "
    "only (rlvr_pipeline.py); ROLL validates on actor_infer's engine, so this field is read nowhere"
)


def _per_role_rules(role: str) -> list[Rule]:
    """WorkerConfig fields every main role has, read the same way whatever the role."""
    rules = [
        ignore(f"{role}.world_size", "ROLL sets it from device_mapping (len / num_gpus_per_worker, WorkerConfig)"),
        ignore(
            f"{role}.tag_included",
            "read for teachers only (multi-teacher distillation routing, base_config._handle_opd_mapping)",
        ),
        ignore(f"{role}.opd_kl_coef", "read for teachers in on-policy distillation only (use_opd, is_pure_opd)"),
        ignore(
            f"{role}.mtp_training_mode",
            "read only by ROLL's Megatron strategy (multi-token-prediction layers, megatron_strategy.py), which "
            "hybrid refuses; its FSDP2 and vLLM strategies never read it",
        ),
        refuse(
            f"{role}.router_replay.mode",
            "ROLL itself raises NotImplementedError for R2 (WorkerConfig.__post_init__); R3 is read only by the "
            "Megatron and SGLang strategies (refused here), which replay the engine's MoE routing in training",
            accept=("disable", "R3"),
        ),
        ignore(
            f"{role}.model_args.adapter_name_or_path",
            "read nowhere in roll/ (its model providers load model_name_or_path; only mcore_adapter's converter "
            "takes an argument of that name)",
        ),
        ignore(
            f"{role}.model_args.device_map",
            "from_pretrained's placement of the weights, read only outside FSDP (model_providers.py); it moves "
            "weights, it does not change them",
        ),
        ignore(
            f"{role}.model_args.gradient_checkpointing_use_reentrant",
            "which torch.utils.checkpoint variant recomputes the activations: the same gradients",
        ),
        ignore(
            f"{role}.model_args.moe_aux_loss_coef",
            "sets the Hugging Face config's router_aux_loss_coef, whose auxiliary loss ROLL's FSDP2 loss never "
            "adds (only the Megatron strategy, refused, trains with it)",
        ),
        ignore(
            f"{role}.model_args.num_labels",
            "read only with model_type auto_token_classification / auto_sequence_classification "
            "(model_providers.py), which model_type refuses",
        ),
    ]
    if role != "actor_train":
        why = "ROLL's policy-gradient workers read actor_train's (actor_pg_worker.py: pipeline_config.actor_train)"
        names = ("pg_variant", "topr_positive_weight", "topr_negative_weight")
        rules += [ignore(f"{role}.{name}", why) for name in names]
        rules.append(
            ignore(
                f"{role}.data_args.*",
                "ROLL reads actor_train's data_args (the training data) and validation's (the validation file), "
                "not this section's (rlvr_pipeline.py)",
            )
        )
    if role == "actor_infer":
        rules.append(
            ignore(
                f"{role}.model_args.model_config_kwargs.*",
                "ROLL's vLLM strategy never reads it (the engine loads the checkpoint's own config)",
            )
        )
    else:
        rules.append(
            refuse(
                f"{role}.model_args.model_config_kwargs.*",
                "keyword arguments for Hugging Face's AutoConfig (and trl's value head) when ROLL loads this "
                "model for training or log-probs only; hybrid's model.override_config (verl keys) reaches the "
                "rollout engine too, which ROLL's do not: no mapping is kept",
                accept=lambda value: value in (None, {}),
                accepts="{}",
            )
        )
    if role in _NO_OPTIMIZER:
        rules += _untrained_rules(role)
    else:
        rules += _trained_rules(role)
    return rules


def _untrained_rules(role: str) -> list[Rule]:
    """actor_infer and reference: no optimizer, no adapters trained, no training batches."""
    rules = [
        ignore(f"{role}.training_args.*", _NO_OPTIMIZER[role]),
        ignore(f"{role}.model_args.additional_target", _NOT_TRAINED[role] + " (LoRA's modules_to_save)"),
        ignore(f"{role}.model_args.autocast_adapter_dtype", _NOT_TRAINED[role] + " (a trained adapter's dtype)"),
        ignore(f"{role}.model_args.lora_dropout", _NOT_TRAINED[role]),
        ignore(f"{role}.model_args.freeze_module_prefix", _NOT_TRAINED[role]),
        ignore(f"{role}.use_dynamic_batching_in_train", _NO_OPTIMIZER[role]),
        ignore(f"{role}.max_tokens_per_microbatch_in_train", _NO_OPTIMIZER[role]),
        ignore(f"{role}.sequence_length_round_in_train", _NO_OPTIMIZER[role]),
    ]
    if role == "reference":
        rules += [
            ignore(
                f"reference.model_args.{name}",
                "ROLL's LoRA is set up for a trainable model only (setup_lora_training); with LoRA ROLL takes the "
                "reference log-probs from actor_train with the adapter off (rlvr_pipeline.is_lora_training)",
            )
            for name in ("lora_rank", "lora_alpha", "lora_target")
        ]
        packing = (
            "hybrid's reference runs in actor_train's workers and packs its forward passes as actor_train's "
            "use_sequence_packing says; packing decides where tokens sit, not the log-probs"
        )
        rules += [
            ignore("reference.use_sequence_packing", packing),
            ignore("reference.sequence_packing_args.*", packing),
            ignore("reference.generating_args.*", "ROLL's reference never generates (it computes log-probs)"),
        ]
    else:
        vllm = "ROLL's vLLM inference worker never reads it (vLLM schedules its own batches)"
        rules += [
            ignore("actor_infer.use_dynamic_batching_in_infer", vllm),
            ignore("actor_infer.max_tokens_per_microbatch_in_infer", vllm),
            ignore("actor_infer.sequence_length_round_in_infer", vllm),
            ignore("actor_infer.use_sequence_packing", vllm),
            ignore("actor_infer.sequence_packing_args.*", vllm),
            *_generation_rules("actor_infer"),
        ]
    return rules


def _trained_rules(role: str) -> list[Rule]:
    """actor_train and critic: the TrainingArguments fields ROLL's FSDP2 strategy never reads, and
    the model settings of a trained model hybrid has no key for."""
    unread = (
        "ROLL's FSDP2 strategy and its RLVR / agentic pipelines never read it (only the Megatron strategy, "
        "refused, takes the training arguments whole)"
    )
    rules = [
        ignore(f"{role}.training_args.bf16", f"{unread}; the dtype is model_args.dtype"),
        ignore(f"{role}.training_args.fp16", f"{unread}; the dtype is model_args.dtype"),
        ignore(f"{role}.training_args.tf32", unread),
        ignore(f"{role}.training_args.data_seed", f"{unread}; ROLL's data order follows the pipeline's seed"),
        ignore(f"{role}.training_args.save_hf_model", unread),
        ignore(
            f"{role}.training_args.dataloader_num_workers",
            "read only by ROLL's SFT and distillation pipelines (worker processes of their data loaders)",
        ),
        refuse(
            f"{role}.model_args.additional_target",
            "LoRA's modules_to_save (modules trained whole beside the adapters); hybrid's LoRA trains the adapters "
            "only",
            accept=(None,),
        ),
        refuse(
            f"{role}.model_args.autocast_adapter_dtype",
            "hybrid keeps the trained adapter's weights in fp32 (FSDP's fp32 master weights), as ROLL's default "
            "true (PEFT's cast of bf16 / fp16 adapters to fp32)",
            accept=(True,),
        ),
    ]
    if role == "critic":
        lora_off = "read only with lora_target (ROLL's LoRA switch, setup_lora_training), refused for the critic"
        rules += [
            refuse(
                "critic.model_args.freeze_module_prefix",
                "hybrid trains every parameter of the value model (LoRA: critic.model.lora_rank in verl keys)",
                accept=(None,),
            ),
            refuse(
                "critic.model_args.lora_target",
                "ROLL's critic LoRA trains its value head whole beside the adapters; hybrid's critic LoRA puts "
                "adapters on the value head too (all-linear): no mapping is kept",
                accept=(None,),
            ),
            ignore("critic.model_args.lora_rank", lora_off),
            ignore("critic.model_args.lora_alpha", lora_off),
            ignore("critic.model_args.lora_dropout", lora_off),
        ]
    if role == "actor_train":
        rules.append(
            ignore(
                "actor_train.generating_args.*",
                "ROLL's actor_train never generates (actor_infer does, with its own generating_args)",
            )
        )
    return rules


def _logprobs(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _same_as_training(name: str, verl: str):
    """validation's sampling settings hybrid has one key for: must equal actor_infer's."""

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        train = ctx.effective(f"actor_infer.generating_args.{name}", verl)
        if value == train or (name == "stop_strings" and not value and not train):
            return {}
        raise Refusal(
            f"hybrid validates with the training engine's {verl.rsplit('.', 1)[1]} "
            f"(actor_infer.generating_args.{name}: {train!r}); give both the same value"
        )

    return convert


def _generation_rules(section: str) -> list[Rule]:
    """GeneratingArguments fields of a section that generates (actor_infer, validation) that
    vLLM's sampling in ROLL never reads or reads only as output options."""
    rules = [
        ignore(
            f"{section}.generating_args.max_length",
            "GeneratingArguments.to_dict drops it whenever max_new_tokens > 0, which ROLL always sets "
            "(sequence_length - prompt_length)",
        ),
        ignore(
            f"{section}.generating_args.length_penalty",
            "read only by beam search (vllm_strategy._generate_with_beam_search); num_beams must be 1",
        ),
        ignore(
            f"{section}.generating_args.include_stop_str_in_output",
            "vLLM cuts a stop string from the text only; ROLL keeps the generated token ids "
            "(vllm_strategy.gather_outputs_to_pad_tensor), which are the same either way",
        ),
    ]
    if section == "validation":
        rules += [
            ignore("validation.generating_args.logprobs", "log-probs of validation samples are not trained on"),
            custom(
                "validation.generating_args.repetition_penalty",
                (),
                _same_as_training("repetition_penalty", f"{ROLLOUT}.repetition_penalty"),
                "must equal actor_infer's",
            ),
            custom(
                "validation.generating_args.stop_strings",
                (),
                _same_as_training("stop_strings", f"{ROLLOUT}.stop"),
                "must equal actor_infer's",
            ),
        ]
    else:
        rules.append(
            refuse(
                "actor_infer.generating_args.logprobs",
                "without it ROLL's engine returns no log-probs (infer_logprobs, which train_infer_correction and the "
                "agentic pipeline read); hybrid's always returns the sampled token's; a number adds top-k log-probs "
                "nobody trains on",
                accept=_logprobs,
                accepts="an integer >= 0",
            )
        )
    return rules


def _data_rules(section: str) -> list[Rule]:
    """DataArguments fields of the sections whose data ROLL reads (actor_train, validation)."""
    vlm = (
        "vision-language preprocessing of ROLL's RLVR VLM pipeline (roll/datasets/vlm_dataset_utils.py); hybrid "
        "resizes images with the processor's own limits: only ROLL's default is accepted"
    )
    # a whole number's int and float spellings are one value (video_fps: 2.0 or 2)
    same = {name: (v,) if v is None else tuple(dict.fromkeys((v, int(v)))) for name, v in _VLM_DATA.items()}
    rules = [refuse(f"{section}.data_args.{name}", vlm, accept=values) for name, values in same.items()]
    rules += [
        refuse(
            f"{section}.data_args.dataset_type",
            "ODPS / AILake tables (Alibaba's data stores) have no reader in hybrid; with any other value ROLL picks "
            "the reader by the file's extension (datasets/dataset.get_dataset), as hybrid does",
            accept=lambda value: value not in ("odps", "ailake"),
            accepts="any but odps, ailake",
        ),
        ignore(f"{section}.data_args.id", "read nowhere in roll/"),
        ignore(f"{section}.data_args.eval_file_name", "read nowhere in roll/ (validation.data_args.file_name is)"),
        ignore(
            f"{section}.data_args.response",
            "only logged (datasets/dataset.py); ROLL's scorers read their own columns (ground_truth)",
        ),
    ]
    if section == "actor_train":
        rules.append(
            ignore(
                "actor_train.data_args.tag",
                "read only with tag_to_template, which is refused unless empty (rlvr_pipeline.get_encode_function); "
                "the domain routing reads the column named tag (update_dataset_domain)",
            )
        )
    else:
        why = "ROLL encodes the validation prompts with actor_train's data_args (rlvr_pipeline.py)"
        rules += [
            ignore("validation.data_args.tag", why),
            ignore("validation.data_args.domain_interleave_probs", "only actor_train's splits the data by domain"),
        ]
    return rules


# WorkerConfig fields outside data_args and generating_args: a trailing .* for the nested ones.
_WORKER_FIELDS = tuple(
    """
    name worker_cls pg_variant model_args.* training_args.* strategy_args.* world_size device_mapping
    num_gpus_per_worker model_update_frequency infer_batch_size backend_timeout system_envs.*
    topr_positive_weight topr_negative_weight max_concurrency use_dynamic_batching_in_train
    max_tokens_per_microbatch_in_train sequence_length_round_in_train use_dynamic_batching_in_infer
    max_tokens_per_microbatch_in_infer sequence_length_round_in_infer offload_nccl use_sequence_packing
    sequence_packing_args.* logits_in_fp32 router_replay.* apply_loss_scale mtp_training_mode opd_kl_coef
    tag_included
    """.split()
)


def _configured(ctx: Context, section: str) -> bool:
    """A ROLL worker section that is set up (WorkerConfig.is_configured: a device or a model given),
    also a multi-teacher dict's entries (teacher.<name>.device_mapping)."""
    for key, value in ctx.given.items():
        if key.startswith(f"{section}.") and key.endswith((".device_mapping", ".model_args.model_name_or_path")):
            if value not in (None, "", [], "[]"):
                return True
    return False


def _teacher(value: Any, ctx: Context) -> dict[str, Any]:
    if _configured(ctx, "teacher"):
        raise Refusal(
            f"a teacher with a model or devices: {_OPD}; ROLL's agentic pipeline also takes a configured teacher "
            "as its reference (base_config.reference_configs)",
            shared=True,
        )
    return {}  # a teacher without model or devices: ROLL reads nothing of it


def _reward_cluster(value: Any, ctx: Context) -> dict[str, Any]:
    mapping = ctx.get("reward.device_mapping", None)
    if is_agentic(ctx) and mapping not in (None, "", [], "[]") and parse_devices(mapping):
        raise Refusal(
            "reward.device_mapping given in an agentic file: ROLL's reward cluster (an LLM judge that its "
            "vision-language env manager queries through llm_proxy, agentic_pipeline.py) has no counterpart; "
            "hybrid's judges are reward_model.* in verl keys",
            shared=True,
        )
    return {}


def _section_rules() -> list[Rule]:
    return [
        *(ignore(f"validation.{name}", _VALIDATION_UNREAD) for name in _WORKER_FIELDS),
        *_data_rules("actor_train"),
        *_data_rules("validation"),
        *_generation_rules("validation"),
        custom(
            "reward.*",
            (),
            _reward_cluster,
            "accepted, nothing written; refused in an agentic file whose reward.device_mapping is not empty",
            "ROLL's RLVR pipeline never reads this section (its rewards are the rewards.<domain> workers); the "
            "agentic pipeline builds a reward cluster from it only when reward.device_mapping is not empty",
        ),
        custom(
            "teacher.*",
            (),
            _teacher,
            "accepted while the teacher has no model_name_or_path and no device_mapping (ROLL reads none of it)",
            _OPD,
        ),
        ignore("student_train.*", "read only with is_pure_opd (ROLL then trains it as actor_train), which is refused"),
        ignore("student_infer.*", "read only with is_pure_opd (ROLL then serves it as actor_infer), which is refused"),
    ]


def _top_level_rules() -> list[Rule]:
    unread = "an AgenticConfig field ROLL reads nowhere (roll/ at the mirror's commit)"
    return [
        refuse("use_opd", _OPD, accept=(False,)),
        refuse("is_pure_opd", _OPD, accept=(False,)),
        ignore(
            "pure_opd_pipeline_type",
            "read only by ROLL's distillation launcher (examples/start_onpolicy_distill_pipeline.py) to pick the "
            "pipeline class",
        ),
        ignore("use_token_reward", unread),
        ignore("dirty_data_mask", unread),
        ignore("open_feedback_turn", unread),
        ignore("reward_normalization.global_scale_factor", unread),
        ignore("reward_normalization.global_shift_value", unread),
        ignore(
            "exp_mode",
            f"{unread}; ROLL's sandbox environment takes its own exp_mode from its env_config (rock_tb_native_env.py)",
        ),
        ignore(
            "partial_gpu_mode",
            "ROLL's agentic scheme for actor_train's devices inside actor_infer's (its engines shrink during the "
            "update, agentic_pipeline._validate_partial_gpu_config): which devices hold the engines, not what is "
            "generated; hybrid refuses that overlap in actor_infer.device_mapping",
        ),
        refuse(
            "parse_tool_call_parameter_to_dict",
            "ROLL's agent-native env manager then renders tool-call arguments as dicts in the chat template; hybrid's "
            "multi-turn loop has no such switch",
            accept=(False,),
        ),
        refuse(
            "skip_mock_system_prompt",
            "ROLL then renders a later turn without its empty mock system message, so a template's default system "
            "prompt enters the turn; hybrid renders later turns after a system message, as ROLL's default false",
            accept=(False,),
        ),
        ignore("otlp_output_dir", "where ROLL's OpenTelemetry collector writes traces (base_pipeline.py)"),
        ignore("env_monitor.*", "ROLL's monitor logs environments that hang (warnings only, rollout_scheduler.py)"),
        ignore(
            "transfer_backend.*",
            "how ROLL moves batches between its Ray workers (scheduler/transfer_backend.py); the data are the same",
        ),
        ignore(
            "router_args.*",
            "which of ROLL's engines serves a request and how many each keeps running (scheduler/router.py): "
            "speed, not samples; hybrid's engine cap is max_running_requests (rollout.max_num_seqs)",
        ),
        refuse(
            "train_infer_correction.filters.*",
            "ROLL's filters are a list (train_infer_correction.filters: [...]); hybrid has no train/inference "
            "mismatch filters",
        ),
    ]


WORKER_KEY_RULES: tuple[Rule, ...] = (
    *(rule for role in MAIN_ROLES for rule in _per_role_rules(role)),
    *_section_rules(),
    *_top_level_rules(),
)

__all__ = ["MAIN_ROLES", "WORKER_KEY_RULES"]
