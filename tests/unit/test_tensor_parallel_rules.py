"""Tensor-parallel rollout in the fused worker (`actor_rollout_ref.rollout.tensor_model_parallel_size`):
the refusals at start, one line each (hybrid/config/rules_parallel.py, the preflight's head check),
vLLM's head rules, and how a TP group's samples are shared out (workers/rollout/tensor_parallel.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hybrid.config import ConfigError, build_config, load_config, validate_config
from protocol.data_proto import DataProto
from workers.rollout.engine import engine_spec
from workers.rollout.tensor_parallel import TensorParallel, engine_kwargs, head_problem, own_samples

TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
TP2 = [f"{TP}=2", "trainer.n_gpus_per_node=2"]


def refusals(*overrides) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(list(overrides)))
    return [line.removeprefix("  - ") for line in str(err.value).splitlines()[1:]]


def test_tp2_on_two_ranks_of_one_node_validates():
    validate_config(load_config(TP2))
    validate_config(load_config([*TP2, "actor_rollout_ref.rollout.multi_turn.enable=true"]))


def test_an_engine_without_tensor_parallelism_is_refused():
    hf = engine_spec("hf")
    assert not hf.tensor_parallel and engine_spec("vllm").tensor_parallel
    assert refusals(*TP2, "actor_rollout_ref.rollout.name=hf") == [
        f"{TP}=2: actor_rollout_ref.rollout.name='hf' ({hf.description}) has no tensor parallelism; set it to 1, "
        "or actor_rollout_ref.rollout.name to vllm"
    ]


def test_groups_that_would_span_nodes_are_refused():
    assert refusals(f"{TP}=2", "trainer.n_gpus_per_node=1", "trainer.nnodes=2") == [
        f"{TP}=2 does not divide trainer.n_gpus_per_node=1: an engine's shards are consecutive ranks of one node"
    ]


def test_agent_loops_with_tp_are_refused():
    assert refusals(*TP2, "actor_rollout_ref.rollout.mode=async") == [
        f"actor_rollout_ref.rollout.mode=async with {TP}=2: the agent loops add requests as trajectories progress, "
        "and the shards of a tensor-parallel engine must schedule the same requests in lock step; set "
        f"actor_rollout_ref.rollout.mode=sync (multi_turn.enable runs the lock-step loop) or {TP}=1"
    ]


@pytest.mark.parametrize(
    "tp, heads, kv_heads, refused",
    [
        (2, 4, 2, None),  # the test model: both split
        (2, 4, None, None),  # no num_key_value_heads: as many as heads
        (4, 8, 2, None),  # fewer KV heads than shards, 4 a multiple of 2: repeated
        (8, 8, 1, None),  # multi-query
        (2, 9, 3, "heads"),  # SmolLM2-135M
        (3, 9, 3, None),
        (2, 4, 3, "kv"),  # 3 KV heads do not split over 2
        (4, 12, 3, "kv"),  # 4 is not a multiple of 3
    ],
)
def test_head_rule_is_vllms(tp, heads, kv_heads, refused):
    problem = head_problem(tp, heads, kv_heads, "M")
    if refused is None:
        assert problem is None
    elif refused == "heads":
        assert (
            problem == f"{TP}={tp} does not divide the {heads} attention heads of M; vLLM gives each shard whole heads"
        )
    else:
        assert problem == (
            f"{TP}={tp} does not fit the {kv_heads} key/value heads of M: vLLM splits them when {tp} divides them "
            f"and repeats them when {tp} is a multiple of them"
        )


def test_preflight_refuses_a_model_tp_cannot_split(tmp_path):
    from hybrid.preflight import Findings, check_model_settings

    folder = tmp_path / "smol"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_attention_heads": 9, "num_key_value_heads": 3})
    )
    found = Findings()
    check_model_settings(build_config([f"actor_rollout_ref.model.path={folder}", *TP2]), found)
    assert found.problems == [
        f"{TP}=2 does not divide the 9 attention heads of {str(folder)!r}; vLLM gives each shard whole heads"
    ]
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2})
    )
    found = Findings()
    check_model_settings(build_config([f"actor_rollout_ref.model.path={folder}", *TP2]), found)
    assert found.problems == []


def test_an_engine_outside_a_worker_group_is_whole(monkeypatch):
    """No process group (an engine actor, hybrid.serve): the whole engine, its shards vLLM's own
    worker processes (inside a Ray actor vLLM would pick its Ray executor, which CPUs lack). The
    test process may hold a group an earlier test made: the engine actor's case is one without."""
    import workers.rollout.tensor_parallel as tensor_parallel

    monkeypatch.setattr(tensor_parallel.dist, "is_initialized", lambda: False)
    assert engine_kwargs(1) == {"tensor_parallel_size": 1}
    assert engine_kwargs(2) == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


def _samples(last: list[bool]) -> DataProto:
    rows = len(last)
    return DataProto.from_dict(
        tensors={"responses": torch.arange(rows).unsqueeze(1), "step_wise_last": torch.tensor(last)},
        non_tensors={"uid": np.array([f"r{i}" for i in range(rows)], dtype=object)},
        meta_info={"n": 2},
    )


def test_each_member_returns_its_own_prompts_samples():
    whole = _samples([True] * 8).pop(batch_keys=["responses"], non_tensor_batch_keys=["uid"])
    parts = [own_samples(whole, TensorParallel(None, 2, rank)) for rank in (0, 1)]
    assert [p.batch["responses"].flatten().tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(parts[1].non_tensor_batch["uid"]) == ["r4", "r5", "r6", "r7"]
    assert own_samples(whole, None) is whole


def test_step_wise_samples_are_shared_by_trajectory():
    # Four trajectories of 1, 3, 2 and 1 turns: members take two trajectories each.
    whole = _samples([True, False, False, True, False, True, True])
    parts = [own_samples(whole, TensorParallel(None, 2, rank)) for rank in (0, 1)]
    assert [p.batch["responses"].flatten().tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6]]
    with pytest.raises(RuntimeError, match="returned 3 trajectories, which do not split evenly over its 2 ranks"):
        own_samples(_samples([True, True, True]), TensorParallel(None, 2, 0))


def _same_requests_rank(rank: int, port: int, results) -> None:
    import os

    import torch.distributed as dist

    from workers.rollout.tensor_parallel import check_same_requests

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for case, observation in (("same", [7, 8]), ("differ", [7, rank])):
        try:
            check_same_requests(2, [[1, 2, 3], [4, 5, *observation]], [6, 6], group=dist.group.WORLD)
            results[(case, rank)] = "passed"
        except RuntimeError as err:
            results[(case, rank)] = str(err)
    dist.destroy_process_group()


def test_shards_given_different_requests_stop_in_one_line():
    """Two gloo ranks (the group vLLM's TP coordinator would give): equal requests pass, an
    observation that differs by rank stops both ranks with the same line."""
    import multiprocessing

    from workers.base import find_free_port

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Manager().dict()
    port = find_free_port()
    procs = [ctx.Process(target=_same_requests_rank, args=(rank, port, results)) for rank in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    expected = (
        f"{TP}=2: the ranks of one tensor-parallel engine were given different requests for a turn (an environment, "
        "tool or interaction answered them differently); the shards must generate the same requests"
    )
    assert dict(results) == {
        ("same", 0): "passed",
        ("same", 1): "passed",
        ("differ", 0): expected,
        ("differ", 1): expected,
    }
