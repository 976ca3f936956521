"""Placement by the cluster (hybrid/placement.py) and the device helper's placement parts
(workers/device.py): GPU bundles follow the cluster's nodes, not the driver's process; a
cluster short of GPUs is refused in one line naming the keys and the numbers; two ranks on
one GPU are named; a tensor goes to the device before an NCCL collective and stays put under
gloo. The node records are Ray 2.60's `ray.nodes()` (the CPU head recorded on this machine;
the GPU node the same record with the resources a GPU raylet registers)."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid.config import load_config, typed_config
from hybrid.placement import GpuAsk, check_gpus_fit, device_clash, gpu_asks, node_gpus, shared_devices, uses_gpus
from workers import device
from workers.weight_sync import collect_full_weights, iter_full_weights

CPU_HEAD = {
    "NodeID": "962c1273ddc23f4e103632b6cc9afc6014994f709ac70052fa9072ae",
    "Alive": True,
    "NodeManagerAddress": "192.0.2.2",
    "NodeName": "192.0.2.2",
    "Resources": {
        "node:192.0.2.2": 1.0,
        "CPU": 2.0,
        "object_store_memory": 7433803776.0,
        "memory": 17345542144.0,
        "node:__internal_head__": 1.0,
    },
}


def gpu_node(ip: str, gpus: float, alive: bool = True) -> dict:
    node = copy.deepcopy(CPU_HEAD)
    node.update(NodeManagerAddress=ip, NodeName=ip, Alive=alive)
    node["Resources"] = {
        f"node:{ip}": 1.0,
        "CPU": 16.0,
        "GPU": gpus,
        "accelerator_type:H100": 1.0,
        "memory": 1.0e11,
        "object_store_memory": 3.0e10,
    }
    return node


def test_node_gpus_counts_live_nodes_only():
    nodes = [CPU_HEAD, gpu_node("192.0.2.3", 8.0), gpu_node("192.0.2.4", 8.0, alive=False)]
    assert node_gpus(nodes) == [0, 8]


def test_a_head_without_a_gpu_places_on_the_gpu_nodes():
    gpus = node_gpus([CPU_HEAD, gpu_node("192.0.2.3", 8.0)])
    # The driver's own process sees no GPU here (this machine has none): the cluster decides.
    assert not torch.cuda.is_available()
    assert uses_gpus(gpus, forced_cpu=False, device="auto") is True
    assert uses_gpus(gpus, forced_cpu=False, device="cuda") is True


def test_cpu_is_forced_by_the_switch_or_trainer_device():
    gpus = [0, 8]
    assert uses_gpus(gpus, forced_cpu=True, device="auto") is False
    assert uses_gpus(gpus, forced_cpu=False, device="cpu") is False
    assert uses_gpus([0], forced_cpu=False, device="auto") is False


def test_trainer_device_cuda_on_a_cluster_without_gpus_is_refused():
    with pytest.raises(ValueError) as err:
        uses_gpus(node_gpus([CPU_HEAD]), forced_cpu=False, device="cuda")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("trainer.device=cuda needs GPUs and the Ray cluster has none (GPUs per node: [0])")


def test_asks_of_a_synchronous_and_an_asynchronous_run():
    sync = typed_config(
        load_config(
            [
                "trainer.nnodes=2",
                "trainer.n_gpus_per_node=8",
                "data.train_batch_size=32",
                "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            ]
        )
    )
    assert gpu_asks(sync) == [GpuAsk("trainer.nnodes=2 x trainer.n_gpus_per_node=8", 2, 8)]
    one_off = typed_config(
        load_config(
            [
                "actor_rollout_ref.hybrid_engine=false",
                "rollout.nnodes=1",
                "rollout.n_gpus_per_node=1",
                "async_training.mode=one_step_off",
            ]
        )
    )
    assert [(a.groups, a.size) for a in gpu_asks(one_off)] == [(1, 1), (1, 1)]
    assert gpu_asks(one_off)[1].keys.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size=1 with ")


def test_too_few_gpus_in_all_is_refused_in_one_line():
    asks = [GpuAsk("trainer.nnodes=2 x trainer.n_gpus_per_node=8", 2, 8)]
    with pytest.raises(ValueError) as err:
        check_gpus_fit([0, 8], asks)
    assert str(err.value) == (
        "trainer.nnodes=2 x trainer.n_gpus_per_node=8 (16) ask for 16 GPUs and the Ray cluster has 8 "
        "(GPUs per node: [0, 8]); lower the counts or add GPU nodes"
    )
    check_gpus_fit([0, 8, 8], asks)  # fits: nothing raised
    check_gpus_fit([0, 16], asks)  # two placement groups may share a node of 16


def test_enough_gpus_on_too_small_nodes_is_refused():
    asks = [GpuAsk("trainer.nnodes=2 x trainer.n_gpus_per_node=8", 2, 8)]
    with pytest.raises(ValueError) as err:
        check_gpus_fit([4, 4, 8], asks)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("trainer.nnodes=2 x trainer.n_gpus_per_node=8: 2 reservation(s) of 8 GPUs")
    assert "nodes hold 1 (GPUs per node: [4, 4, 8])" in message


def test_engines_count_beside_the_trainer():
    asks = [
        GpuAsk("trainer.nnodes=1 x trainer.n_gpus_per_node=4", 1, 4),
        GpuAsk("actor_rollout_ref.rollout.tensor_model_parallel_size=2 with rollout.nnodes=1 x ...=4", 2, 2),
    ]
    check_gpus_fit([8], asks)
    with pytest.raises(ValueError, match=r"ask for 8 GPUs and the Ray cluster has 6 \(GPUs per node: \[6\]\)"):
        check_gpus_fit([6], asks)
    # Engines of 2 GPUs on nodes of 1 GPU each (the simulated trainer: no training ranks).
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2 .*: 2 reservation\(s\) of 2 GPUs.*hold 0"):
        check_gpus_fit([1, 1, 1, 1], asks[1:])


def report(rank: int, node: str, index: int | None, uuid: str | None, kind: str = "cuda") -> dict:
    """A rank's `process_info`, as recorded from workers/base.Worker."""
    return {
        "pid": 1000 + rank,
        "node_ip": node,
        "node_id": f"id-{node}",
        "hostname": f"host-{node}",
        "device": kind,
        "device_index": index,
        "device_uuid": uuid,
        "visible_devices": None if kind == "cpu" else "",
    }


