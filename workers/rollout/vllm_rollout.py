"""vLLM in the worker's own process: the rollout engine of the hybrid worker.

The engine starts as `actor_rollout_ref.rollout.load_format` says (verl's values, mapped
by `engine_load_format`: random weights for `dummy*`, the model folder's for `hf`/`auto`);
the worker pushes the actor's weights into it with `update_weights` (workers/weight_sync.py)
before the first generation and after every update. Multiprocessing is switched off
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the engine core runs in this process and
`collective_rpc` calls reach the model directly, tensors passed by reference. On CPU the
KV cache size comes from `cpu_kvcache_space_gb`; sleep/wake (freeing the KV cache while
training) is used where the platform supports it (GPUs). `vllm_sampling_params` is the
one place the rollout's sampling keys become a `SamplingParams`. `generate_ids` is the
token-in-token-out primitive of multi-turn rollouts (`TokensPrompt` in, sampled ids out,
a per-request `max_tokens`); with `multi_turn.enable` `generate_sequences` runs the loop
of workers/rollout/multi_turn.py on it. With `mode=async` it runs the agent loops of
workers/rollout/agent_rollout.py instead, one coroutine per trajectory on the same engine.
A rollout engine worker (workers/rollout_engine_worker.py, asynchronous training) holds one
in a process of its own: it loads the weights the trainer exports through `update_weights`
and runs the agent loops on its own event loop (`self.agents.agenerate`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from protocol.data_proto import DataProto
from workers.device import is_cuda_available, resolve_dtype_name
from workers.engine_logs import quiet_engine_before_import, stderr_to_engine_log
from workers.rollout.agent_rollout import AgentRollout
from workers.rollout.base import (
    ROLLOUT,
    GeneratedTurn,
    SamplingSettings,
    assemble_rollout,
    check_turn_requests,
    engine_load_format,
    engine_max_model_len,
    plain,
    prompt_token_lists,
    repeat_greedy,
    sampling_settings,
)
from workers.rollout.engine import KV_CACHE, VLLM_ENGINE, WEIGHTS, replace_capabilities
from workers.rollout.step_wise import loop_for_engine
from workers.rollout.tensor_parallel import WORKER_PROCESSES, check_same_requests, engine_kwargs, launch_environment
from workers.rollout.vllm_params import vllm_sampling_params
from workers.vision import collapse_image_tokens, is_vision_model
from workers.vision_messages import vision_processor_of
from workers.weight_sync import layer_buckets

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import ModelConfig, RolloutConfig


def _prepare_environment(config: RolloutConfig) -> str | None:
    """Sets the variables vLLM reads; returns the engine log file (None: vLLM's logging left
    as it is)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    log_path = quiet_engine_before_import()
    if not is_cuda_available():
        space = float(config.cpu_kvcache_space_gb)
        # vLLM reads the variable with int(): "1.0" would stop the engine at start-up.
        if not space.is_integer() or space < 1:
            raise ValueError(
                f"{ROLLOUT}.cpu_kvcache_space_gb={config.cpu_kvcache_space_gb}: vLLM's CPU KV cache is sized in "
                f"whole GiB; set a whole number >= 1"
            )
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(space)))
    return log_path


def vision_engine_check(model_config, model_hf_config) -> int | None:
    """The image token id of a vision-language policy (None for a text one), once vLLM can
    serve it here: its Qwen-VL model modules import torchvision."""
    if not is_vision_model(model_hf_config) or model_config.language_model_only:
        return None
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        raise RuntimeError(
            f"{ROLLOUT}.name=vllm with a vision-language policy: vLLM's Qwen-VL models need torchvision, which "
            f"is not installed; install the torchvision build matching torch {torch.__version__}, or set "
            f"{ROLLOUT}.name=hf"
        )
    return int(model_hf_config.image_token_id)


