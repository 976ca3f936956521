"""Where the Ray workers run, decided from the cluster, and the check of where they landed.

Whether the ranks (and the asynchronous engines) ask Ray for GPUs follows the cluster's
nodes, as `ray.nodes()` records them, not whether the driver's own process sees a GPU: a
driver on a head node without one must still place its ranks on the GPU nodes. The run held
to the CPU (`trainer.device=cpu`, or HYBRID_DEVICE=cpu) takes CPU bundles whatever the cluster
has; `trainer.device=cuda` on a cluster without a GPU, and a cluster with fewer GPUs than the
run asks for, are refused at start in one line naming the keys and the numbers.

At start every rank reports its device (workers/base.py `Worker.process_info`); two ranks of
one group on one GPU (the same uuid) end the run in one line naming the ranks, the node and
the device. CPU ranks share "cpu" by design and are not checked.

Pure functions over recorded values; the Ray calls are the callers' (hybrid/roles.py,
hybrid/controller/ray_worker_group.py, hybrid/engines.py).
"""

from __future__ import annotations

from dataclasses import dataclass

RAY_GPU = "GPU"  # Ray's resource name for NVIDIA GPUs


def node_gpus(nodes: list[dict]) -> list[int]:
    """GPUs of each live node, from `ray.nodes()` records ('Alive', 'Resources')."""
    return [int(node["Resources"].get(RAY_GPU, 0)) for node in nodes if node.get("Alive", True)]


@dataclass(frozen=True)
class GpuAsk:
    """`groups` reservations of `size` GPUs, each on one node, set by the config's `keys`."""

    keys: str
    groups: int
    size: int

    @property
    def total(self) -> int:
        return self.groups * self.size


def gpu_asks(config) -> list[GpuAsk]:
    """What the run asks of the cluster: the training group (`trainer.nnodes` placement groups
    of `trainer.n_gpus_per_node`, each on one node), and in asynchronous training the engines
    of their own (`rollout.nnodes x rollout.n_gpus_per_node` devices in engines of
    `tensor_model_parallel_size` GPUs on one node each). Remote engines and the simulated
    trainer's absent ranks ask for none."""
    trainer = config.trainer
    asks = []
    if not (config.async_mode is not None and config.async_training.simulate_training is True):
        asks.append(
            GpuAsk(
                f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node}",
                trainer.nnodes,
                trainer.n_gpus_per_node,
            )
        )
    rollout = config.actor_rollout_ref.rollout
    if config.async_mode is not None and not rollout.remote.enabled and config.rollout.devices:
        tp = int(rollout.tensor_model_parallel_size)
        asks.append(
            GpuAsk(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} with rollout.nnodes="
                f"{config.rollout.nnodes} x rollout.n_gpus_per_node={config.rollout.n_gpus_per_node}",
                config.rollout.devices // tp,
                tp,
            )
        )
    return asks


def uses_gpus(gpus_per_node: list[int], forced_cpu: bool, device: str) -> bool:
    """GPU bundles (True) or CPU ones, for a cluster whose nodes hold `gpus_per_node` GPUs,
    under `trainer.device` (`device`) and the run's CPU switch (`forced_cpu`)."""
    if forced_cpu or device == "cpu":
        return False
    has_gpus = sum(gpus_per_node) > 0
    if device == "cuda" and not has_gpus:
        raise ValueError(
            f"trainer.device=cuda needs GPUs and the Ray cluster has none (GPUs per node: {gpus_per_node}); "
            "use trainer.device=auto or cpu, or join a cluster with GPUs (RAY_ADDRESS)"
        )
    return has_gpus


def check_gpus_fit(gpus_per_node: list[int], asks: list[GpuAsk]) -> None:
    """Refuse, in one line naming the keys and the numbers, a cluster that cannot hold `asks`:
    fewer GPUs in all than asked, or not enough nodes with room for each reservation. Only
    what no placement could satisfy is refused (a busy cluster is Ray's wait to report)."""
    total, asked = sum(gpus_per_node), sum(ask.total for ask in asks)
    if asked > total:
        what = " plus ".join(f"{ask.keys} ({ask.total})" for ask in asks)
        raise ValueError(
            f"{what} ask for {asked} GPUs and the Ray cluster has {total} (GPUs per node: {gpus_per_node}); "
            "lower the counts or add GPU nodes"
        )
    for ask in asks:
        room = sum(count // ask.size for count in gpus_per_node) if ask.size else ask.groups
        if room < ask.groups:
            raise ValueError(
                f"{ask.keys}: {ask.groups} reservation(s) of {ask.size} GPUs, each on one node, and the Ray "
                f"cluster's nodes hold {room} (GPUs per node: {gpus_per_node})"
            )


def _device_key(report: dict):
    """One physical device: the GPU's uuid, else (node, type, index)."""
    if report.get("device_uuid"):
        return report["device_uuid"]
    return (report.get("node_id") or report.get("node_ip"), report["device"], report.get("device_index"))


def shared_devices(reports: list[dict]) -> list[list[int]]:
    """Ranks (in rank order, two or more each) that report one GPU; CPU ranks never count."""
    ranks_of: dict = {}
    for rank, report in enumerate(reports):
        if report.get("device", "cpu") == "cpu":
            continue
        ranks_of.setdefault(_device_key(report), []).append(rank)
    return [ranks for ranks in ranks_of.values() if len(ranks) > 1]


def device_clash(group: str, reports: list[dict]) -> str | None:
    """The one-line message for ranks of `group` sharing a GPU, or None when none do."""
    clashes = shared_devices(reports)
    if not clashes:
        return None
    parts = []
    for ranks in clashes:
        info = reports[ranks[0]]
        visible = info.get("visible_devices")
        parts.append(
            f"ranks {', '.join(map(str, ranks))} on node {info.get('node_ip')} share {info['device']}:"
            f"{info.get('device_index')} (uuid {info.get('device_uuid')}, CUDA_VISIBLE_DEVICES="
            f"{'unset' if visible is None else repr(visible)})"
        )
    return (
        f"worker group {group!r}: " + "; ".join(parts) + ". Every rank needs a GPU of its own; check "
        "trainer.n_gpus_per_node against the nodes' GPUs and what sets CUDA_VISIBLE_DEVICES on them"
    )