def test_ranks_on_distinct_gpus_pass():
    reports = [report(r, "192.0.2.3", 0, f"GPU-{r}") for r in range(4)]  # each sees its GPU as index 0
    assert shared_devices(reports) == []
    assert device_clash("actor_rollout", reports) is None


def test_two_ranks_on_one_gpu_are_named_with_node_and_device():
    reports = [report(0, "192.0.2.3", 0, "GPU-a"), report(1, "192.0.2.3", 0, "GPU-a"), report(2, "192.0.2.4", 0, "b")]
    assert shared_devices(reports) == [[0, 1]]
    message = device_clash("actor_rollout", reports)
    assert "\n" not in message
    assert message.startswith(
        "worker group 'actor_rollout': ranks 0, 1 on node 192.0.2.3 share cuda:0 (uuid GPU-a, CUDA_VISIBLE_DEVICES='')"
    )


def test_without_uuids_a_device_is_its_node_and_index():
    reports = [report(0, "192.0.2.3", 1, None), report(1, "192.0.2.4", 1, None), report(2, "192.0.2.3", 1, None)]
    assert shared_devices(reports) == [[0, 2]]


def test_cpu_ranks_share_the_cpu_legitimately():
    reports = [report(r, "192.0.2.2", None, None, kind="cpu") for r in range(3)]
    assert shared_devices(reports) == []


def test_this_process_reports_the_cpu():
    info = device.device_report()
    assert info["device"] == device.get_device_name() == "cpu"
    assert info["device_index"] is None and info["device_uuid"] is None


