"""The reward model served by an inference engine, for the reward loop (reward_model.rollout).

`RewardEngine` holds one vLLM engine on `reward_model.model.path`, in a Ray actor of its own
(hybrid/reward_loop.py makes it one). A sequence classifier (the folder's architecture ends in
`ForSequenceClassification`) is served as vLLM's pooling model: `classify` returns the head's
raw value (no activation), the number the FSDP reward-model worker reads from `logits[:, 0]`.
A causal LM is served as a judge: `judge` writes a verdict for one conversation.

Both take one trajectory per call and many calls at once (an async actor): classification
requests that arrive while a batch is being scored wait and go together in the next one;
verdicts go through `AsyncEngineDriver`, whose engine batches every request in flight.
The engine stays loaded for the whole run (CPU only in this version: vLLM has no sleep mode
there, so verl's `reward_model.rollout.free_cache_engine` has no effect; hybrid/config/foreign_keys.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from workers.device import is_cuda_available, resolve_dtype_name
from workers.engine_logs import ENGINE_LOG_DIR_ENV, quiet_engine_before_import, stderr_to_engine_log
from workers.model_loading import load_tokenizer

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import RewardModelConfig

DISCRIMINATIVE, GENERATIVE = "discriminative", "generative"
RM_ROLLOUT = "reward_model.rollout"


def reward_model_kind(model_path: str) -> str:
    """`discriminative` for a sequence classifier, `generative` for anything else (a judge),
    read from the folder's config.json."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        raise ValueError(f"reward_model.model.path={model_path}: no config.json there (a Hugging Face model folder)")
    architectures = json.loads(config_file.read_text()).get("architectures") or []
    return DISCRIMINATIVE if any(a.endswith("ForSequenceClassification") for a in architectures) else GENERATIVE


def engine_context(config: RewardModelConfig) -> int:
    """The engine's context: reward_model.rollout.max_model_len when set, else prompt_length +
    response_length cut to the model's own limit (max_position_embeddings), since the reward
    loop keeps the tail of a longer input anyway."""
    rollout = config.rollout
    if rollout.max_model_len:
        return int(rollout.max_model_len)
    hf = json.loads((Path(config.model.path) / "config.json").read_text())
    limit = hf.get("max_position_embeddings") or hf.get("text_config", {}).get("max_position_embeddings")
    return min(rollout.engine_max_model_len, int(limit)) if limit else rollout.engine_max_model_len


def engine_kwargs(config: RewardModelConfig, kind: str) -> dict:
    """vllm.LLM's keyword arguments from reward_model.rollout (verl's keys, the same meanings
    as the policy engine's)."""
    rollout = config.rollout
    max_model_len = engine_context(config)
    kwargs = dict(
        model=config.model.path,
        trust_remote_code=bool(config.model.trust_remote_code),
        dtype=resolve_dtype_name(str(rollout.dtype)),
        enforce_eager=bool(rollout.enforce_eager),
        load_format="auto" if rollout.load_format == "hf" else str(rollout.load_format),
        max_model_len=max_model_len,
        max_num_seqs=int(rollout.max_num_seqs),
        max_num_batched_tokens=max(int(rollout.max_num_batched_tokens), max_model_len),
        enable_chunked_prefill=bool(rollout.enable_chunked_prefill),
        enable_prefix_caching=bool(rollout.enable_prefix_caching),
        disable_log_stats=bool(rollout.disable_log_stats),
        tensor_parallel_size=int(rollout.tensor_model_parallel_size),
        runner="pooling" if kind == DISCRIMINATIVE else "generate",
    )
    if is_cuda_available():
        kwargs["gpu_memory_utilization"] = float(rollout.gpu_memory_utilization)
    kwargs.update(dict(rollout.engine_kwargs.vllm or {}))
    return kwargs


class RewardEngine:
    """config: the `reward_model` section; `log_dir`: where the engine's start-up output goes."""

    def __init__(self, config: RewardModelConfig, log_dir: str | None = None):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if log_dir:
            os.environ.setdefault(ENGINE_LOG_DIR_ENV, log_dir)
        log_path = quiet_engine_before_import()
        if not is_cuda_available():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(config.rollout.cpu_kvcache_space_gb)))
        from vllm import LLM

        self.config = config
        self.kind = reward_model_kind(config.model.path)
        self.tokenizer = load_tokenizer(config.model.path, config.model.trust_remote_code)
        self.max_model_len = engine_context(config)
        with stderr_to_engine_log(log_path):
            self.llm = LLM(**engine_kwargs(config, self.kind))
        self._pending: list[tuple[list[int], asyncio.Future]] = []
        self._flushing = False
        self._driver = None
        if self.kind == GENERATIVE:
            from workers.rollout.async_engine import AsyncEngineDriver

            self._driver = AsyncEngineDriver(self.llm, name="reward-judge")

    def info(self) -> dict:
        return {"kind": self.kind, "max_model_len": self.max_model_len}

    # ------------------------------------------------------------------ discriminative
    async def classify(self, ids: list[int]) -> float:
        """The reward model's value for one token sequence (cut by the caller to max_model_len)."""
        if self.kind != DISCRIMINATIVE:
            raise ValueError(
                f"reward_model.model.path={self.config.model.path} is a judge (causal LM), not a classifier"
            )
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(ids), future))
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        """Score whatever waits, in one engine call, until nothing waits."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    scores = await asyncio.to_thread(self._classify_now, [ids for ids, _ in batch])
                except Exception as error:  # handed to every awaiting caller, which raises it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), score in zip(batch, scores):
                    if not future.done():
                        future.set_result(score)
        finally:
            self._flushing = False

    def _classify_now(self, rows: list[list[int]]) -> list[float]:
        from vllm.inputs import TokensPrompt
        from vllm.pooling_params import PoolingParams

        outputs = self.llm.classify(
            [TokensPrompt(prompt_token_ids=ids) for ids in rows],
            pooling_params=PoolingParams(use_activation=False),
            use_tqdm=False,
        )
        return [float(output.outputs.probs[0]) for output in outputs]

    # ------------------------------------------------------------------ generative
    async def judge(
        self, messages: list[dict], temperature: float, stop: list[str] | None, top_p: float = 1.0, top_k: int = -1
    ) -> str:
        """The judge's verdict (text) on one conversation, at most response_length tokens."""
        if self._driver is None:
            raise ValueError(f"reward_model.model.path={self.config.model.path} is a classifier, not a judge")
        from vllm import SamplingParams

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
        budget = self.max_model_len - len(ids)
        if budget < 1:
            raise ValueError(
                f"the judge's prompt is {len(ids)} tokens, the engine holds {self.max_model_len}: raise "
                f"{RM_ROLLOUT}.prompt_length"
            )
        params = SamplingParams(
            n=1,
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=int(top_k),
            max_tokens=min(int(self.config.rollout.response_length), budget),
            stop=list(stop) if stop else None,
            logprobs=0,
            detokenize=bool(stop),
        )
        turn = await self._driver.generate(ids, params)
        return self.tokenizer.decode(turn.token_ids, skip_special_tokens=True)
