"""An engine sharing its device with the trainer: the memory sequence of the fused worker, in verl 0.9.1's order.

The fused worker (workers/actor_rollout_ref_worker.py) trains and generates on one device, so
the engine and the actor take turns with its memory. After every update
(`update_rollout_weights`, `load_weights` here):

    empty_cache              torch's cached blocks go back to the device (vLLM's sleep
                             allocator cannot reuse them)
    wake_up(("weights",))    the engine's weight memory only; the KV cache stays released
    load                     the actor's shards gathered one bucket at a time and loaded in
                             place (workers/weight_sync.py), the actor held on the device meanwhile
    reset caches             the engine's prefix/KV caches came from the old weights
    offload                  the actor's parameters (and optimizer) back to the host where the
                             fsdp_config switches say, as the actor's hold ends
    empty_cache

and around every generation (`generate`):

    wake_up(("kv_cache",))   the KV cache, now that the actor is off the device
    generate
    sleep(2)                 weights and KV cache released; level 2 copies nothing to the host,
                             because the weights are replaced before the next generation: a
                             generation that finds them dropped (a validation pass after the
                             update's load) loads them first.

The engine is built after the actor's parameters are offloaded, and its share of the device is
checked against what is free before it is built (`check_engine_memory`). An engine without
sleep (every engine on CPU, where vLLM ignores sleep/wake; transformers' generate) declares no
sleep levels in its capabilities (and `free_cache_engine=false` asks for none), and the same
calls run with the sleep and wake steps skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from workers import device
from workers.rollout.engine import KV_CACHE, WEIGHTS, RolloutEngine

GPU_MEMORY_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
GIB = 1024**3


def check_engine_memory(free_bytes: int, total_bytes: int, utilization: float) -> None:
    """vLLM takes `utilization` x the device's memory and refuses to start with less free:
    refuse first, in one line with the numbers and what to change."""
    wanted = utilization * total_bytes
    if free_bytes >= wanted:
        return
    fits = max(free_bytes / total_bytes - 0.01, 0.0)
    raise RuntimeError(
        f"{GPU_MEMORY_KEY}={utilization} asks the rollout engine for {wanted / GIB:.1f} GiB of the device's "
        f"{total_bytes / GIB:.1f} GiB, but only {free_bytes / GIB:.1f} GiB are free with the actor and reference "
        f"built and their offload switches applied; set {GPU_MEMORY_KEY} to at most {fits:.2f}, or "
        f"actor_rollout_ref.actor.fsdp_config.param_offload=true / ref.fsdp_config.param_offload=true"
    )


def check_free_memory_for_engine(utilization: float) -> None:
    """`check_engine_memory` on this process's device (nothing to check on CPU)."""
    info = device.memory_info()
    if info is not None:
        check_engine_memory(info[0], info[1], float(utilization))


class ColocatedEngine:
    """`engine` time-sharing the device with the actor. `sync_weights()` gathers and loads the
    actor's weights (a collective); `actor_on_device()` holds the actor's parameters on the
    device for a block and offloads them after it, as the switches say. `free_cache_engine`:
    verl's switch to release the engine's memory between generations."""

    def __init__(
        self,
        engine: RolloutEngine,
        sync_weights: Callable[[], None],
        actor_on_device: Callable[[], AbstractContextManager],
        free_cache_engine: bool,
    ):
        self.engine = engine
        self.sync_weights = sync_weights
        self.actor_on_device = actor_on_device
        levels = engine.capabilities.sleep_levels
        self.sleep_level = (2 if 2 in levels else max(levels)) if free_cache_engine and levels else None
        self.synced = False  # the engine holds weights loaded since it was built or a checkpoint was loaded
        self.weights_dropped = False  # a level-2 sleep released them: load again before generating

    def release(self) -> None:
        """Sleep as after a generation (right after the engine is built: its first weights are
        replaced before it generates)."""
        if self.sleep_level is not None:
            self.engine.sleep(self.sleep_level)
            self.weights_dropped = self.sleep_level >= 2

    def load_weights(self) -> float:
        """The actor's current weights into the engine; seconds."""
        start = time.perf_counter()
        device.empty_cache()
        self._wake((WEIGHTS,))
        with self.actor_on_device():
            self.sync_weights()  # gathers, loads and resets the engine's caches
        device.empty_cache()
        self.synced, self.weights_dropped = True, False
        return time.perf_counter() - start

    def generate(self, call: Callable[[], object]):
        """`call()` (a generation on the engine) with the engine's memory taken and released
        around it; the weights loaded first when a sleep dropped them."""
        if not self.synced:
            raise RuntimeError(
                "generate_sequences: the rollout engine does not hold the actor's weights (none were sent since "
                "the engine was built or a checkpoint was loaded); call update_rollout_weights first"
            )
        if self.weights_dropped:
            self.load_weights()
        self._wake((KV_CACHE,))
        try:
            return call()
        finally:
            self.release()

    def _wake(self, tags: tuple[str, ...]) -> None:
        if self.sleep_level is not None:  # nothing sleeps otherwise: the step is skipped
            self.engine.wake_up(tags)

    def forget_weights(self) -> None:
        """A checkpoint replaced the actor's weights: the engine's are not the policy's any more."""
        self.synced = False
