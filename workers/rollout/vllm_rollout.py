"""vLLM in the worker's own process: the rollout engine of the hybrid worker.

The engine starts with dummy weights (`load_format=dummy`); the sharding manager pushes
the actor's weights into it with `update_weights` before every generation. Multiprocessing
is switched off (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the engine core runs in this
process and `collective_rpc` calls reach the model directly, tensors passed by reference.
On CPU the KV cache size comes from `cpu_kvcache_space_gb`; sleep/wake (freeing the KV
cache while training) is used where the platform supports it (GPUs).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from protocol.data_proto import DataProto
from workers.device import is_cuda_available, resolve_dtype_name
from workers.rollout.base import assemble_rollout, prompt_token_lists, sampling_settings


def _prepare_environment(config) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not is_cuda_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.get("cpu_kvcache_space_gb", 1)))


class VLLMRollout:
    def __init__(self, model_path: str, config, tokenizer, model_hf_config):
        _prepare_environment(config)
        from vllm import LLM

        self.config = config
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = getattr(model_hf_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos])
        max_model_len = config.get("max_model_len") or (int(config.prompt_length) + int(config.response_length))
        engine_kwargs = dict((config.get("engine_kwargs") or {}).get("vllm") or {})
        kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=resolve_dtype_name(str(config.get("dtype", "auto"))),
            enforce_eager=bool(config.get("enforce_eager", True)),
            load_format=config.get("load_format", "dummy"),
            max_model_len=int(max_model_len),
            max_num_seqs=int(config.get("max_num_seqs", 256)),
            max_num_batched_tokens=max(int(config.get("max_num_batched_tokens", 8192)), int(max_model_len)),
            enable_chunked_prefill=bool(config.get("enable_chunked_prefill", True)),
            tensor_parallel_size=int(config.get("tensor_model_parallel_size", 1)),
            seed=int(config.get("seed", 0)),
            # Log-probs after temperature, matching the actor's temperature-scaled log-probs.
            logprobs_mode="processed_logprobs",
            # Weights change every step; a cached prefix would hold stale KV entries.
            enable_prefix_caching=False,
            enable_sleep_mode=bool(config.get("free_cache_engine", False)) and is_cuda_available(),
            trust_remote_code=bool(config.get("trust_remote_code", False)),
        )
        if is_cuda_available():
            kwargs["gpu_memory_utilization"] = float(config.get("gpu_memory_utilization", 0.5))
        kwargs.update(engine_kwargs)
        self.llm = LLM(**kwargs)
        self.engine_dtype = self.llm.llm_engine.model_config.dtype
        self.sleeping = False

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (HF name, tensor) pairs into the engine's parameters in place.

        `reload_weights` (not `model.load_weights`) because the CPU backend repacks linear
        weights after loading; the iterator is consumed lazily, so the caller can gather
        shards bucket by bucket while the engine loads.
        """
        dtype = self.engine_dtype
        named_tensors = iter(named_tensors)
        converted = ((name, t.to(dtype)) for name, t in named_tensors)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": converted})
        # Each item may be a collective gather: drain what the engine skipped so every
        # rank runs the same collectives.
        for _ in named_tensors:
            pass
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        if self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        settings = sampling_settings(self.config, prompts.meta_info)
        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        params = SamplingParams(
            n=settings.n,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            max_tokens=settings.max_tokens,
            ignore_eos=settings.ignore_eos,
            logprobs=0,
            detokenize=False,
        )
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_lists(input_ids, attention_mask)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        token_ids, log_probs = [], []
        for request_output in outputs:
            for completion in request_output.outputs:
                token_ids.append(list(completion.token_ids))
                log_probs.append(
                    [step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)]
                )
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
