"""Every vLLM call hybrid makes, bound to the installed vLLM's signatures (issue 38).

An upgrade of vLLM that moves or renames an argument hybrid passes fails here on CPU, before a
GPU user meets it. Three kinds of check:
- the engine arguments hybrid builds (the policy's and the reward model's) against `LLM` and
  `EngineArgs`, on a CPU and as a GPU would build them (sleep mode, memory share, TP);
- the calls the rollout engine makes on its `LLM` (load, reset, sleep, wake, generate), made
  through the real `VLLMRollout` methods on a double that binds each call to `LLM`'s own
  signature and records it, and what vLLM's GPU worker receives from them;
- a scan of the source: every method hybrid calls on an `LLM` or its `llm_engine` is one this
  file checks, so a new call cannot go unchecked.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bind(function, *args, **kwargs):
    """inspect's bind of a method called on an instance (self given as None)."""
    return inspect.signature(function).bind(None, *args, **kwargs)


def _check_llm_kwargs(kwargs: dict) -> None:
    _bind(LLM.__init__, **kwargs)
    named = set(inspect.signature(LLM.__init__).parameters)
    engine_fields = {f.name for f in dataclasses.fields(EngineArgs)}
    # LLM passes what it does not name to EngineArgs: each such key must be a field there.
    assert set(kwargs) - named <= engine_fields, set(kwargs) - named - engine_fields


def _rollout_sections(*overrides):
    from hybrid.config import build_config

    config = build_config(["actor_rollout_ref.model.path=/nonexistent/model", *overrides])
    return config.actor_rollout_ref.model, config.actor_rollout_ref.rollout, config.reward_model


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_the_policy_engine_arguments_bind_to_llm(gpu, monkeypatch):
    import workers.rollout.vllm_rollout as vllm_rollout

    monkeypatch.setattr(vllm_rollout, "is_cuda_available", lambda: gpu)
    model, rollout, _ = _rollout_sections(
        "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.engine_kwargs.vllm.block_size=32"
    )
    kwargs = vllm_rollout.vllm_engine_kwargs(model, rollout)
    assert kwargs["enable_sleep_mode"] is gpu and ("gpu_memory_utilization" in kwargs) is gpu
    _check_llm_kwargs(kwargs)


def test_the_tensor_parallel_shard_arguments_bind_to_llm():
    from workers.rollout import tensor_parallel

    shard = tensor_parallel.EXECUTOR
    _check_llm_kwargs({"model": "m", "tensor_parallel_size": 2, "distributed_executor_backend": shard})
    executor_field = next(f for f in dataclasses.fields(EngineArgs) if f.name == "distributed_executor_backend")
    assert shard in str(executor_field.type) or shard in inspect.getsource(vllm.config.ParallelConfig)


@pytest.mark.parametrize("kind", ["discriminative", "generative"])
def test_the_reward_model_engine_arguments_bind_to_llm(kind, monkeypatch):
    import workers.reward_engine as reward_engine

    _, _, reward_model = _rollout_sections()
    monkeypatch.setattr(reward_engine, "engine_context", lambda config: 512)
    _check_llm_kwargs(reward_engine.engine_kwargs(reward_model, kind))


