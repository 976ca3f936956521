"""The colocated step's memory sequence, as a GPU engine would receive it (issue 38, verl 0.9.1's order).

On a CPU no engine can sleep (vLLM's CPU build ignores sleep/wake, and the engines declare no
sleep levels there), so the sequence is recorded: a rollout engine registered from this file
is transformers' generate (it really samples) that declares vLLM's GPU sleep levels and records
every call the real engine would get, and the device's empty_cache and the actor's offload
are recorded where the worker makes them. The fused worker runs in process, unchanged.

A level-2 sleep drops the weights; the recording engine overwrites its weights with noise
when it sleeps at level 2, as a woken vLLM engine holds no meaningful weights, so a generation
that did not load them again first would sample from noise.
"""

from __future__ import annotations

import pytest
import torch

import workers.actor_rollout_ref_worker
import workers.device
import workers.fsdp_utils
from tests.integration.engine_helpers import engine_config, prompt_batch
from workers.rollout.engine import EngineCapabilities, EngineSpec, register_engine, unregister_engine
from workers.rollout.hf_rollout import HFRollout

pytestmark = pytest.mark.integration

CALLS: list[str] = []
NAME = "recording_gpu_engine"


class RecordingEngine(HFRollout):
    """transformers' generate with vLLM's GPU sleep levels, recording the calls it gets."""

    def __init__(self, *args, **kwargs):
        CALLS.append("build engine")
        super().__init__(*args, **kwargs)
        self.capabilities = EngineCapabilities(NAME, (1, 2), tensor_parallel=False, agent_loops=False, images=False)

    def update_weights(self, named_tensors):
        CALLS.append("load")
        super().update_weights(named_tensors)
        self.reset_caches()

    def reset_caches(self):
        CALLS.append("reset caches")

    def sleep(self, level):
        CALLS.append(f"sleep {level}")
        if level == 2:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.normal_()

    def wake_up(self, tags=None):
        CALLS.append(f"wake {','.join(tags)}")

    def generate_sequences(self, prompts):
        CALLS.append("generate")
        return super().generate_sequences(prompts)


@pytest.fixture
def recording(monkeypatch):
    register_engine(
        EngineSpec(NAME, __name__, "RecordingEngine", "a recording GPU engine", sleep_levels_on_gpu=(1, 2), images=True)
    )
    CALLS.clear()
    monkeypatch.setattr(workers.device, "empty_cache", lambda: CALLS.append("empty_cache"))
    # The actor's offload (a no-op on CPU) is recorded where the worker and on_device make it.
    for module in (workers.fsdp_utils, workers.actor_rollout_ref_worker):
        monkeypatch.setattr(module, "offload_params", lambda m: CALLS.append("offload"), raising=False)
    yield CALLS
    unregister_engine(NAME)


def test_one_colocated_step_comes_in_verls_order(tiny_model_dir, tokenizer, recording):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    cfg = engine_config(
        tiny_model_dir,
        f"actor_rollout_ref.rollout.name={NAME}",
        "actor_rollout_ref.rollout.free_cache_engine=true",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.rollout.do_sample=false",
    )
    group = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor_rollout")
    group.init_model()
    # The engine is built after the actor's offload, and sleeps (level 2: its dummy weights go).
    assert recording == ["offload", "build engine", "sleep 2"]

    recording.clear()
    group.update_rollout_weights()
    load = ["empty_cache", "wake weights", "load", "reset caches", "offload", "empty_cache"]
    assert recording == load
    recording.clear()
    first = group.generate_sequences(prompt_batch(tokenizer))
    assert recording == ["wake kv_cache", "generate", "sleep 2"]

    # The sleep dropped the weights: the next generation (a validation pass) loads them first,
    # and samples what the actor's weights give, not the noise the sleep left.
    recording.clear()
    again = group.generate_sequences(prompt_batch(tokenizer))
    assert recording == [*load, "wake kv_cache", "generate", "sleep 2"]
    assert torch.equal(again.batch["responses"], first.batch["responses"])


def test_without_sleep_levels_the_same_calls_skip_sleep_and_wake(tiny_model_dir, tokenizer, recording, monkeypatch):
    """free_cache_engine=false (or an engine that cannot sleep, every engine on CPU): the same
    sequence with no sleep, and the weights stay loaded between generations."""
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    cfg = engine_config(
        tiny_model_dir,
        f"actor_rollout_ref.rollout.name={NAME}",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "actor_rollout_ref.rollout.do_sample=false",
    )
    group = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor_rollout")
    group.init_model()
    group.update_rollout_weights()
    recording.clear()
    group.generate_sequences(prompt_batch(tokenizer))
    group.generate_sequences(prompt_batch(tokenizer))
    assert recording == ["generate", "generate"]
    recording.clear()
    group.update_rollout_weights()
    assert recording == ["empty_cache", "load", "reset caches", "empty_cache"]


def test_an_engine_share_larger_than_the_free_memory_is_refused_in_one_line():
    from workers.colocation import check_engine_memory

    gib = 1024**3
    check_engine_memory(free_bytes=72 * gib, total_bytes=80 * gib, utilization=0.9)  # 72 GiB asked, 72 free
    with pytest.raises(RuntimeError) as refused:
        check_engine_memory(free_bytes=60 * gib, total_bytes=80 * gib, utilization=0.9)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("actor_rollout_ref.rollout.gpu_memory_utilization=0.9 asks the rollout engine for 72.0")
    assert "only 60.0 GiB are free" in message and "at most 0.74" in message