def vllm_engine_kwargs(model_config: ModelConfig, config: RolloutConfig) -> dict:
    """The arguments of `vllm.LLM(...)` for the rollout section `config` (tests bind them to the
    installed vLLM's signature)."""
    max_model_len = int(engine_max_model_len(config))
    kwargs = dict(
        model=model_config.path,
        # vLLM detokenizes only to find stop strings; it must read text as the trainer does.
        tokenizer=model_config.tokenizer_path or model_config.path,
        trust_remote_code=bool(model_config.trust_remote_code),
        dtype=resolve_dtype_name(str(config.dtype)),
        enforce_eager=bool(config.enforce_eager),
        load_format=engine_load_format(config.load_format),
        max_model_len=max_model_len,
        max_num_seqs=int(config.max_num_seqs),
        max_num_batched_tokens=max(int(config.max_num_batched_tokens), max_model_len),
        enable_chunked_prefill=bool(config.enable_chunked_prefill),
        # One shard per rank of a TP group (workers/rollout/tensor_parallel.py), or the whole engine.
        **engine_kwargs(int(config.tensor_model_parallel_size)),
        seed=int(config.seed),
        # Log-probs after temperature, matching the actor's temperature-scaled log-probs. Set
        # penalties, min_p or top-k/top-p also shape them, and the actor reproduces none of
        # those: rollout_log_probs then differ from the actor's by design.
        logprobs_mode="processed_logprobs",
        # Single turn: nothing to reuse. Multi-turn: every turn sends the conversation so far
        # again, and a cached prefix saves computing it anew; the weights do not change
        # within a rollout and update_weights empties the cache, so no entry is stale.
        enable_prefix_caching=bool(config.multi_turn.enable),
        enable_sleep_mode=bool(config.free_cache_engine) and is_cuda_available(),
    )
    if is_cuda_available():
        kwargs["gpu_memory_utilization"] = float(config.gpu_memory_utilization)
    kwargs.update(plain(config.engine_kwargs.vllm or {}))
    return kwargs