class SignatureCheckingLLM:
    """Stands where `VLLMRollout.llm` stands: every call is bound to `LLM`'s own signature (a
    mismatch raises TypeError) and recorded as (method, bound arguments)."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, name):
        real = getattr(LLM, name)

        def call(*args, **kwargs):
            bound = _bind(real, *args, **kwargs)
            self.calls.append((name, {k: v for k, v in bound.arguments.items() if k != "self"}))
            if name == "collective_rpc":  # the engine consumes the weights
                list(bound.arguments["kwargs"]["weights_iterator"])
            return None

        return call


def _engine_with_sleep(shards_in_workers: bool = False):
    from types import SimpleNamespace

    from workers.rollout.engine import VLLM_ENGINE
    from workers.rollout.vllm_rollout import VLLMRollout

    engine = object.__new__(VLLMRollout)
    engine.llm = SignatureCheckingLLM()
    engine.engine_dtype = torch.bfloat16
    engine.capabilities = dataclasses.replace(VLLM_ENGINE.capabilities(), sleep_levels=(1, 2))
    engine.asleep = set()
    engine.shards_in_workers = shards_in_workers
    engine.config = SimpleNamespace(update_weights_bucket_megabytes=1)
    return engine


def test_the_engine_sequence_reaches_vllm_as_its_api_names_it():
    engine = _engine_with_sleep()
    engine.sleep(2)
    engine.wake_up(("weights",))
    engine.update_weights([("model.embed_tokens.weight", torch.ones(2, 2))])
    engine.wake_up(("kv_cache",))
    engine.wake_up(("kv_cache",))  # awake already: nothing reaches vLLM
    names = [name for name, _ in engine.llm.calls]
    assert names == ["sleep", "wake_up", "collective_rpc", "reset_prefix_cache", "wake_up"]
    calls = engine.llm.calls
    assert calls[0][1]["level"] == 2
    assert calls[1][1]["tags"] == ["weights"] and calls[4][1]["tags"] == ["kv_cache"]
    assert calls[2][1]["method"] == "reload_weights"
    # What the GPU worker and its model runner receive from these calls.
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    _bind(GPUModelRunner.reload_weights, **calls[2][1]["kwargs"])
    _bind(Worker.sleep, level=calls[0][1]["level"])
    _bind(Worker.wake_up, tags=calls[1][1]["tags"])
    with pytest.raises(ValueError, match="sleep level 3"):
        engine.sleep(3)


def test_an_engine_with_worker_processes_gets_lists_of_whole_layers():
    """A tensor-parallel engine actor's shards are vLLM's worker processes: each bucket is one
    reload_weights call with a list (a generator cannot be pickled to them), bound the same way."""
    engine = _engine_with_sleep(shards_in_workers=True)
    weights = [(f"model.layers.{i}.mlp.up_proj.weight", torch.ones(512, 512)) for i in range(3)]
    engine.update_weights(weights)  # 1 MiB buckets; each layer's weight is 0.5 MiB in bf16
    reloads = [args for name, args in engine.llm.calls if name == "collective_rpc"]
    assert [len(args["kwargs"]["weights_iterator"]) for args in reloads] == [2, 1]
    assert all(isinstance(args["kwargs"]["weights_iterator"], list) for args in reloads)
    assert [name for name, _ in engine.llm.calls][-1] == "reset_prefix_cache"


def test_the_generation_and_engine_loop_calls_bind():
    from vllm.inputs import TokensPrompt
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import RequestOutputKind

    from workers.rollout.base import SamplingSettings
    from workers.rollout.vllm_params import vllm_sampling_params

    settings = SamplingSettings(n=2, temperature=0.7, top_p=0.9, top_k=5, max_tokens=8, greedy=False, stop=("x",))
    params = vllm_sampling_params(settings)  # SamplingParams built for real
    assert isinstance(params, SamplingParams) and params.logprobs == 0
    assert {"prompt_token_ids", "multi_modal_data"} <= set(TokensPrompt.__annotations__)
    prompt = TokensPrompt(prompt_token_ids=[1, 2, 3])
    _bind(LLM.generate, [prompt], [params], use_tqdm=False)
    _bind(LLM.classify, [prompt], pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    # The asynchronous driver (workers/rollout/async_engine.py) steps the engine itself.
    _bind(LLMEngine.add_request, "req-1", prompt, params)
    _bind(LLMEngine.step)
    _bind(LLMEngine.abort_request, ["req-1"])
    _bind(LLMEngine.has_unfinished_requests)
    _bind(LLMEngine.get_num_unfinished_requests)
    assert RequestOutputKind.FINAL_ONLY is not None


CHECKED = {
    # on an LLM
    "generate",
    "classify",
    "collective_rpc",
    "reset_prefix_cache",
    "sleep",
    "wake_up",
    # on its llm_engine
    "add_request",
    "step",
    "abort_request",
    "has_unfinished_requests",
    "get_num_unfinished_requests",
    # attributes read, not called
    "llm_engine",
    "model_config",
    "vllm_config",
}


def _vllm_calls_in_source() -> dict[str, set[str]]:
    """{file: method names called on an `LLM` (`*.llm.NAME(...)`) or its engine
    (`*.llm_engine.NAME`, `self._engine.NAME(...)`)} across hybrid's packages."""
    found: dict[str, set[str]] = {}
    for folder in ("hybrid", "workers", "reward", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Attribute):
                    continue
                owner = node.value
                owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
                if owner_name in ("llm", "llm_engine", "_engine"):
                    found.setdefault(str(path.relative_to(ROOT)), set()).add(node.attr)
    return found


def test_every_vllm_method_hybrid_calls_is_checked_here():
    found = _vllm_calls_in_source()
    assert "workers/rollout/vllm_rollout.py" in found and "workers/rollout/async_engine.py" in found
    unchecked = {path: names - CHECKED for path, names in found.items() if names - CHECKED}
    assert unchecked == {}, f"vLLM calls with no signature check in {__file__}: {unchecked}"
