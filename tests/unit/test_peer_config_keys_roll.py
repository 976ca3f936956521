"""Every key of ROLL's own RLVRConfig and AgenticConfig (tests/data/peer_config_keys.json, read
from ROLL's dataclasses by scripts/peer_config_keys.py) is known to hybrid's ROLL dialect; the
fields roll_worker_keys.py adds take ROLL's defaults without a refusal, ignore what ROLL does not
read for a role, and refuse, with the reason, the values that would change training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.config import ConfigError
from hybrid.dialects.roll import DIALECT
from hybrid.dialects.roll_worker_keys import WORKER_KEY_RULES
from hybrid.dialects.table import hydra_value, translate

KEYS = json.loads((Path(__file__).resolve().parents[1] / "data" / "peer_config_keys.json").read_text())["roll"]
BASE = {"rollout_batch_size": 8, "num_return_sequences_in_group": 4, "prompt_length": 64, "response_length": 48}


def _known(key: str) -> bool:
    return DIALECT.rule_for(DIALECT.canonical(key)) is not None or DIALECT.is_section(key)


@pytest.mark.parametrize("config", ["RLVRConfig", "AgenticConfig"])
def test_every_roll_key_is_known(config):
    keys = KEYS[config]
    assert len(keys) > 1000  # the file holds the whole class, not a sample
    assert [key for key in keys if not _known(key)] == []


def _added_defaults() -> dict:
    """ROLL's default for every key whose rule roll_worker_keys.py adds (both classes), but the
    filter entries of train_infer_correction.filters, a list in a file (its own rule)."""
    rules = set(map(id, WORKER_KEY_RULES))
    defaults = {}
    for config in ("RLVRConfig", "AgenticConfig"):
        for key, value in KEYS[config].items():
            rule = DIALECT.rule_for(key)
            if rule is not None and id(rule) in rules and not key.startswith("train_infer_correction.filters."):
                defaults[key] = value
    return defaults


def test_roll_defaults_of_the_added_keys_translate_to_nothing():
    defaults = _added_defaults()
    # every worker section the two pipelines have, and the top-level fields
    roles = {key.split(".", 1)[0] for key in defaults}
    assert {"actor_train", "actor_infer", "reference", "critic", "validation", "reward", "teacher"} <= roles
    assert {"use_opd", "partial_gpu_mode", "router_args.max_running_requests", "env_monitor.enable"} <= set(defaults)
    assert len(defaults) > 700
    base = translate(DIALECT, BASE)
    # ROLL's defaults are accepted and write nothing: they change nothing hybrid computes
    assert translate(DIALECT, {**BASE, **defaults}) == base


def _error(given: dict) -> str:
    with pytest.raises(ConfigError) as err:
        translate(DIALECT, {**BASE, **given})
    return str(err.value)


def test_fields_roll_does_not_read_for_a_role_are_ignored():
    base = translate(DIALECT, BASE)
    unread = {
        "actor_infer.training_args.learning_rate": 1.0,  # the engine has no optimizer
        "reference.training_args.per_device_train_batch_size": 3,
        "actor_infer.data_args.file_name": "other.jsonl",  # only actor_train's data is read
        "actor_train.generating_args.temperature": 0.1,  # actor_train never generates
        "validation.model_args.model_name_or_path": "/elsewhere",  # ROLL validates on actor_infer
        "validation.training_args.learning_rate": 1.0,
        "critic.pg_variant": "topr",  # read from actor_train only
        "actor_infer.use_dynamic_batching_in_train": True,
        "actor_train.training_args.bf16": True,  # ROLL's FSDP2 strategy never reads it
        "actor_train.world_size": 99,  # set from device_mapping by ROLL
        "student_train.model_args.model_name_or_path": "/student",  # read only with is_pure_opd
        "reward.device_mapping": [0, 1],  # an RLVR file: ROLL's RLVR pipeline never reads `reward`
        "dirty_data_mask": True,  # defined and read nowhere
        "router_args.max_running_requests": 7,
    }
    assert translate(DIALECT, {**BASE, **unread}) == base


@pytest.mark.parametrize(
    "given, line",
    [
        ({"use_opd": True}, "use_opd=true: ROLL's on-policy distillation (a teacher's KL in the reward"),
        (
            {"actor_train.router_replay.mode": "R2"},
            "actor_train.router_replay.mode=R2: ROLL itself raises NotImplementedError for R2",
        ),
        (
            {"critic.model_args.model_config_kwargs.rope_theta": 1000},
            "critic.model_args.model_config_kwargs.rope_theta=1000: keyword arguments for Hugging Face's AutoConfig",
        ),
        (
            {"actor_train.model_args.additional_target": "embed_tokens"},
            "actor_train.model_args.additional_target=embed_tokens: LoRA's modules_to_save",
        ),
        (
            {"actor_infer.generating_args.logprobs": None},
            "actor_infer.generating_args.logprobs=null: without it ROLL's engine returns no log-probs",
        ),
        ({"actor_train.data_args.dataset_type": "odps"}, "actor_train.data_args.dataset_type=odps: ODPS / AILake"),
        (
            {"validation.data_args.image_max_pixels": 1024},
            "validation.data_args.image_max_pixels=1024: vision-language preprocessing",
        ),
        ({"critic.model_args.lora_target": "all-linear"}, "critic.model_args.lora_target=all-linear: ROLL's critic"),
        ({"skip_mock_system_prompt": True}, "skip_mock_system_prompt=true: ROLL then renders a later turn"),
        (
            {"train_infer_correction.filters.enabled": True},
            "train_infer_correction.filters.enabled=true: ROLL's filters are a list",
        ),
    ],
)
def test_values_that_change_training_are_refused(given, line):
    assert f"  - {line}" in _error(given)


def test_validation_sampling_must_match_the_training_engine():
    same = {"actor_infer.generating_args.repetition_penalty": 1.1, "validation.generating_args.repetition_penalty": 1.1}
    assert "actor_rollout_ref.rollout.repetition_penalty=1.1" in translate(DIALECT, {**BASE, **same})
    error = _error({"validation.generating_args.repetition_penalty": 1.1})  # actor_infer's: hybrid's 1.0
    assert (
        "  - validation.generating_args.repetition_penalty=1.1: hybrid validates with the training engine's "
        "repetition_penalty (actor_infer.generating_args.repetition_penalty: 1.0); give both the same value"
    ) in error
    assert translate(DIALECT, {**BASE, "validation.generating_args.stop_strings": None}) == translate(DIALECT, BASE)
    error = _error({"validation.generating_args.stop_strings": ["</answer>"]})
    assert "stop_strings=[</answer>]: hybrid validates with the training engine's stop (actor_infer" in error


def test_a_configured_teacher_is_refused_once_and_an_empty_one_accepted():
    empty = {"teacher.model_args.model_name_or_path": None, "teacher.device_mapping": None, "teacher.opd_kl_coef": 2.0}
    assert translate(DIALECT, {**BASE, **empty}) == translate(DIALECT, BASE)
    error = _error({"teacher.model_args.model_name_or_path": "/t", "teacher.device_mapping": [0], "teacher.name": "t"})
    assert error.count("a teacher with a model or devices") == 1
    # a multi-teacher dict's entries count as well
    assert "a teacher with a model or devices" in _error({"teacher.math.device_mapping": "list(range(0,2))"})


def test_the_agentic_reward_cluster_is_refused():
    agentic = {"custom_envs.SimpleSokoban.env_type": "sokoban", "reward.device_mapping": [0, 1], "reward.name": "r"}
    error = str(pytest.raises(ConfigError, translate, DIALECT, {**BASE, **agentic}).value)
    assert error.count("reward.device_mapping given in an agentic file") == 1


@pytest.mark.parametrize(
    "given, expected",
    [
        # ROLL's LoRA switch is lora_target: a rank alone trains the full model
        ({"actor_train.model_args.lora_rank": 32}, {}),
        (  # ROLL's LoRA example (rlvr_lora_fsdp2.yaml): the comma list becomes module names
            {
                "actor_train.model_args.lora_target": "o_proj,q_proj,k_proj,v_proj",
                "actor_train.model_args.lora_rank": 32,
                "actor_train.model_args.lora_alpha": 32,
            },
            {"lora_rank": 32, "lora_alpha": 32, "target_modules": ["o_proj", "q_proj", "k_proj", "v_proj"]},
        ),
        # alpha null or not given: 2 x rank (ModelArguments.__post_init__); rank not given: ROLL's 8
        (
            {"actor_train.model_args.lora_target": "all-linear"},
            {"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"},
        ),
        (
            {"actor_train.model_args.lora_target": ".*(q|v)_proj", "actor_train.model_args.lora_rank": 4},
            {"lora_rank": 4, "lora_alpha": 8, "target_modules": ".*(q|v)_proj"},  # a regex is kept whole
        ),
    ],
)
def test_actor_train_lora_is_read_as_roll_reads_it(given, expected):
    overrides = translate(DIALECT, {**BASE, **given})
    written = {
        o.split("=", 1)[0].rsplit(".", 1)[1]: o.split("=", 1)[1]
        for o in overrides
        if ".model.lora" in o or "target_modules" in o
    }
    assert written == {key: hydra_value(value) for key, value in expected.items()}


def test_roll_lora_targets_without_a_counterpart_are_refused_once():
    error = _error(
        {"actor_train.model_args.lora_target": "all-linear,all-embedding", "actor_train.model_args.lora_rank": 8}
    )
    assert error.count("ROLL's all-embedding / all-router targets have no counterpart in hybrid's LoRA") == 1


def test_validation_prompt_column_and_length_are_actor_trains():
    # ROLL encodes the validation file with actor_train's data_args and replaces validation's
    # max_new_tokens by val_sequence_length - val_prompt_length: neither validation key is read.
    given = {
        "actor_train.data_args.messages": "messages",
        "validation.data_args.messages": "prompt",
        "validation.data_args.prompt": "question",
        "validation.generating_args.max_new_tokens": 100,
    }
    overrides = translate(DIALECT, {**BASE, **given})
    assert "data.prompt_key='messages'" in overrides
    assert "data.max_response_length=48" in overrides
    assert translate(DIALECT, {**BASE, "validation.generating_args.max_new_tokens": 100}) == translate(DIALECT, BASE)


def test_rlvr_max_new_tokens_is_not_read():
    # ROLL's RLVR pipeline replaces actor_infer's max_new_tokens by sequence_length - prompt_length
    overrides = translate(DIALECT, {**BASE, "actor_infer.generating_args.max_new_tokens": 100})
    assert overrides == translate(DIALECT, BASE) and "data.max_response_length=48" in overrides
