"""Every key of SkyRL's own SkyRLTrainConfig (tests/data/peer_config_keys.json, read from SkyRL's
dataclasses by scripts/peer_config_keys.py) is known to hybrid's SkyRL dialect, and SkyRL's
default of each passes through translate_skyrl without a refusal; the rules of skyrl_tuning.py
and skyrl_profiler.py map what hybrid has (checked against hand-computed values, torch's own
profiler schedule, a config that loads and validates, the data loader's batches with and
without worker processes) and refuse, with the reason, the values that would change training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hybrid.config import ConfigError, load_config, validate_config
from hybrid.config.override_values import hydra_value
from hybrid.data import collate_fn
from hybrid.data_loader import RLSampler, create_dataloader
from hybrid.dialects import translate_argv
from hybrid.dialects.skyrl import DIALECT, translate_skyrl
from hybrid.dialects.skyrl_profiler import profiled_steps
from tests.unit.dialect_helpers import A, skyrl, skyrl_error

KEYS = json.loads((Path(__file__).resolve().parents[1] / "data" / "peer_config_keys.json").read_text())["skyrl"][
    "SkyRLTrainConfig"
]
# The fully async keys stand for SkyRL's fully async entry point, which asserts engines apart and
# a step of one mini batch: their defaults need those keys beside them (the line SkyRL runs).
FULLY_ASYNC_LINE = [
    "trainer.placement.colocate_all=false",
    "trainer.train_batch_size=256",
    "trainer.policy_mini_batch_size=256",
]
NEEDS = {
    "trainer.fully_async.max_staleness_steps": FULLY_ASYNC_LINE,
    "trainer.fully_async.num_parallel_generation_workers": FULLY_ASYNC_LINE,
}
PROFILER = "trainer.policy.torch_profiler_config"


def test_every_skyrl_key_is_known():
    assert len(KEYS) > 380  # the whole class, not a sample
    unknown = [k for k in KEYS if DIALECT.rule_for(DIALECT.canonical(k)) is None and not DIALECT.is_section(k)]
    assert unknown == []


def test_each_skyrl_default_passes_alone():
    refused = {}
    for key, value in KEYS.items():
        try:
            translate_skyrl([*NEEDS.get(key, []), f"{key}={hydra_value(value)}"])
        except ConfigError as err:
            refused[key] = str(err).splitlines()[-1]
    assert refused == {}


def test_the_fully_async_defaults_are_refused_without_their_entry_points_line():
    # the exceptions above are real: alone, the key asks for engines apart
    assert "requires trainer.placement.colocate_all=false" in skyrl_error("trainer.fully_async.max_staleness_steps=4")


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")  # torch's note on warmup=0
@pytest.mark.parametrize(
    "schedule", [(10, 0, 1, 1, 1), (2, 1, 1, 2, 2), (0, 0, 0, 1, 3), (3, 2, 0, 3, 1), (0, 1, 2, 1, 4)]
)
def test_profiled_steps_are_the_steps_torch_profiler_schedule_records(schedule):
    from torch.profiler import ProfilerAction
    from torch.profiler import schedule as torch_schedule

    skip_first, wait, warmup, active, repeat = schedule
    plan = torch_schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    recorded = [i + 1 for i in range(60) if plan(i) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)]
    assert profiled_steps(*schedule) == recorded


def test_skyrl_profiler_maps_onto_the_actors_profiler_and_validates():
    out = skyrl(f"{PROFILER}.enable=true", f"{PROFILER}.save_path=/tmp/traces")
    assert out["global_profiler.tool"] == "torch"
    assert out["global_profiler.steps"] == [12]  # SkyRL's defaults: skip 10, warm 1, record the 12th step
    assert out["global_profiler.profile_continuous_steps"] is False
    assert out[f"{A}.actor.profiler.enable"] is True and out[f"{A}.actor.profiler.ranks"] == [0]
    assert out[f"{A}.actor.profiler.save_path"] == "/tmp/traces"
    assert out[f"{A}.actor.profiler.tool_config.torch.contents"] == ["cpu", "cuda", "shapes", "stack"]
    line = [
        f"{PROFILER}.enable=true",
        f"{PROFILER}.save_path=/tmp/traces",
        f"{PROFILER}.skip_first=2",
        f"{PROFILER}.wait=1",
        f"{PROFILER}.warmup=1",
        f"{PROFILER}.active=2",
        f"{PROFILER}.repeat=2",
        f"{PROFILER}.activities=[cpu]",
        f"{PROFILER}.with_stack=false",
        f"{PROFILER}.profile_memory=true",
        f"{PROFILER}.ranks=[0,1]",
    ]
    cfg = load_config(translate_argv(["--dialect", "skyrl", "trainer.placement.policy_num_gpus_per_node=2", *line]))
    validate_config(cfg)
    assert list(cfg.global_profiler.steps) == [5, 6, 9, 10] and cfg.global_profiler.profile_continuous_steps
    assert list(cfg.actor_rollout_ref.actor.profiler.tool_config.torch.contents) == ["cpu", "shapes", "memory"]
    # not enabled: nothing written, whatever the other keys say
    assert skyrl(f"{PROFILER}.export_type=stacks", f"{PROFILER}.with_flops=true") == skyrl()


@pytest.mark.parametrize(
    "override, reason",
    [
        (f"{PROFILER}.repeat=0", "cycles forever"),
        (f"{PROFILER}.export_type=stacks", "writes chrome traces"),
        (f"{PROFILER}.with_flops=true", "no FLOPs"),
        (f"{PROFILER}.activities=[xpu]", "cpu, cuda"),
        (f"{PROFILER}.save_path=gs://bucket/traces", "a local folder"),
    ],
)
def test_skyrl_profiler_refuses_what_hybrids_traces_cannot_do(override, reason):
    message = skyrl_error(f"{PROFILER}.enable=true", f"{PROFILER}.save_path=/tmp/t", override)
    assert f"  - {override.split('=')[0]}=" in message and reason in message, message
    assert "save_path must name the folder" in skyrl_error(f"{PROFILER}.enable=true")


def test_skyrl_token_budget_is_hybrids_dynamic_micro_batches_per_device_of_a_ulysses_group():
    assert skyrl("trainer.max_tokens_per_microbatch=-1") == skyrl()
    out = skyrl("trainer.max_tokens_per_microbatch=4096")
    assert out[f"{A}.actor.use_dynamic_bsz"] is True
    assert out[f"{A}.actor.ppo_max_token_len_per_gpu"] == 4096 and out["critic.ppo_max_token_len_per_gpu"] == 4096
    line = [
        "trainer.max_tokens_per_microbatch=4096",
        "trainer.placement.policy_num_gpus_per_node=2",
        "trainer.policy.sequence_parallel_size=2",
    ]
    cfg = load_config(translate_argv(["--dialect", "skyrl", *line]))
    validate_config(cfg)
    arr = cfg.actor_rollout_ref
    # 4096 tokens per micro-batch of the group of 2 = 2048 per device; the log-prob passes follow
    assert arr.actor.ppo_max_token_len_per_gpu == 2048 and arr.rollout.log_prob_max_token_len_per_gpu == 2048
    assert arr.ref.log_prob_use_dynamic_bsz is True and cfg.critic.use_dynamic_bsz is True
    assert cfg.critic.forward_max_token_len_per_gpu == 4096
    message = skyrl_error("trainer.max_tokens_per_microbatch=4097", "trainer.policy.sequence_parallel_size=2")
    assert "must divide by the policy's sequence_parallel_size (2)" in message


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["data.dataloader.num_workers=4"], {"data.dataloader_num_workers": 4}),
        (["trainer.num_logger_eval_samples=-1"], {"trainer.log_val_generations": 0}),
        (["trainer.num_logger_eval_samples=3"], {"trainer.log_val_generations": 3}),
        (
            ['generator.inference_engine.speculative_config={"method": "ngram", "num_speculative_tokens": 2}'],
            {
                f"{A}.rollout.engine_kwargs.vllm.speculative_config.method": "ngram",
                f"{A}.rollout.engine_kwargs.vllm.speculative_config.num_speculative_tokens": 2,
            },
        ),
        (
            ['generator.sampling_params.additional_kwargs={"presence_penalty": 0.5}'],
            {f"{A}.rollout.presence_penalty": 0.5},
        ),
        (
            ["trainer.algorithm.policy_loss_type=cispo", "trainer.algorithm.cispo.cispo_anchor=rollout"],
            {
                f"{A}.actor.policy_loss.loss_mode": "cispo",
                "algorithm.rollout_correction.bypass_mode": True,
                "algorithm.rollout_correction.loss_type": "ppo_clip",
            },
        ),
    ],
)
def test_skyrl_tuning_mappings(overrides, expected):
    out = skyrl(*overrides)
    assert {k: out.get(k) for k in expected} == expected


def test_skyrl_tuning_keys_that_write_nothing():
    assert skyrl("data.dataloader.num_workers=null", "data.dataloader.persistent_workers=true") == skyrl()
    # the rollout anchor is read by cispo alone, the cache salt matters only in fully async training
    assert skyrl("trainer.algorithm.cispo.cispo_anchor=rollout", "generator.use_cache_salt=false") == skyrl()


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (["trainer.policy.model.fake_int4_qat.enabled=true"], "Megatron backend only"),
        (["trainer.mtp.enabled=true"], "multi-token-prediction"),
        (["trainer.policy.inference_only_init=true"], "not valid for training"),
        (["trainer.fused_lm_head_logprob=true"], "refuses it with fsdp"),
        (["generator.inference_engine.enable_return_routed_experts=true"], "routing replay"),
        (["trainer.fully_async.sample_full_batch=true"], "zero_variance_filter=true"),
        (["trainer.logprobs_chunk_size=null"], "Megatron backend only"),
        (["generator.inference_engine.offload_kv_for_weight_sync=true"], "colocate_all=true"),
        (["data.dataloader.num_workers=0", "data.dataloader.persistent_workers=true"], "num_workers > 0"),
        (["generator.sampling_params.additional_kwargs={seed: 3}"], "not seed"),
        (
            [
                "trainer.algorithm.policy_loss_type=cispo",
                "trainer.algorithm.cispo.cispo_anchor=rollout",
                "trainer.algorithm.use_kl_in_reward=true",
            ],
            "reads its recomputed old log-probs",
        ),
        (
            [*FULLY_ASYNC_LINE, "trainer.fully_async.enabled=true", "generator.use_cache_salt=false"],
            "empties the engines' prefix cache at every weight push",
        ),
    ],
)
def test_skyrl_tuning_refusals(overrides, reason):
    assert reason in skyrl_error(*overrides)


def test_skyrl_megatron_sections_are_read_only_with_the_megatron_strategy():
    # SkyRL's FSDP trainer never reads megatron_config; the Megatron strategy itself is refused
    assert skyrl("trainer.policy.megatron_config.tensor_model_parallel_size=2") == skyrl()
    assert "Megatron" in skyrl_error(
        "trainer.strategy=megatron", "trainer.policy.megatron_config.context_parallel_size=2"
    )


def test_skyrl_tags_are_the_wandb_runs_tags():
    cfg = load_config(translate_argv(["--dialect", "skyrl", "trainer.tags=[grpo,gsm8k]", "trainer.logger=wandb"]))
    validate_config(cfg)
    assert list(cfg.trainer.wandb_tags) == ["grpo", "gsm8k"]


class _Rows:
    """Rows that name themselves, as a dataset."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return {"x": torch.tensor([i])}


def test_loader_worker_processes_give_the_batches_of_in_process_loading():
    # why data.dataloader.num_workers maps with null -> hybrid's in-process default and
    # persistent_workers changes nothing: the count of loader processes leaves the batches as they are
    def batches(workers):
        loader = create_dataloader(_Rows(), 3, RLSampler(10, shuffle=True, seed=5), collate_fn, num_workers=workers)
        return [batch["x"].flatten().tolist() for _ in range(2) for batch in loader]  # two epochs of three batches

    in_process = batches(0)
    # shuffled anew each epoch: 3 batches of 3 distinct rows (the tenth dropped), two different orders
    assert all(len(set(sum(epoch, []))) == 9 for epoch in (in_process[:3], in_process[3:]))
    assert in_process[:3] != in_process[3:]
    assert batches(2) == in_process
