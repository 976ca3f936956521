"""A rollout engine in its own process, beside the training worker group: asynchronous training.

The driver makes `RolloutEngineWorker` a Ray actor on devices (CPU cores) of its own; it
joins no torch.distributed group with the trainers. It holds one engine (`VLLMRollout`, or
transformers' generate with rollout.name=hf), built from `actor_rollout_ref.model` and
`.rollout` as the fused worker builds its own, and serves a policy version: after an update
the trainer's ranks gather the weights once into Ray's object store
(`ActorRolloutRefWorker.export_weights`), and every engine loads them in place with the
trainer's version (`load_weights`). With a dummy load format the engine holds no policy
until its first load and refuses to generate before it (version -1); with a format that
reads the model folder it serves that as version 0.

`generate` takes and returns what the fused worker's `generate_sequences` does, and may be
called many times at once (a Ray async actor: every call a coroutine on the actor's event
loop). With rollout.mode=async the calls' trajectories run as coroutines on that loop over
one long-lived `AsyncEngineDriver`, whose engine batches every request in flight
(`AgentRollout.agenerate`); with mode=sync each call is one batched engine call in a thread,
one at a time. Each sample carries its policy version: `rollout_versions` (B, R) int64 per
response token (-1 where the response mask is 0) and the non-tensor `policy_version` (the
oldest version among its model tokens).

A load while generations are in flight (mode=async) pauses the driver: `abort=False` waits
for the requests in the engine to finish, `abort=True` aborts them (verl's partial rollout)
and the agent loops sample those turns again on the new weights. Either way no trajectory is
lost, and a multi-turn trajectory may take later turns from the new weights, which is why
versions are stamped per token. The version changes only on the actor's loop while the
driver is paused, after the loop has woken every coroutine whose request returned (see
`_load_async`), so a turn's stamp is the version that sampled all of its tokens. A mode=sync
load waits for the batched call in progress, and goes before the calls queued behind it.

`simulate_sync` is a load without weights (async_training.simulate_training, SkyRL's simulated
trainer): the same pause, a sleep where the load would be, the new version, the same resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from protocol.data_proto import DataProto
from workers.model_loading import load_tokenizer, model_path_in_shm
from workers.rollout.agent_rollout import check_shared_driver
from workers.rollout.async_engine import AsyncEngineDriver
from workers.rollout.base import DUMMY_LOAD_FORMATS
from workers.rollout.engine import build_engine

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import ActorRolloutRefConfig

NO_WEIGHTS = -1  # the version of an engine that holds no policy yet (dummy weights)


class RolloutEngineWorker:
    """One rollout engine; `config`: the `actor_rollout_ref` section; `engine_index`: its place
    among the driver's engines (names its driver thread and its logs)."""

    def __init__(self, config: ActorRolloutRefConfig, engine_index: int = 0):
        self.config = config
        self.engine_index = int(engine_index)
        self.rollout = None
        self.driver: AsyncEngineDriver | None = None  # mode=async: shared by every call
        self._version = NO_WEIGHTS
        self._gate: _Gate | None = None  # one load, or (mode=sync) one batched call, at a time
        self._failure: BaseException | None = None
        self._sync_busy_s = 0.0
        self._loads = 0
        self._load_s = 0.0

    # ------------------------------------------------------------------ building
    def init_engine(self) -> dict:
        """Build the tokenizer and the engine; returns {"dtype", "version"}."""
        if self.config.model.use_shm:
            path = model_path_in_shm(self.config.model.path)
            self.config = replace(self.config, model=replace(self.config.model, path=path))
        model, cfg = self.config.model, self.config.rollout
        if cfg.mode == "async":
            check_shared_driver(cfg.agent)  # before the engine takes its memory
        tokenizer = load_tokenizer(model.tokenizer, model.trust_remote_code)
        self.rollout = build_engine(model, cfg, tokenizer, _hf_config(model))
        if cfg.load_format not in DUMMY_LOAD_FORMATS:
            self._version = 0  # the model folder's weights
        if cfg.mode == "async":
            self.driver = AsyncEngineDriver(self.rollout.llm, name=f"rollout-engine-{self.engine_index}")
        return {"dtype": self.engine_dtype(), "version": self._version}

    def set_reward_loop(self, handles: list, use_reward_fn: bool, reward_fn_key: str) -> None:
        """The reward loop's workers: with mode=async the agent loops send each trajectory to one
        as it finishes (workers/rollout/agent_rollout.py)."""
        self._require_engine("set_reward_loop")
        agents = getattr(self.rollout, "agents", None)
        if agents is not None:
            agents.set_reward_loop(handles, use_reward_fn, reward_fn_key)

    def engine_dtype(self) -> str:
        """The engine's dtype name ("bfloat16", "float32"): what `export_weights` casts to."""
        self._require_engine("engine_dtype")
        return str(self.rollout.engine_dtype).removeprefix("torch.")

    def version(self) -> int:
        """The policy version the engine serves (-1: none yet)."""
        return self._version

    def busy_seconds(self) -> float:
        """Seconds the engine spent generating since it was built."""
        return self.driver.stats().busy_s if self.driver is not None else self._sync_busy_s

    def stats(self) -> dict:
        """Version, loads, seconds loading, busy seconds, and (mode=async) trajectories and
        engine requests in flight (queued or in the engine), turns aborted by loads and the
        engine's steps so far."""
        stats = {
            "version": self._version,
            "loads": self._loads,
            "load_s": self._load_s,
            "busy_s": self.busy_seconds(),
        }
        if self.driver is not None:
            stats.update(self.rollout.agents.activity.snapshot(), engine_steps=self.driver.stats().steps)
        return stats

    def shutdown(self) -> None:
        if self.driver is not None:
            self.driver.close()

    # ------------------------------------------------------------------ weights
    async def load_weights(self, version: int, weights, abort: bool = False) -> float:
        """Load a policy's weights in place and serve them as `version`; returns the seconds.

        `weights`: (HF name, tensor) pairs in any iterable form: `SharedWeights` (what
        export_weights puts in the object store; Ray resolves the reference when it is passed
        as an argument of its own), a list of pairs, a dict, or the one-element list
        `[ObjectRef]` export_weights returned. mode=async: the driver pauses (abort=False:
        the requests in the engine finish first; abort=True: they are aborted and sampled
        again after the load); mode=sync: after the batched call in progress. The work runs
        in threads, so other calls keep running on the actor's loop meanwhile."""
        self._require_engine("load_weights")
        # Shielded: a cancelled caller must not leave the driver paused or the lock held.
        return await asyncio.shield(asyncio.ensure_future(self._load(int(version), weights, bool(abort))))

    async def simulate_sync(self, version: int, seconds: float, abort: bool = False) -> float:
        """A weight push with no weights (async_training.simulate_training): generation pauses
        as for `load_weights`, stays paused `seconds` (SkyRL's simulate_weight_sync_seconds)
        where the load would run, then serves the same weights as `version`; returns the seconds."""
        self._require_engine("simulate_sync")
        hold = float(seconds)
        return await asyncio.shield(asyncio.ensure_future(self._load(int(version), None, bool(abort), hold)))

    async def _load(self, version: int, weights, abort: bool, hold_s: float | None = None) -> float:
        """`weights` loaded as `version`; with `hold_s` (simulate_sync) a sleep instead of a load."""
        start = time.perf_counter()
        apply = functools.partial(self._update, weights) if hold_s is None else functools.partial(time.sleep, hold_s)
        async with self._the_gate().hold(load=True):
            try:
                if self.driver is None:
                    await asyncio.to_thread(apply)
                    self._version = version
                else:
                    await self._load_async(version, apply, abort)
            except BaseException as error:
                # Half-loaded weights are nobody's policy: the worker serves no more calls.
                self._failure = error
                raise
        seconds = time.perf_counter() - start
        self._loads += 1
        self._load_s += seconds
        return seconds

    async def _load_async(self, version: int, apply, abort: bool) -> None:
        # pause() returns once no request is in the engine; the outputs (or aborts) of those
        # requests were handed to this loop before it returned, so their coroutines wake (and
        # read the old version) before this one does. The new version is set before resume():
        # a request admitted after it is stamped with the new one.
        await asyncio.to_thread(self.driver.pause, abort)
        try:
            await asyncio.to_thread(apply)
            self._version = version
        except BaseException:
            # Closing the driver fails every request queued or retried: no trajectory samples
            # from half-loaded weights.
            self.driver.close()
            raise
        finally:
            self.driver.resume()

    @torch.no_grad()
    def _update(self, weights) -> None:
        if isinstance(weights, list) and len(weights) == 1 and not isinstance(weights[0], tuple):
            import ray

            weights = ray.get(weights[0])  # export_weights' [ObjectRef], passed on as it came
        if isinstance(weights, dict):
            weights = weights.items()
        self.rollout.update_weights(weights)

    # ------------------------------------------------------------------ generation
    async def generate(self, prompts: DataProto) -> DataProto:
        """The fused worker's generate_sequences contract: prompts (input_ids, attention_mask,
        position_ids; non-tensor fields for agent loops; meta_info for sampling: do_sample,
        validate, n, ...) -> samples with their policy versions. Safe to call concurrently."""
        self._require_engine("generate")
        if self._version == NO_WEIGHTS:
            raise RuntimeError(
                f"RolloutEngineWorker {self.engine_index}.generate: the engine holds no policy weights "
                f"(load_format={self.config.rollout.load_format} starts with random ones); call load_weights first"
            )
        start = time.perf_counter()
        if self.driver is not None:
            output = await self.rollout.agents.agenerate(prompts, self.driver, version=self.version)
        else:
            async with self._the_gate().hold(load=False):
                version, began = self._version, time.perf_counter()
                output = await asyncio.to_thread(self._generate_sync, prompts)
                self._sync_busy_s += time.perf_counter() - began
            _stamp_one_version(output, version)
        output.meta_info.setdefault("timing", {})["generate"] = time.perf_counter() - start
        output.meta_info["engine_index"] = self.engine_index
        return output

    @torch.no_grad()
    def _generate_sync(self, prompts: DataProto) -> DataProto:
        return self.rollout.generate_sequences(prompts)

    # ------------------------------------------------------------------ helpers
    def _the_gate(self) -> _Gate:
        if self._gate is None:  # made on the loop that uses it
            self._gate = _Gate()
        return self._gate

    def _require_engine(self, method: str) -> None:
        if self.rollout is None:
            raise RuntimeError(f"RolloutEngineWorker.{method}: call init_engine first")
        if self._failure is not None:
            raise RuntimeError(
                f"RolloutEngineWorker {self.engine_index}: a weight load failed ({type(self._failure).__name__}: "
                f"{self._failure}); the engine's weights are unknown and it serves no more calls"
            ) from self._failure


