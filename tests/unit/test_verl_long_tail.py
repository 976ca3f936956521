"""verl keys from the long tail of its example scripts (issue 14): each is accepted and does
what verl's docs say (use_shm copies the model folder, overlong_buffer_cfg is the dapo
manager's overlong_buffer, forward_prefetch sets FSDP2's explicit prefetch, the profiler
writes chrome traces for the chosen steps and ranks, lora_adapter_path is checked against
lora_rank), or is accepted only at the value whose meaning hybrid has and refused with
the reason otherwise."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from hybrid.config import ConfigError, build_config
from tests.unit.test_typed_config import problems_of

ARR = "actor_rollout_ref"


# ---------------------------------------------------------------- accepted as verl writes them


def test_verl_example_script_overrides_compose():
    config = build_config(
        [
            f"{ARR}.model.use_shm=True",
            f"{ARR}.rollout.layered_summon=True",
            f"{ARR}.ref.use_torch_compile=False",
            f"{ARR}.actor.fsdp_config.forward_prefetch=True",
            f"{ARR}.ref.fsdp_config.forward_prefetch=True",
            "critic.model.fsdp_config.forward_prefetch=True",
            "reward_model.model.use_remove_padding=False",
            "reward_model.use_reward_loop=False",
            "reward_model.num_workers=8",
            "reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "reward_model.reward_kwargs.overlong_buffer_cfg.len=16",
            "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
            "reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
            "global_profiler.tool=torch",
            "global_profiler.steps=[1,2]",
            "global_profiler.save_path=/tmp/profile",
            f"{ARR}.actor.profiler.enable=True",
            f"{ARR}.actor.profiler.all_ranks=False",
            f"{ARR}.actor.profiler.ranks=[0]",
            "critic.profiler.enable=True",
            f"{ARR}.model.use_fused_kernels=True",
            f"{ARR}.model.fused_kernel_options.impl_backend=torch",
            f"{ARR}.actor.entropy_from_logits_with_chunking=True",
            f"{ARR}.actor.entropy_checkpointing=True",
            f"{ARR}.ref.entropy_from_logits_with_chunking=True",
            f"{ARR}.ref.entropy_checkpointing=True",
            f"{ARR}.actor.use_prefix_grouper=True",
            f"{ARR}.actor.ulysses_sequence_parallel_size=2",
            f"{ARR}.ref.ulysses_sequence_parallel_size=2",
            "critic.ulysses_sequence_parallel_size=2",
            "trainer.n_gpus_per_node=2",
            f"{ARR}.actor.fsdp_config.use_orig_params=True",
            "trainer.use_legacy_worker_impl=auto",
            "algorithm.adv_estimator=gae",
            "algorithm.use_pf_ppo=True",
            "algorithm.pf_ppo.reweight_method=max_min",
            "data.image_key=images",
        ]
    )
    arr = config.actor_rollout_ref
    assert arr.model.use_shm and arr.rollout.layered_summon and arr.actor.fsdp_config.forward_prefetch
    assert config.critic.model.fsdp_config.forward_prefetch and config.reward_model.num_workers == 8
    # The role sections follow global_profiler unless set themselves (verl's interpolations).
    assert arr.actor.profiler.tool == "torch" and arr.actor.profiler.save_path == "/tmp/profile"
    assert config.critic.profiler.enable and not arr.ref.profiler.enable
    assert (
        arr.model.use_fused_kernels is True and arr.actor.entropy_checkpointing and arr.actor.use_prefix_grouper is True
    )


def test_defaults_are_verls_neutral_values():
    config = build_config()
    arr = config.actor_rollout_ref
    assert arr.model.use_shm is False and arr.model.lora_adapter_path is None and not arr.model.is_lora
    assert arr.rollout.layered_summon is False and arr.ref.use_torch_compile is False
    assert not arr.actor.fsdp_config.forward_prefetch and not arr.ref.fsdp_config.forward_prefetch
    assert config.global_profiler.tool is None and config.global_profiler.steps is None
    assert not arr.actor.profiler.profiles_rank(0)
    # hybrid's own defaults where it does more than verl: prompt-once packing and the fused head where they apply
    assert arr.actor.use_prefix_grouper is None and arr.model.use_fused_kernels is None


def test_verl_reward_loop_script_keys_compose():
    # The reward-model block of verl's examples/ppo_trainer/run_qwen2-7b_rm.sh (and its six kin).
    rm = build_config(
        [
            "reward_model.enable=True",
            "reward_model.model.path=/models/rm",
            "reward_model.model.use_remove_padding=True",
            "reward_model.use_reward_loop=True",
            "reward_model.rollout.name=vllm",
            "reward_model.rollout.gpu_memory_utilization=0.8",
            "reward_model.rollout.tensor_model_parallel_size=1",
            "reward_model.rollout.prompt_length=2048",
            "reward_model.rollout.response_length=1024",
            "reward_model.num_workers=8",
        ]
    ).reward_model
    assert rm.use_reward_loop and rm.num_workers == 8 and rm.rollout.gpu_memory_utilization == 0.8
    assert rm.rollout.engine_max_model_len == 3072


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("reward_model.rollout.data_parallel_size=2", "no vLLM data parallel"),
        ("reward_model.rollout.name=sglang", "hybrid serves the reward model with vLLM"),
        ("reward_model.rollout.skip_tokenizer_init=True", "the engine's tokenizer must read"),
        ("reward_model.rollout.load_format=dummy", "served with its own weights"),
        ("reward_model.judge.min_score=2", "is above max_score=1.0"),
        ("reward_model.judge.base_url=http://x/v1", "reward_model.use_reward_loop=true, or remove it"),
        ("global_profiler.tool=nsys", "hybrid runs no Nsight Systems workers"),
        ("global_profiler.tool=torch_memory", "CUDA memory snapshots are not written"),
        (f"{ARR}.actor.profiler.tool_config.torch.discrete=True", "one trace per profiled step and rank"),
        (f"{ARR}.actor.profiler.tool_config.torch.contents=[gpu]", "'gpu' not supported"),
        ("reward_model.num_workers=0", "must be a positive integer"),
        (f"{ARR}.model.fused_kernel_options.impl_backend=triton", "written in torch"),
        (f"{ARR}.model.use_fused_kernels=False {ARR}.actor.entropy_checkpointing=True", "needs the fused output layer"),
        (f"{ARR}.model.use_fused_kernels=False {ARR}.ref.entropy_checkpointing=True", "needs the fused output layer"),
        ("trainer.use_legacy_worker_impl=disable", "hybrid has one worker implementation"),
        ("async_training.checkpoint_engine.device_buffer_size_M=2048", "not by verl's bucketed NCCL broadcast"),
        ("async_training.checkpoint_engine.enable=false", "through Ray's object store in one piece"),
        ("async_training.use_trainer_do_validate=true", "validates on the rollout engines"),
        ("algorithm.use_pf_ppo=True", "verl applies it with gae only"),
        (f"{ARR}.ref.ulysses_sequence_parallel_size=2", "set them equal"),
        (f"trainer.n_gpus_per_node=3 {ARR}.actor.ulysses_sequence_parallel_size=2", "does not divide world size 3"),
        (
            "trainer.n_gpus_per_node=4 critic.enable=true critic.ulysses_sequence_parallel_size=4 "
            "critic.ppo_micro_batch_size_per_gpu=5",
            "/ critic.ulysses_sequence_parallel_size=4) = 32 samples per device",
        ),
    ],
)
def test_values_hybrid_lacks_are_refused_with_the_reason(override, reason):
    overrides = override.split()
    problems = problems_of(overrides)
    assert overrides[-1].split("=")[0] in problems and reason in problems


def test_profiler_enabled_without_steps_or_tool_is_refused():
    problems = problems_of([f"{ARR}.actor.profiler.enable=True"])
    assert f"{ARR}.actor.profiler.enable=True profiles nothing without global_profiler.tool=torch" in problems
    problems = problems_of(["global_profiler.tool=torch", "critic.profiler.enable=True"])
    assert "critic.profiler.enable=True profiles nothing" in problems


# ---------------------------------------------------------------- use_shm


def _fake_model(folder) -> str:
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "sub" / "tokenizer.json").write_text("{}")
    return str(folder)


def test_use_shm_copies_the_model_folder_once_atomically(tmp_path):
    from workers.model_loading import model_path_in_shm

    source = _fake_model(tmp_path / "model")
    shm = tmp_path / "shm"
    shm.mkdir()
    copy = model_path_in_shm(source, shm_root=str(shm))
    assert copy.startswith(str(shm)) and copy != source
    for name in ("config.json", "model.safetensors", "sub/tokenizer.json"):
        assert open(os.path.join(copy, name), "rb").read() == open(os.path.join(source, name), "rb").read()
    # No staging folder is left behind, and the second call (another rank, a later run) reuses the copy.
    assert os.listdir(os.path.dirname(copy)) == [os.path.basename(copy)]
    stamp = os.path.getmtime(os.path.join(copy, "config.json"))
    assert model_path_in_shm(source, shm_root=str(shm)) == copy
    assert os.path.getmtime(os.path.join(copy, "config.json")) == stamp
    # A changed model folder gets a fresh copy.
    (tmp_path / "model" / "extra.txt").write_text("new file")
    assert model_path_in_shm(source, shm_root=str(shm)) != copy


def test_use_shm_without_room_says_so(tmp_path, monkeypatch):
    import shutil

    from workers.model_loading import model_path_in_shm

    source = _fake_model(tmp_path / "model")
    (tmp_path / "shm").mkdir()
    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(total=1024, used=1000, free=24))
    with pytest.raises(
        OSError,
        match=r"use_shm=true: the model folder .* has only 0.00 GiB free; "
        r".*--shm-size.* set actor_rollout_ref.model.use_shm=false",
    ):
        model_path_in_shm(source, shm_root=str(tmp_path / "shm"))
    assert not os.listdir(tmp_path / "shm")


def test_use_shm_without_dev_shm_loads_in_place(tmp_path, capsys):
    from workers.model_loading import model_path_in_shm

    source = _fake_model(tmp_path / "model")
    assert model_path_in_shm(source, shm_root=str(tmp_path / "absent")) == source
    assert "has no" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="is not one"):
        model_path_in_shm(str(tmp_path / "missing"), shm_root=str(tmp_path))


# ---------------------------------------------------------------- overlong_buffer_cfg


def test_overlong_buffer_cfg_reaches_the_dapo_manager_as_overlong_buffer(tokenizer):
    from reward.loader import load_reward_manager

    common = ["reward_model.reward_manager=dapo", "data.max_response_length=32"]
    values = {"enable": True, "len": 8, "penalty_factor": 0.5, "log": True}
    verl = build_config(common + [f"reward_model.reward_kwargs.overlong_buffer_cfg.{k}={v}" for k, v in values.items()])
    ours = build_config(common + [f"reward_model.reward_kwargs.overlong_buffer.{k}={v}" for k, v in values.items()])
    assert verl.reward_model.manager_kwargs == ours.reward_model.manager_kwargs
    managers = [load_reward_manager(c, tokenizer, num_examine=0) for c in (verl, ours)]
    fields = ("overlong_enable", "overlong_len", "overlong_penalty_factor", "overlong_log", "max_resp_len")
    assert (
        [getattr(managers[0], f) for f in fields]
        == [getattr(managers[1], f) for f in fields]
        == [True, 8, 0.5, True, 32]
    )
    # Partly given: verl's entries over the yaml's defaults.
    partial = build_config(common + ["reward_model.reward_kwargs.overlong_buffer_cfg.enable=True"])
    assert partial.reward_model.manager_kwargs["overlong_buffer"] == {
        "enable": True,
        "len": 16,
        "penalty_factor": 1.0,
        "log": False,
    }


def test_overlong_buffer_both_spellings_different_values_refused():
    problems = problems_of(
        [
            "reward_model.reward_kwargs.overlong_buffer.len=8",
            "reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        ]
    )
    assert (
        "reward_model.reward_kwargs.overlong_buffer.len=8 and reward_model.reward_kwargs.overlong_buffer_cfg.len=4 "
        "are the same setting" in problems
    )
    # The same value under both spellings is one setting given twice: fine.
    build_config(
        ["reward_model.reward_kwargs.overlong_buffer.len=8", "reward_model.reward_kwargs.overlong_buffer_cfg.len=8"]
    )
    assert "overlong_buffer_cfg.lenght: no such key" in problems_of(
        ["reward_model.reward_kwargs.overlong_buffer_cfg.lenght=4"]
    )


# ---------------------------------------------------------------- forward_prefetch


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.proj(x))


class _Stack(torch.nn.Module):
    _no_split_modules = ["_Block"]

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    from workers.base import find_free_port

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("prefetch", [False, True])
def test_forward_prefetch_sets_fsdp2_explicit_prefetch(one_rank_group, prefetch):
    from workers.fsdp_utils import apply_fsdp2

    model = apply_fsdp2(_Stack(), torch.float32, reshard_after_forward=True, forward_prefetch=prefetch)
    states = [layer._get_fsdp_state() for layer in model.layers]
    targets = [[s for s in state._states_to_forward_prefetch] for state in states]
    if prefetch:
        assert targets == [[states[1]], [states[2]], []]
    else:
        assert targets == [[], [], []]
    out = model(torch.ones(2, 8))  # still runs, and the same as without prefetch
    assert out.shape == (2, 8)


# ---------------------------------------------------------------- lora_adapter_path


def _adapter(folder, r: int, **extra) -> str:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": 16, **extra}))
    return str(folder)


def test_lora_adapter_path_checked_against_lora_rank(tmp_path):
    adapter = _adapter(tmp_path / "adapter", r=4)
    config = build_config([f"{ARR}.model.lora_adapter_path={adapter}"])
    assert config.actor_rollout_ref.model.is_lora and config.actor_rollout_ref.model.lora_rank == 0
    build_config([f"{ARR}.model.lora_adapter_path={adapter}", f"{ARR}.model.lora_rank=4"])
    problems = problems_of([f"{ARR}.model.lora_adapter_path={adapter}", f"{ARR}.model.lora_rank=8"])
    assert "the adapter's rank r=4 differs from actor_rollout_ref.model.lora_rank=8; set lora_rank=0" in problems
    assert "no adapter_config.json there" in problems_of([f"{ARR}.model.lora_adapter_path={tmp_path}"])
    dora = _adapter(tmp_path / "dora", r=4, use_dora=True)
    assert "DoRA adapter" in problems_of([f"{ARR}.model.lora_adapter_path={dora}"])


# ---------------------------------------------------------------- profiler


@pytest.mark.parametrize(
    ("overrides", "ranks"),
    [
        ([], {0}),  # enabled, no ranks listed: rank 0 (verl's rule)
        ([f"{ARR}.actor.profiler.ranks=[1,3]"], {1, 3}),
        ([f"{ARR}.actor.profiler.all_ranks=true"], {0, 1, 2, 3}),
    ],
)
def test_profiler_ranks(overrides, ranks):
    config = build_config(
        ["global_profiler.tool=torch", "global_profiler.steps=[2]", f"{ARR}.actor.profiler.enable=true", *overrides]
    )
    assert {r for r in range(4) if config.actor_rollout_ref.actor.profiler.profiles_rank(r)} == ranks


def test_profile_plan_steps_and_continuous():
    from workers.profiling import profile_plan

    plan = SimpleNamespace(tool="torch", steps=(2, 3, 5), profile_continuous_steps=False)
    assert [profile_plan(plan, s) for s in (1, 2, 3, 5)] == [(False, False), (True, True), (True, True), (True, True)]
    plan.profile_continuous_steps = True
    assert [profile_plan(plan, s) for s in (2, 3, 5)] == [(True, False), (False, True), (True, True)]
    plan.tool = None
    assert profile_plan(plan, 2) == (False, False)


def test_step_profiler_writes_a_chrome_trace(tmp_path):
    from workers.profiling import ProfiledWorker, StepProfiler, profiled_step

    config = build_config(
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=[2,3]",
            f"global_profiler.save_path={tmp_path}",
            "global_profiler.profile_continuous_steps=true",
            f"{ARR}.actor.profiler.enable=true",
            f"{ARR}.actor.profiler.tool_config.torch.contents=[cpu,shapes]",
        ]
    )

    class Group(ProfiledWorker):  # the worker group's calls, made on the worker itself
        pass

    worker, other_rank = Group(), Group()
    worker.profiler = StepProfiler(config.actor_rollout_ref.actor.profiler, "actor", rank=0)
    other_rank.profiler = StepProfiler(config.actor_rollout_ref.actor.profiler, "actor", rank=1)
    for step in (1, 2, 3, 4):
        with profiled_step(config.global_profiler, step, (worker, other_rank, None)):
            torch.ones(16, 16) @ torch.ones(16, 16)
    assert os.listdir(tmp_path / "actor") == ["step2-3_rank0.json"]  # rank 1 is not selected
    trace = json.loads((tmp_path / "actor" / "step2-3_rank0.json").read_text())
    assert any("mm" in str(event.get("name", "")) for event in trace["traceEvents"])


# ---------------------------------------------------------------- sections refused whole


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["reward_model.sandbox_fusion.url=http://x", "reward_model.sandbox_fusion.max_concurrent=8"], "no sandbox"),
        (["+actor_rollout_ref.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters=32"], "vllm and hf"),
    ],
)
def test_verl_sections_hybrid_lacks_are_refused_in_one_line(overrides, reason):
    with pytest.raises(ConfigError) as err:
        build_config(overrides)
    lines = str(err.value).splitlines()
    keys = ", ".join(o.lstrip("+").split("=")[0] for o in overrides)
    assert lines == [next(line for line in lines if line.startswith(keys + ": "))]
    assert reason in lines[0]


# ---------------------------------------------------------------- PF-PPO


def test_pf_ppo_weights_by_hand():
    from hybrid.batch_ops import pf_ppo_weights

    scores = torch.tensor([2.0, -1.0, 0.0, 2.0], dtype=torch.float64)
    eps = 1e-8
    assert pf_ppo_weights(scores, "pow", 2.0).tolist() == pytest.approx([4 + eps, 1 + eps, eps, 4 + eps], abs=0)
    assert pf_ppo_weights(scores, "max_min", 2.0).tolist() == pytest.approx([1 + eps, 1 + eps, eps, 1 + eps], abs=0)
    assert pf_ppo_weights(scores, "max_random", 2.0).tolist() == pytest.approx(
        [0.4 + eps, 0.1 + eps, 0.1 + eps, 0.4 + eps], abs=0
    )


def test_pf_ppo_resample_draws_rows_by_weight():
    import numpy as np

    from hybrid.batch_ops import pf_ppo_resample
    from hybrid.config.schema import PFPPOConfig
    from protocol.data_proto import DataProto

    scores = torch.zeros(4, 3)
    scores[0, -1], scores[3, -1] = 1.0, 3.0  # rows 1 and 2 score 0: weight 1e-8 under pow
    batch = DataProto.from_dict(
        tensors={"token_level_scores": scores, "row": torch.arange(4)},
        non_tensors={"uid": np.array(list("abcd"), dtype=object)},
    )
    config = PFPPOConfig(reweight_method="pow", weight_pow=1.0)
    draws = [pf_ppo_resample(batch, config, torch.Generator().manual_seed(seed)) for seed in range(200)]
    rows = torch.cat([d.batch["row"] for d in draws])
    assert len(draws[0]) == 4 and set(rows.tolist()) <= {0, 3}
    assert 0.70 < float((rows == 3).float().mean()) < 0.80  # 3 / (1 + 3)
    assert list(draws[0].non_tensor_batch["uid"]) == ["abcd"[i] for i in draws[0].batch["row"].tolist()]
    again = pf_ppo_resample(batch, config, torch.Generator().manual_seed(0))
    assert torch.equal(again.batch["row"], draws[0].batch["row"])  # seeded: a resumed step draws the same rows


# ---------------------------------------------------------------- multimodal data


def test_data_files_with_images_or_videos_are_refused(tmp_path):
    from hybrid.preflight import Findings, check_data_files

    def row(**extra):
        return json.dumps(
            {
                "prompt": [{"role": "user", "content": "1+1?"}],
                "data_source": "arith",
                "reward_model": {"ground_truth": "2"},
                **extra,
            }
        )

    (tmp_path / "text.jsonl").write_text("\n".join([row(images=None), row(images=[])]) + "\n")
    (tmp_path / "pictures.jsonl").write_text(
        "\n".join([row(), row(images=[{"image": "a.png"}]), row(images=["b.png"])]) + "\n"
    )
    (tmp_path / "clips.jsonl").write_text(row(clips=["c.mp4"]) + "\n")
    config = build_config(
        [
            f"data.train_files=[{tmp_path / 'text.jsonl'},{tmp_path / 'pictures.jsonl'}]",
            f"data.val_files={tmp_path / 'clips.jsonl'}",
            "data.video_key=clips",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        ]
    )
    found = Findings()
    check_data_files(config, found)
    assert found.problems == [
        f"data.train_files: data file {tmp_path / 'pictures.jsonl'} row 1 has 'images' "
        "(data.image_key; 2 of 3 rows): hybrid "
        "trains text-only models and cannot feed images or videos to the model; drop the column or use text prompts",
        f"data.val_files: data file {tmp_path / 'clips.jsonl'} row 0 has 'clips' (data.video_key; 1 of 1 rows): hybrid "
        "trains text-only models and cannot feed images or videos to the model; drop the column or use text prompts",
    ]


def test_model_settings_its_config_refuses_are_found_before_loading(tmp_path):
    from hybrid.preflight import Findings, check_model_settings

    folder = tmp_path / "capped"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "gemma2", "final_logit_softcapping": 30.0, "num_attention_heads": 2})
    )
    config = build_config(
        [
            f"{ARR}.model.path={folder}",
            f"{ARR}.model.use_fused_kernels=True",
            "trainer.n_gpus_per_node=4",
            f"{ARR}.actor.ulysses_sequence_parallel_size=4",
            "critic.enable=true",
            "critic.ulysses_sequence_parallel_size=4",
        ]
    )
    found = Findings()
    check_model_settings(config, found)
    assert found.problems == [
        f"{ARR}.model.use_fused_kernels=True, but {str(folder)!r} cannot use the fused output layer: its config sets "
        "final_logit_softcapping=30.0, which transforms the logits after the output layer; set it to null (the full "
        "logits then) or false",
        f"{ARR}.actor.ulysses_sequence_parallel_size=4 is more than the 2 attention heads of {str(folder)!r}; "
        "use at most 2",
        f"critic.ulysses_sequence_parallel_size=4 is more than the 2 attention heads of {str(folder)!r}; use at most 2",
    ]
    found = Findings()
    check_model_settings(build_config([f"{ARR}.model.path={folder}"]), found)  # null: full logits, no SP
    assert found.problems == []
