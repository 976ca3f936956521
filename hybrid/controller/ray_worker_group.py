"""Worker groups on Ray: one actor per device slot, placed with placement groups.

`RayResourcePool` reserves `nnodes x slots_per_node` bundles (a GPU each, or CPUs, as the
caller decided from the cluster: hybrid/placement.py), one STRICT_PACK placement group per
node; the ranks of a CPU pool get the environment that hides every GPU from them.
`RayWorkerGroup` starts one actor of a worker class per bundle, gives each its rank, world
size and the rendezvous address (picked on the node of bundle 0), and exposes every
`@register`ed method of the class as a method of the group. At start each rank reports its
node and device; two ranks on one GPU end the run there (`hybrid.placement.device_clash`).
Several groups can share one pool (the critic colocated with the actor-rollout-ref worker):
each actor takes 1/max_colocate_count of its bundle.

A failed or killed rank makes the call raise at once with the group, rank, class and
method in the message; the group's other actors are killed, since they may be blocked in
a collective with the dead rank and would otherwise hang. For a rank whose process died
the message also names its node (recorded when the actor was placed) and the cause Ray
reports, cut to one line (`death_cause`); Ray's whole report stays on the error's
`__cause__`, which `HYBRID_DEBUG=1` prints. When a rank raises because its peer vanished
from a collective, the peer's death is reported, not the symptom.
"""

from __future__ import annotations

import os
import re

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybrid.controller.base import WorkerGroup
from hybrid.errors import debug_enabled
from hybrid.placement import device_clash
from workers.base import find_free_port, node_ip_address
from workers.device import cpu_only_env
from workers.engine_logs import ENGINE_LOG_DIR_ENV


class WorkerFailedError(RuntimeError):
    pass


# After one rank fails, how long the others may take to report that they died too: a rank
# whose peer was killed mid-collective raises a connection error a moment before Ray has
# noticed the death, and the death is the cause worth naming.
DEATH_GRACE_S = 5.0

_EXIT_TYPE = re.compile(r"Worker exit type: (\w+)(?: Worker exit detail: ([^.]*\.))?")
_NODE_ID = re.compile(r"Node Id: ([0-9a-f]+)")
_UNAVAILABLE = re.compile(r"is unavailable: ([^.]*)")
# A rank's process gone: the call in flight on a rank that Ray's memory monitor killed
# raises OutOfMemoryError (not a RayActorError); later calls to it raise ActorDiedError.
_DEATHS = (RayActorError, OutOfMemoryError)
_MEMORY = re.compile(r"Memory on the node \(IP: [^)]*\) was ([\d.]+ ?GB used / [\d.]+ ?GB limit)")


def death_cause(report: str) -> str:
    """Ray's report of a dead actor (`str(RayActorError)`, many lines) cut to the cause in
    one line of words, e.g. 'its node died (terminated expectedly: received SIGTERM)'."""
    if "because its node has died" in report:
        node = _NODE_ID.search(report)
        detail = next((line.strip() for line in report.splitlines() if "the actor's node was" in line), "")
        detail = detail.replace("the actor's node was ", "")
        return f"its node{' ' + node.group(1)[:8] if node else ''} died" + (f" ({detail})" if detail else "")
    if "killed by `ray.kill`" in report:
        return "it was killed with ray.kill"
    exit_type = _EXIT_TYPE.search(report)
    kind = exit_type.group(1) if exit_type else ""
    if kind == "NODE_OUT_OF_MEMORY" or "running low on memory" in report:
        memory = _MEMORY.search(report)
        return "out of memory: Ray's memory monitor killed it" + (
            f" (memory on the node was {memory.group(1)})" if memory else ""
        )
    if kind == "SYSTEM_ERROR":
        return (
            "its process ended without warning: killed by a signal (SIGKILL, the kernel's out-of-memory "
            "killer) or crashed; Ray saw only its connection close"
        )
    if kind:
        detail = exit_type.group(2) or ""
        return f"its process exited ({kind.lower().replace('_', ' ')}{': ' + detail if detail else ''})"
    if "because its owner has died" in report:
        return "its owner (the driver process) died"
    if "never ran" in report:
        return "it never started (cancelled before it ran)"
    unavailable = _UNAVAILABLE.search(report)
    if unavailable:
        return f"it became unreachable ({unavailable.group(1).strip()})"
    lines = [line.strip() for line in report.splitlines() if line.strip() and not line.startswith("\t")]
    return lines[-1] if lines else "Ray gave no reason"


# Worker processes of this driver's groups: Ray's paragraph about their death is replaced
# by our one line (WorkerFailedError).
_OWN_WORKER_PIDS: set[int] = set()
_WORKER_DIED = re.compile(r"A worker died or was killed while executing a task.*Worker PID: (\d+)", re.S)


