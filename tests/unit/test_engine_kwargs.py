"""engine_kwargs.vllm (the policy's rollout, the reward model's engine) is checked against the
installed vLLM's engine arguments when the config is checked, before any model loads: a name
vLLM does not take is refused in one line naming the nearest it does (workers/config/vllm_args.py).
Reads vLLM's EngineArgs, so the first test here imports vLLM (seconds, once per process)."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError, load_config, validate_config

ARR = "actor_rollout_ref"
VLLM = pytest.importorskip("vllm").__version__


def problems(overrides: list[str]) -> list[str]:
    """The problem lines of the ConfigError a config built from `overrides` gives ([] if valid)."""
    try:
        validate_config(load_config(overrides))
    except ConfigError as err:
        return [line.removeprefix("  - ") for line in str(err).splitlines()[1:]]
    return []


def test_a_misspelt_engine_argument_is_refused_naming_the_nearest():
    assert problems([f"{ARR}.rollout.engine_kwargs.vllm.enable_prefix_cache=true"]) == [
        f"{ARR}.rollout.engine_kwargs.vllm.enable_prefix_cache: vLLM {VLLM} has no such engine argument "
        f"(vllm.LLM, vllm.engine.arg_utils.EngineArgs); did you mean "
        f"{ARR}.rollout.engine_kwargs.vllm.enable_prefix_caching?"
    ]
    # A shortened name: the field it starts, not the closest spelling (mm_ipc_gpu_memory_gb).
    assert problems(["reward_model.rollout.engine_kwargs.vllm.gpu_mem=0.5"]) == [
        f"reward_model.rollout.engine_kwargs.vllm.gpu_mem: vLLM {VLLM} has no such engine argument "
        f"(vllm.LLM, vllm.engine.arg_utils.EngineArgs); did you mean "
        f"reward_model.rollout.engine_kwargs.vllm.gpu_memory_utilization?"
    ]


def test_engine_arguments_vllm_takes_pass():
    # An EngineArgs field, and chat_template, which vllm.LLM names itself (no EngineArgs field).
    assert (
        problems(
            [f"{ARR}.rollout.engine_kwargs.vllm.block_size=32", f"{ARR}.rollout.engine_kwargs.vllm.chat_template=x"]
        )
        == []
    )
    assert problems(["reward_model.rollout.engine_kwargs.vllm.kv_cache_dtype=auto"]) == []


def test_engine_arguments_with_the_hf_engine_are_refused():
    assert problems([f"{ARR}.rollout.name=hf", f"{ARR}.rollout.engine_kwargs.vllm.block_size=32"]) == [
        f"{ARR}.rollout.engine_kwargs.vllm gives block_size for the vLLM engine, which {ARR}.rollout.name='hf' "
        f"(transformers' generate) does not use; remove them or set name=vllm"
    ]
