"""The rollout engines of asynchronous training, seen from the driver: one Ray actor per engine
(workers/rollout_engine_worker.py) on devices of its own (`rollout.nnodes x
rollout.n_gpus_per_node`, `tensor_model_parallel_size` each; CPU cores when there is no GPU),
beside the training group.

With `actor_rollout_ref.rollout.remote.*` the engines are servers of a deployment of their own
(`python -m hybrid.serve`), each reached through a client actor (workers/rollout/remote_engine.py)
with the same methods; the weights then travel to them over HTTP.

`push` hands the trainer's weights to every engine with a version (the trainer's step count):
the training ranks gather them once into Ray's object store (shared memory on one node, no
file), and each engine loads them in place, waiting for its requests in flight or aborting
them to redo on the new weights (`async_training.partial_rollout`). `generate_sequences`
splits a batch over the engines (validation, one-step-off); `submit` sends one prompt group
to the least busy engine and returns its pending result (fully async).
"""

from __future__ import annotations

import time

import ray

from hybrid.roles import cpus_per_slot_for, ray_uses_gpus
from protocol.data_proto import DataProto
from workers.device import cpu_only_env
from workers.rollout.remote_engine import remote_endpoints


class EnginePool:
    def __init__(self, config):
        self.config = config
        tp = int(config.actor_rollout_ref.rollout.tensor_model_parallel_size)
        self.remote = config.actor_rollout_ref.rollout.remote
        # Remote engines (workers/rollout/remote_engine.py): one client actor per control-plane URL.
        self.count = len(remote_endpoints(self.remote)) if self.remote.enabled else config.rollout.devices // tp
        self.devices = config.rollout.devices  # remote: the deployment's, known once connected
        self.abort_on_push = bool(config.async_training.partial_rollout)
        self.version = -1  # no weights yet: the engines hold dummy ones (or the model folder's)
        self.engines: list = []
        self.in_flight = [0] * self.count
        self.dtype = None
        self.initial_version = -1  # start(): the version the engines serve before any push
        self._tp = tp

    def start(self) -> None:
        if self.remote.enabled:
            self._start_remote()
            return
        from workers.rollout_engine_worker import RolloutEngineWorker

        gpu = ray_uses_gpus(self.config)  # from the cluster (hybrid/placement.py), not this process
        cores = (1 if gpu else cpus_per_slot_for(self.config)) * self._tp
        env = {"OMP_NUM_THREADS": str(cores), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
        if not gpu:
            env.update(cpu_only_env())  # Ray leaves a GPU-less actor every GPU of its node
        remote = ray.remote(RolloutEngineWorker).options(
            num_cpus=cores, num_gpus=self._tp if gpu else 0, runtime_env={"env_vars": env}, max_concurrency=1000
        )
        arr = self.config.actor_rollout_ref
        self.engines = [remote.remote(arr, engine_index=i) for i in range(self.count)]
        started = ray.get([engine.init_engine.remote() for engine in self.engines])
        # The version every engine serves before any push: 0 with a load format that reads the
        # model folder, -1 (none) with a dummy one.
        self.initial_version = min(int(info["version"]) for info in started)
        self.dtype = ray.get(self.engines[0].engine_dtype.remote())

    def _start_remote(self) -> None:
        """Clients of the servers `python -m hybrid.serve` started, checked from here first."""
        from workers.rollout.remote_engine import RemoteEngineWorker, check_remote_servers

        arr = self.config.actor_rollout_ref
        healths = check_remote_servers(self.remote, arr.rollout)
        endpoints = remote_endpoints(self.remote)
        controls = dict.fromkeys(control for control, _ in endpoints)
        self.devices = sum(int(healths[c]["servers"]) * int(healths[c]["tensor_parallel_size"]) for c in controls)
        client = ray.remote(RemoteEngineWorker).options(num_cpus=0, max_concurrency=1000)
        self.engines = [
            client.remote(arr, engine_index=i, control_url=control, data_url=data)
            for i, (control, data) in enumerate(endpoints)
        ]
        started = ray.get([engine.init_engine.remote() for engine in self.engines])
        self.initial_version = min(int(info["version"]) for info in started)
        self.dtype = ray.get(self.engines[0].engine_dtype.remote())

    def set_reward_loop(self, handles: list, use_reward_fn: bool, reward_fn_key: str) -> None:
        ray.get([e.set_reward_loop.remote(handles, use_reward_fn, reward_fn_key) for e in self.engines])

    def push(self, actor_wg, version: int) -> float:
        """The trainer's current weights to every engine, as `version`; seconds taken."""
        start = time.perf_counter()
        exported = actor_wg.export_weights(self.dtype)
        (weights,) = exported[0]  # rank 0's one-element list: the object store reference
        ray.get([engine.load_weights.remote(version, weights, abort=self.abort_on_push) for engine in self.engines])
        self.version = int(version)
        return time.perf_counter() - start

    def simulate_push(self, version: int, seconds: float) -> float:
        """A push without weights (async_training.simulate_training): every engine pauses as
        for `push`, holds `seconds`, and serves its same weights as `version`; seconds taken."""
        start = time.perf_counter()
        ray.get([engine.simulate_sync.remote(version, seconds, abort=self.abort_on_push) for engine in self.engines])
        self.version = int(version)
        return time.perf_counter() - start

    def generate_sequences(self, batch: DataProto) -> DataProto:
        """`batch` split in contiguous parts over the engines, generated, back in order."""
        return self.collect(self.launch(batch))

    def launch(self, batch: DataProto) -> list:
        """`batch` split over the engines, started; `collect` waits for it."""
        return [self.engines[i].generate.remote(part) for i, part in enumerate(_split(batch, self.count)) if len(part)]

    @staticmethod
    def collect(launched: list) -> DataProto:
        outputs = ray.get(launched)
        return DataProto.concat(outputs) if len(outputs) > 1 else outputs[0]

    def submit(self, batch: DataProto):
        """(engine index, pending result) of `batch` on the engine with the fewest rows in flight."""
        index = min(range(self.count), key=lambda i: self.in_flight[i])
        self.in_flight[index] += len(batch)
        return index, self.engines[index].generate.remote(batch)

    def done(self, index: int, rows: int) -> None:
        self.in_flight[index] -= rows

    def busy_seconds(self) -> float:
        """The engines' time generating since they started, summed."""
        return float(sum(ray.get([engine.busy_seconds.remote() for engine in self.engines])))

    def shutdown(self) -> None:
        for engine in self.engines:
            ray.kill(engine, no_restart=True)
        self.engines = []


def _split(batch: DataProto, parts: int) -> list[DataProto]:
    size, extra = divmod(len(batch), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(batch[start:end])
        start = end
    return out


__all__ = ["EnginePool"]