def is_own_death_report(line: str) -> bool:
    """True for the raylet's report that one of our ranks' processes died."""
    match = _WORKER_DIED.search(line)
    return bool(match) and int(match.group(1)) in _OWN_WORKER_PIDS


def quiet_rays_death_reports() -> None:
    """Keep Ray's driver from printing its paragraph (on stdout) when one of our ranks dies:
    the run's `hybrid:` line names the rank, node and cause, and HYBRID_DEBUG=1 shows Ray's
    report. Ray prints it from a thread through `ray._private.worker.print_to_stdstream`, a
    private function: if it is not there (another Ray version) nothing is changed."""
    import ray._private.worker as ray_worker

    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "hybrid_quiet", False) or debug_enabled():
        return

    def print_to_stdstream(data, *args, **kwargs):
        lines = data["lines"] if isinstance(data, dict) and data.get("pid") == "raylet" else None
        if lines and all(is_own_death_report(line) for line in lines):
            return None
        return original(data, *args, **kwargs)

    print_to_stdstream.hybrid_quiet = True
    ray_worker.print_to_stdstream = print_to_stdstream


def _place(info: dict | None, report: str) -> str:
    """'node <ip> (id <id>, pid <pid>)' for a rank, from what it said at placement or,
    failing that (it died while starting), Ray's report."""
    if info:
        node_id = f"id {info['node_id'][:8]}, " if info["node_id"] else ""
        return f"node {info['node_ip']} ({node_id}pid {info['pid']})"
    ip = re.search(r"\bip: (\S+)", report)
    return f"node {ip.group(1)}" if ip else "an unknown node"


class RayResourcePool:
    def __init__(
        self,
        nnodes: int,
        slots_per_node: int,
        use_gpu: bool,
        cpus_per_slot: float = 1.0,
        max_colocate_count: int = 1,
        name: str = "global_pool",
        wait_timeout_s: float = 120.0,
    ):
        self.nnodes = int(nnodes)
        self.slots_per_node = int(slots_per_node)
        self.use_gpu = use_gpu
        self.cpus_per_slot = float(cpus_per_slot)
        self.max_colocate_count = max(int(max_colocate_count), 1)
        bundle = {"CPU": self.cpus_per_slot, **({"GPU": 1} if use_gpu else {})}
        self.placement_groups = [
            placement_group(
                [dict(bundle) for _ in range(self.slots_per_node)], strategy="STRICT_PACK", name=f"{name}_node{n}"
            )
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
    def __init__(
        self,
        resource_pool: RayResourcePool,
        worker_cls,
        *args,
        name: str = "workers",
        threads_per_rank: int | None = None,
        env: dict | None = None,
        **kwargs,
    ):
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
            if not resource_pool.use_gpu:
                # Ray (2.60 on) leaves an actor that asked for no GPU every GPU of its node.
                env_vars.update(cpu_only_env())
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
        self.placement: list[dict | None] = [None] * self.world_size
        # Construction joins the process group: wait for it, so failures surface here. Each
        # rank also says where it runs, for the message should it die later.
        self.placement = self._execute("process_info", [((), {})] * self.world_size)
        _OWN_WORKER_PIDS.update(info["pid"] for info in self.placement)
        clash = device_clash(self.name, self.placement)
        if clash is not None:
            self.kill()
            raise WorkerFailedError(clash)
        quiet_rays_death_reports()

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
                    rank, err = self._first_death(rank_of[ref], err, pending, rank_of)
                    self.kill()
                    raise self._failure(rank, method_name, err) from err
        return ray.get(refs)

    def _first_death(self, rank: int, err: RayError, pending: list, rank_of: dict) -> tuple[int, RayError]:
        """(rank, error) to report: `err` itself when it is a death, else a death among the
        other ranks within DEATH_GRACE_S, else `err` (a rank that raised on its own)."""
        if isinstance(err, _DEATHS) or not pending:
            return rank, err
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
        for ref in done:
            try:
                ray.get(ref)
            except _DEATHS as death:
                return rank_of[ref], death
            except RayError:
                pass
        return rank, err

    def _failure(self, rank: int, method_name: str, err: RayError) -> WorkerFailedError:
        who = f"worker group {self.name!r}: rank {rank} ({self.worker_cls.__name__})"
        if not isinstance(err, _DEATHS):
            return WorkerFailedError(f"{who} raised in {method_name}(): {err}")
        # its constructor raised: that traceback is the message
        if isinstance(err, RayActorError) and err.actor_init_failed:
            return WorkerFailedError(f"{who} failed to start: {err}")
        report = str(err)
        return WorkerFailedError(
            f"{who} died in {method_name}() on {_place(self.placement[rank], report)}: {death_cause(report)}. "
            "The run cannot go on without it; HYBRID_DEBUG=1 shows Ray's whole report."
        )

    def kill(self) -> None:
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except RayError:
                pass  # already dead: that is what we wanted

    def shutdown(self) -> None:
        self.kill()
        self.workers = []