class VLLMRollout:
    def __init__(self, model_config: ModelConfig, config: RolloutConfig, tokenizer, model_hf_config):
        """`model_config` is `actor_rollout_ref.model` (path, tokenizer_path,
        trust_remote_code), `config` is `actor_rollout_ref.rollout`."""
        # Before anything imports vllm: it reads these variables.
        log_path = _prepare_environment(config)
        # Sampling settings vLLM refuses fail here, before the engine takes its memory.
        for meta_info in ({}, {"validate": True}):
            vllm_sampling_params(sampling_settings(config, meta_info))
        from vllm import LLM

        self.config = config
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = getattr(model_hf_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos])
        max_model_len = engine_max_model_len(config)
        self.max_model_len = max_model_len
        # A vision-language policy: the engine's images (multi_modal_data) and the loop's processor.
        self.image_token_id = vision_engine_check(model_config, model_hf_config)
        self.processor = vision_processor_of(model_config, model_hf_config) if self.image_token_id else None
        # Environment, tool, interaction and agent-loop files are read now: a mistake stops
        # the run before the engine takes its memory.
        self.multi_turn = loop_for_engine(self, None)
        self.agents = AgentRollout(self) if config.mode == "async" else None
        kwargs = vllm_engine_kwargs(model_config, config)
        # torch's C++ notices at start (the CPU worker's NUMA binding) go to the engine log.
        with stderr_to_engine_log(log_path), launch_environment(int(config.tensor_model_parallel_size)):
            self.llm = LLM(**kwargs)
        self.engine_dtype = self.llm.llm_engine.model_config.dtype
        # The model lives in vLLM's worker processes (not this one): weights go in buckets.
        self.shards_in_workers = kwargs.get("distributed_executor_backend") == WORKER_PROCESSES
        # Sleep where the platform has vLLM's sleep mode and free_cache_engine asked for it.
        sleeps = self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode
        self.capabilities = replace_capabilities(VLLM_ENGINE.capabilities(), sleeps)
        self.asleep: set[str] = set()  # the memory tags released by the last sleep and not woken since

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (HF name, tensor) pairs into the engine's parameters in place, then forget the
        caches the old weights filled.

        `reload_weights` (not `model.load_weights`) because the CPU backend repacks linear
        weights after loading. When the model is in this process (one shard per process: TP 1,
        or a worker group's external-launcher shard) the iterator is consumed lazily, so the
        caller can gather shards bucket by bucket while the engine loads. When the engine's
        shards are vLLM's own worker processes (a tensor-parallel engine actor) a generator
        cannot travel there: the weights go in lists of `update_weights_bucket_megabytes`,
        each a reload of whole layers (`layer_buckets`), each worker's loaders taking its shard
        of the full tensors.
        """
        if WEIGHTS in self.asleep:
            raise RuntimeError(
                "VLLMRollout.update_weights: the engine's weights are asleep; wake_up(('weights',)) first"
            )
        dtype = self.engine_dtype
        named_tensors = iter(named_tensors)
        converted = ((name, t.to(dtype)) for name, t in named_tensors)
        if self.shards_in_workers:
            bucket_bytes = int(self.config.update_weights_bucket_megabytes) * 1024 * 1024
            for bucket in layer_buckets(converted, bucket_bytes):
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": bucket})
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": converted})
        # Each item may be a collective gather: drain what the engine skipped so every
        # rank runs the same collectives.
        for _ in named_tensors:
            pass
        self.reset_caches()

    def reset_caches(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self, level: int) -> None:
        """Release the engine's device memory (no-op where it cannot sleep: CPU, or
        free_cache_engine=false). Level 1 keeps a host copy of the weights, level 2 drops them."""
        if not self.capabilities.can_sleep:
            return
        if level not in self.capabilities.sleep_levels:
            raise ValueError(f"vLLM sleep level {level}: the engine sleeps at {self.capabilities.sleep_levels}")
        if not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = {WEIGHTS, KV_CACHE}

    def wake_up(self, tags: tuple[str, ...] | None = None) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"; None: all) that is asleep."""
        waking = sorted(self.asleep if tags is None else self.asleep & set(tags))
        if waking:
            self.llm.wake_up(tags=waking)
            self.asleep -= set(waking)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def _request(self, ids: list[int], images: list | None):
        """vLLM's prompt: the ids, and with images verl's form (one placeholder per image, which
        vLLM expands itself, and multi_modal_data={"image": [...]})."""
        from vllm.inputs import TokensPrompt

        if not images:
            return TokensPrompt(prompt_token_ids=list(ids))
        ids = collapse_image_tokens(list(ids), self.image_token_id)
        return TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": list(images)})

    def generate_ids(
        self, prompt_ids: list[list[int]], settings: SamplingSettings, max_tokens: list[int], vision=None
    ) -> list[GeneratedTurn]:
        """One sample per prompt, each with its own token budget; ids as sampled. `vision`:
        per prompt its images (a VisionState, workers/rollout/multi_turn_images.py)."""
        check_turn_requests(prompt_ids, settings, max_tokens, self.max_model_len)
        check_same_requests(int(self.config.tensor_model_parallel_size), prompt_ids, max_tokens)
        params_by_budget = {
            budget: vllm_sampling_params(dataclasses.replace(settings, max_tokens=int(budget)))
            for budget in set(max_tokens)
        }
        vision = vision or [None] * len(prompt_ids)
        requests = [self._request(ids, state.images if state else None) for ids, state in zip(prompt_ids, vision)]
        params = [params_by_budget[budget] for budget in max_tokens]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        turns = []
        for request_output in outputs:
            completion = request_output.outputs[0]
            ids = list(completion.token_ids)
            log_probs = [step[tok].logprob for step, tok in zip(completion.logprobs, ids)]
            turns.append(GeneratedTurn(ids, log_probs, "stop" if completion.finish_reason == "stop" else "length"))
        return turns

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.multi_turn = loop_for_engine(self, self.multi_turn)
        if self.agents is not None:
            return self.agents.generate_sequences(prompts)
        if self.multi_turn is not None:
            return self.multi_turn.generate_sequences(prompts)
        settings = sampling_settings(self.config, prompts.meta_info)
        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        params = vllm_sampling_params(settings)  # greedy: one sample per prompt, repeated below
        mm_data = prompts.non_tensor_batch.get("multi_modal_data", [None] * len(prompts))  # a VLM's (verl's form)
        images = [(d or {}).get("image") for d in mm_data]
        requests = [self._request(ids, im) for ids, im in zip(prompt_token_lists(input_ids, attention_mask), images)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        token_ids, log_probs = [], []
        for request_output in outputs:
            for completion in request_output.outputs:
                token_ids.append(list(completion.token_ids))
                log_probs.append([step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)])
        if settings.greedy:
            token_ids, log_probs = repeat_greedy(token_ids, log_probs, settings.n)
        return assemble_rollout(
            input_ids,
            attention_mask,
            prompts.batch["position_ids"],
            token_ids,
            log_probs,
            n=settings.n,
            response_length=int(self.config.response_length),
            pad_token_id=self.pad_token_id,
            eos_token_ids=self.eos_token_ids,
            meta_info={"n": settings.n},
        )