def test_cpu_only_env_hides_every_gpu():
    assert device.cpu_only_env() == {"HYBRID_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    device.cpu_only_env()["HYBRID_DEVICE"] = "x"  # a copy: the constant stays
    assert device.CPU_ONLY_ENV["HYBRID_DEVICE"] == "cpu"


@pytest.mark.parametrize(
    "where, backend, target",
    [("cpu", "nccl", "cuda"), ("cuda", "nccl", None), ("cpu", "gloo", None), ("cuda", "gloo", None)],
)
def test_where_a_tensor_must_go_before_a_collective(where, backend, target):
    assert device.collective_target(where, backend) == target


def test_for_collective_on_the_cpu_moves_nothing():
    tensor = torch.arange(4.0)
    assert device.for_collective(tensor) is tensor


def test_collect_full_weights_keeps_host_copies_equal_to_the_gathered():
    torch.manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(8, 4), "model.norm.weight": torch.randn(4)}
    gathered = list(iter_full_weights(state, torch.float32, bucket_bytes=16, tie_word_embeddings=True))
    kept = collect_full_weights(state, torch.float32, bucket_bytes=16, tie_word_embeddings=True, keep=True)
    assert [name for name, _ in kept] == [name for name, _ in gathered]
    assert [name for name, _ in kept][-1] == "lm_head.weight"
    for (_, mine), (_, theirs) in zip(kept, gathered):
        assert mine.device == device.host_device()
        assert torch.equal(mine, theirs)
    # Not the live parameters: a later update does not reach the kept pairs.
    state["model.norm.weight"].add_(1.0)
    assert not torch.equal(dict(kept)["model.norm.weight"], state["model.norm.weight"])
    assert collect_full_weights(state, torch.bfloat16, 16, True, keep=False) is None


def test_clip_grad_norm_equals_torchs_on_a_plain_module():
    from workers.optimizer_step import clip_grad_norm

    def model_with_grads():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        model(torch.randn(4, 6)).pow(2).sum().backward()
        return model

    ours, theirs = model_with_grads(), model_with_grads()
    norm = clip_grad_norm(ours.parameters(), max_norm=0.1)
    reference = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm=0.1)
    assert float(reference) > 0.1  # the clip acts
    assert torch.equal(norm, reference)
    for mine, other in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(mine.grad, other.grad)


def test_roles_asks_the_cluster_not_the_driver(monkeypatch):
    """hybrid/roles.ray_uses_gpus reads `ray.nodes()`: GPU bundles for a GPU cluster seen from
    this GPU-less process, the refusal for a short one, CPU under trainer.device=cpu."""
    import ray

    from hybrid.roles import ray_uses_gpus

    def config(*overrides):
        return typed_config(
            load_config(
                ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32"] + list(overrides)
            )
        )

    monkeypatch.delenv("HYBRID_DEVICE", raising=False)
    monkeypatch.setattr(ray, "nodes", lambda: [CPU_HEAD, gpu_node("192.0.2.3", 8.0)])
    assert ray_uses_gpus(config("trainer.n_gpus_per_node=8")) is True
    with pytest.raises(ValueError, match=r"^trainer.nnodes=2 x trainer.n_gpus_per_node=8 \(16\) ask for 16 GPUs"):
        ray_uses_gpus(config("trainer.nnodes=2", "trainer.n_gpus_per_node=8"))
    monkeypatch.setenv("HYBRID_DEVICE", "cpu")
    assert ray_uses_gpus(config("trainer.nnodes=2", "trainer.n_gpus_per_node=8")) is False


@pytest.mark.parametrize(
    "local_ranks, gpus, shared",
    [([0, 1], 2, []), ([0, 1], 1, [[0, 1]]), ([0, 0], 8, [[0, 1]]), ([0, 1, 2], 2, [[0, 2]]), ([0, 0], 0, [])],
)
def test_gpu_check_expects_the_sharing_a_worker_would_get(local_ranks, gpus, shared):
    """scripts/gpu_check_placement.expected_sharing: a worker takes GPU local_rank % GPUs."""
    from scripts.gpu_check_placement import expected_sharing

    assert expected_sharing(local_ranks, gpus) == shared
