"""Worker groups on Ray: one actor per device slot, placed with placement groups.

`RayResourcePool` reserves `nnodes x slots_per_node` bundles (a GPU each, or CPUs when
no GPU is present), one STRICT_PACK placement group per node. `RayWorkerGroup` starts one
actor of a worker class per bundle, gives each its rank, world size and the rendezvous
address (picked on the node of bundle 0), and exposes every `@register`ed method of the
class as a method of the group. Several groups can share one pool (the critic colocated
with the actor-rollout-ref worker): each actor takes 1/max_colocate_count of its bundle.

A failed or killed rank makes the call raise at once with the group, rank, class and
method in the message; the group's other actors are killed, since they may be blocked in
a collective with the dead rank and would otherwise hang.
"""

from __future__ import annotations

import os

import ray
from ray.exceptions import RayActorError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybrid.controller.base import WorkerGroup
from workers.base import find_free_port, node_ip_address
from workers.engine_logs import ENGINE_LOG_DIR_ENV


class WorkerFailedError(RuntimeError):
    pass


class RayResourcePool:
    def __init__(self, nnodes: int, slots_per_node: int, use_gpu: bool, cpus_per_slot: float = 1.0,
                 max_colocate_count: int = 1, name: str = "global_pool", wait_timeout_s: float = 120.0):
        self.nnodes = int(nnodes)
        self.slots_per_node = int(slots_per_node)
        self.use_gpu = use_gpu
        self.cpus_per_slot = float(cpus_per_slot)
        self.max_colocate_count = max(int(max_colocate_count), 1)
        bundle = {"CPU": self.cpus_per_slot, **({"GPU": 1} if use_gpu else {})}
        self.placement_groups = [
            placement_group([dict(bundle) for _ in range(self.slots_per_node)], strategy="STRICT_PACK", name=f"{name}_node{n}")
            for n in range(self.nnodes)
        ]
        ready = [pg.ready() for pg in self.placement_groups]
        # verl's trainer.ray_wait_register_center_timeout bounds the same wait: the cluster
        # coming up with every worker's resources.
        done, _ = ray.wait(ready, num_returns=len(ready), timeout=wait_timeout_s)
        if len(done) != len(ready):
            raise RuntimeError(
                f"Ray could not reserve {self.nnodes} node(s) x {self.slots_per_node} slot(s) of {bundle} within "
                f"{wait_timeout_s:g} s (trainer.ray_wait_register_center_timeout); cluster resources: "
                f"{ray.cluster_resources()}. Lower trainer.nnodes / trainer.n_gpus_per_node, or wait longer."
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.slots_per_node

    def slots(self):
        """(placement group, bundle index, local rank) for every rank in order."""
        for pg in self.placement_groups:
            for index in range(self.slots_per_node):
                yield pg, index, index

    def remove(self) -> None:
        for pg in self.placement_groups:
            remove_placement_group(pg)


@ray.remote(num_cpus=0)
def _rendezvous_address() -> tuple[str, int]:
    return node_ip_address(), find_free_port()


class RayWorkerGroup(WorkerGroup):
    def __init__(self, resource_pool: RayResourcePool, worker_cls, *args, name: str = "workers",
                 threads_per_rank: int | None = None, env: dict | None = None, **kwargs):
        self.name = name
        self.worker_cls = worker_cls
        self.world_size = resource_pool.world_size
        first_pg = resource_pool.placement_groups[0]
        master_addr, master_port = ray.get(
            _rendezvous_address.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(first_pg, placement_group_bundle_index=0)
            ).remote()
        )
        share = 1.0 / resource_pool.max_colocate_count
        threads = threads_per_rank or max(int(resource_pool.cpus_per_slot), 1)
        remote_cls = ray.remote(worker_cls)
        self.workers = []
        for rank, (pg, bundle_index, local_rank) in enumerate(resource_pool.slots()):
            env_vars = {
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(local_rank),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "OMP_NUM_THREADS": str(threads),
                "TOKENIZERS_PARALLELISM": "false",
                **{k: str(v) for k, v in (env or {}).items()},
            }
            for name in ("HYBRID_DEVICE", ENGINE_LOG_DIR_ENV, "HYBRID_DEBUG"):
                if os.environ.get(name):
                    env_vars[name] = os.environ[name]
            options = {
                "num_cpus": resource_pool.cpus_per_slot * share,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle_index),
                "runtime_env": {"env_vars": env_vars},
                "name": f"{name}_rank{rank}_{master_port}",
            }
            if resource_pool.use_gpu:
                options["num_gpus"] = share
            self.workers.append(remote_cls.options(**options).remote(*args, **kwargs))
        self._bind_worker_methods(worker_cls)
        # Construction joins the process group: wait for it, so failures surface here.
        self._execute("ping", [((), {})] * self.world_size)

    def _execute(self, method_name: str, per_rank_calls):
        refs = [getattr(w, method_name).remote(*a, **kw) for w, (a, kw) in zip(self.workers, per_rank_calls)]
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=None)
            for ref in done:
                try:
                    ray.get(ref)
                except RayError as err:
                    self.kill()
                    kind = "died" if isinstance(err, RayActorError) else "raised"
                    raise WorkerFailedError(
                        f"worker group {self.name!r}: rank {rank_of[ref]} ({self.worker_cls.__name__}) {kind} "
                        f"in {method_name}(): {err}"
                    ) from err
        return ray.get(refs)

    def kill(self) -> None:
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except RayError:
                pass  # already dead: that is what we wanted

    def shutdown(self) -> None:
        self.kill()
        self.workers = []
