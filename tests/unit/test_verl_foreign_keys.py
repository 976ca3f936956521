"""verl keys hybrid's yaml spells elsewhere or that mean nothing on this hardware
(hybrid/config/foreign_keys.py): read under hybrid's name (rollout.checkpoint_engine's bucket
size, model.torch_dtype), or accepted and named at start in one line (NPU profiler options,
checkpoint-engine transport), and the conflicts between a key and its rewrite refused."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError, build_config
from hybrid.main_ppo import prepare_command_line

ARR = "actor_rollout_ref"
# verl's examples/grpo_trainer/run_qwen2_5_7b_grpo_discrete_prof_npu.sh, its profiler keys as written
NPU_SCRIPT = [
    f"{ARR}.actor.profiler.enable=True",
    f"{ARR}.actor.profiler.ranks=[1,2]",
    f"{ARR}.actor.profiler.all_ranks=False",
    f"{ARR}.actor.profiler.tool_config.npu.discrete=True",
    f"{ARR}.actor.profiler.tool_config.npu.contents=['npu','cpu']",
    f"{ARR}.actor.profiler.tool_config.npu.level=level1",
    f"{ARR}.actor.profiler.tool_config.npu.analysis=True",
    f"{ARR}.ref.profiler.enable=True",
    f"{ARR}.ref.profiler.tool_config.npu.discrete=True",
    "global_profiler.tool=npu",
    "global_profiler.steps=[2,4]",
    "global_profiler.save_path=/tmp/profile_data",
]


def test_npu_profiler_keys_are_accepted_profile_nothing_and_are_named_in_one_line(capsys):
    config = build_config(NPU_SCRIPT)
    assert config.global_profiler.tool == "npu"
    assert not any(config.actor_rollout_ref.actor.profiler.profiles_rank(r) for r in range(4))
    from workers.profiling import profile_plan

    assert profile_plan(config.global_profiler, 2) == (False, False)
    argv = prepare_command_line(["--cfg", "job", *NPU_SCRIPT])
    assert argv[:2] == ["--cfg", "job"] and not any("tool_config.npu" in a for a in argv)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hybrid: accepted with no effect on this hardware: ")
    assert f"{ARR}.actor.profiler.tool_config.npu.level" in lines[0] and "global_profiler.tool=npu" in lines[0]
    assert "no NPU here" in lines[0]


def test_checkpoint_engine_bucket_is_the_weight_sync_bucket_and_its_transport_has_no_effect(capsys):
    overrides = [
        f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096",
        f"{ARR}.rollout.checkpoint_engine.backend=nccl",
        f"+{ARR}.rollout.checkpoint_engine.engine_kwargs.nccl.timeout=30",
    ]
    assert build_config(overrides).actor_rollout_ref.rollout.update_weights_bucket_megabytes == 4096
    argv = prepare_command_line(overrides)
    assert argv == [f"{ARR}.rollout.update_weights_bucket_megabytes=4096"]
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        f"{ARR}.rollout.checkpoint_engine.backend, {ARR}.rollout.checkpoint_engine.engine_kwargs.nccl.timeout" in line
    )
    assert "Ray's object store" in line and "update_weights_bucket_megabytes" not in line


def test_nothing_is_printed_without_such_keys(capsys):
    assert prepare_command_line(["trainer.seed=3"]) == ["trainer.seed=3"]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("value", "precision", "engine"),
    [("bfloat16", "bf16", "bfloat16"), ("torch.float32", "fp32", "float32"), ("auto", "auto", "auto")],
)
def test_model_torch_dtype_sets_the_dtype_the_model_runs_in(value, precision, engine):
    arr = build_config([f"{ARR}.model.torch_dtype={value}"]).actor_rollout_ref
    assert arr.actor.fsdp_config.mixed_precision == precision
    assert arr.ref.fsdp_config.mixed_precision == precision
    assert arr.rollout.dtype == engine


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{ARR}.model.torch_dtype=float16"], "no fp16 loss scaling"),
        (
            [f"{ARR}.model.torch_dtype=bfloat16", f"{ARR}.actor.fsdp_config.mixed_precision=fp32"],
            f"{ARR}.actor.fsdp_config.mixed_precision is given as {ARR}.model.torch_dtype=bfloat16 and as "
            f"{ARR}.actor.fsdp_config.mixed_precision=fp32: give one of them",
        ),
        (
            [
                f"{ARR}.rollout.update_weights_bucket_megabytes=64",
                f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes=2048",
            ],
            "give one of them",
        ),
    ],
)
def test_a_key_and_its_rewrite_disagreeing_or_a_dtype_hybrid_lacks_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        build_config(overrides)
    assert len(str(err.value).splitlines()) == 1 and message in str(err.value)


def test_the_reward_engines_sleep_switch_is_named_as_having_no_effect(capsys):
    # verl's reward_model.rollout.free_cache_engine sleeps a GPU-served reward engine; hybrid's
    # reward engine runs on CPU cores only (GPU-served reward models are refused at start).
    argv = prepare_command_line(["reward_model.rollout.free_cache_engine=True", "reward_model.num_workers=2"])
    assert argv == ["reward_model.num_workers=2"]
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("hybrid: accepted with no effect on this hardware: reward_model.rollout.free_cache_engine: ")
    assert "no sleep mode" in line
    rollout = build_config(["reward_model.rollout.free_cache_engine=false"]).reward_model.rollout
    assert not hasattr(rollout, "free_cache_engine")


def test_verls_mixed_precision_dict_is_read_with_its_meanings():
    """verl's fsdp_config.mixed_precision is a dict (param_dtype, reduce_dtype, buffer_dtype), written
    whole or key by key: param_dtype is hybrid's compute dtype; fp32 reductions and buffers (verl's
    defaults) are hybrid's own; anything else is refused in one line naming the key."""
    mp = f"{ARR}.actor.fsdp_config.mixed_precision"
    keyed = build_config([f"{mp}.param_dtype=bf16", f"{mp}.reduce_dtype=fp32", f"{mp}.buffer_dtype=float32"])
    assert keyed.actor_rollout_ref.actor.fsdp_config.mixed_precision == "bf16"
    whole = build_config([f"{ARR}.ref.fsdp_config.mixed_precision={{param_dtype:float32,reduce_dtype:float32}}"])
    assert whole.actor_rollout_ref.ref.fsdp_config.mixed_precision == "fp32"
    # Only the fp32 reductions given: the compute dtype stays hybrid's default.
    default = build_config([]).critic.model.fsdp_config.mixed_precision
    assert (
        build_config(
            ["critic.model.fsdp_config.mixed_precision.reduce_dtype=fp32"]
        ).critic.model.fsdp_config.mixed_precision
        == default
    )
    refused = {
        f"{mp}.reduce_dtype=bf16": f"{mp}.reduce_dtype=bf16: hybrid reduces gradients in fp32",
        f"{mp}={{param_dtype:fp16}}": f"{mp}.param_dtype=fp16: hybrid computes in bfloat16 or float32",
        f"{mp}.cast_forward_inputs=true": f"{mp}.cast_forward_inputs=True: verl's mixed_precision takes param_dtype",
    }
    for override, message in refused.items():
        with pytest.raises(ConfigError) as err:
            build_config([override])
        assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(ConfigError, match="give one of them"):
        build_config([f"{mp}.param_dtype=bf16", f"{mp}=fp32"])