class _Gate:
    """The engine for one holder at a time, loads first: a load waits only for the batched
    call in progress, not for calls queued after it (which would sample stale weights)."""

    def __init__(self):
        self._cond = asyncio.Condition()
        self._busy = False
        self._loads_waiting = 0

    @contextlib.asynccontextmanager
    async def hold(self, load: bool):
        async with self._cond:
            self._loads_waiting += load
            try:
                await self._cond.wait_for(lambda: not self._busy and (load or not self._loads_waiting))
            finally:
                self._loads_waiting -= load
            self._busy = True
        try:
            yield
        finally:
            async with self._cond:
                self._busy = False
                self._cond.notify_all()


def _hf_config(model):
    """The model's Hugging Face config with the section's overrides (the engine reads its EOS ids)."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model.path, trust_remote_code=bool(model.trust_remote_code))
    if model.language_model_only:  # the trained language model's (HF generate builds that class)
        from workers.language_model import text_config_of

        hf_config = text_config_of(hf_config)
    for key, value in dict(model.override_config or {}).items():
        setattr(hf_config, key, value)
    return hf_config


def _stamp_one_version(output: DataProto, version: int) -> None:
    """A batched call's samples all come from one version: every model token's stamp."""
    mask = output.batch["response_mask"].bool()
    output.batch["rollout_versions"] = torch.where(mask, int(version), -1).to(torch.int64)
    versions = np.empty(len(output), dtype=object)
    versions[:] = [int(version)] * len(output)
    output.non_tensor_batch["policy_version"] = versions


__all__ = ["NO_WEIGHTS", "RolloutEngineWorker"]
