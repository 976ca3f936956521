"""Hybrid-sharded FSDP (verl's `fsdp_config.fsdp_size` below the world size) on two gloo
ranks, one process each: with fsdp_size=1 the model sits on a 2-D mesh (2 replica groups x 1
shard rank, placements (Replicate(), Shard(0))) and one optimizer step through the shared
update loop (workers/optimizer_step.py; each rank its own rows, the gradient clipped) gives
the same loss, gradient norm and gathered weights as full sharding (fsdp_size=-1) to 1e-6.
A checkpoint saved on the 2-D mesh loads back bit for bit, records its shard group size,
merges from one group's shards, and refuses to load into another layout."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [pytest.mark.integration]

WORLD = 2


def _build(model_dir: str, fsdp_size: int):
    from transformers import AutoModelForCausalLM

    from hybrid.config import build_config
    from workers.fsdp_utils import build_optimizer
    from workers.model_loading import load_hf_model

    actor = build_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
            "actor_rollout_ref.actor.optim.lr=1e-2",
        ]
    ).actor_rollout_ref.actor
    module, hf_config = load_hf_model(
        AutoModelForCausalLM, model_dir, actor.fsdp_config, seed=0, trainable=True, fsdp_size=fsdp_size
    )
    return module, build_optimizer(list(module.parameters()), actor.optim), hf_config


def _rows(rank: int, vocab: int):
    """This rank's rows (each rank different): token ids and a mask of varying lengths."""
    from protocol.data_proto import DataProto

    gen = torch.Generator().manual_seed(11 + rank)
    ids = torch.randint(0, vocab, (4, 10), generator=gen)
    mask = (torch.arange(10).unsqueeze(0) < torch.tensor([[10], [7], [4], [9]])).long()
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": mask}
    )


def _step(module, optimizer, data) -> dict[str, float]:
    """One optimizer step of next-token log-likelihood, token-mean over both ranks' rows."""
    from workers.config.batching import MicroBatching
    from workers.optimizer_step import OptimizerStep, UpdatePlan

    def nll(micro, weight, counts):
        logits = module(input_ids=micro["input_ids"], use_cache=False).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, micro["input_ids"][:, 1:, None]).squeeze(-1)
        mask = micro["response_mask"][:, 1:].float()
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        return loss, {"loss": float(loss) * weight}

    plan = UpdatePlan(
        samples_per_rank=4, epochs=1, shuffle=False, seed=0, micro=MicroBatching(2, False, 0), seq_level=False
    )
    return OptimizerStep(module, optimizer, None, 1.0, "actor").run(data, list(data.batch.keys()), plan, nll)


def _full_weights(module) -> dict[str, torch.Tensor]:
    from workers.weight_sync import iter_full_weights

    return {name: t.clone() for name, t in iter_full_weights(module.state_dict(), torch.float32, 1 << 20, False)}


def _checkpoint_round_trip(module, optimizer, hf_config, model_dir: str, path: str, rank: int) -> dict:
    from torch.distributed.tensor import DTensor
    from transformers import AutoTokenizer

    from workers.checkpoint import FSDPCheckpointer, read_meta

    def checkpointer(m, o):
        return FSDPCheckpointer(m, o, None, hf_config, AutoTokenizer.from_pretrained(model_dir), model_dir)

    checkpointer(module, optimizer).save(path, 1, ["model", "optimizer", "extra"])
    fresh, fresh_opt, _ = _build(model_dir, fsdp_size=1)
    checkpointer(fresh, fresh_opt).load(path, ["model", "optimizer", "extra"])
    for (name, a), (_, b) in zip(module.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a.to_local(), b.to_local()), f"rank {rank}: {name} differs after load"
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            other = fresh_opt.state_dict()["state"][index][key]
            if isinstance(value, DTensor):
                value, other = value.to_local(), other.to_local()
            assert torch.equal(value, other), f"rank {rank}: optimizer {index}/{key} differs after load"
    full_layout, _, _ = _build(model_dir, fsdp_size=-1)
    try:
        checkpointer(full_layout, None).load(path, ["model"])
        refusal = ""
    except ValueError as exc:
        refusal = str(exc)
    return {"meta": read_meta(path), "refusal": refusal}


def _rank_main(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        results = {}
        for fsdp_size in (-1, 1):
            module, optimizer, hf_config = _build(model_dir, fsdp_size)
            placements = {tuple(p.placements) for p in module.parameters()}
            before = _full_weights(module)
            metrics = _step(module, optimizer, _rows(rank, hf_config.vocab_size))
            results[fsdp_size] = {
                "placements": placements,
                "metrics": metrics,
                "weights": _full_weights(module),
                "before": before,
            }
        path = os.path.join(out_dir, "actor")
        results["checkpoint"] = _checkpoint_round_trip(module, optimizer, hf_config, model_dir, path, rank)
        if rank == 0:
            from hybrid.model_merge import ShardedCheckpoint

            merged = ShardedCheckpoint(path)
            results["merged"] = {name: merged.full(name) for name in merged.names()}
            assert results[-1]["placements"] == {(Shard(0),)}
            assert results[1]["placements"] == {(Replicate(), Shard(0))}
            torch.save(results, os.path.join(out_dir, "results.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tiny_model_dir, tmp_path_factory):
    from workers.base import find_free_port

    out = tmp_path_factory.mktemp("hsdp")
    mp.spawn(_rank_main, args=(find_free_port(), tiny_model_dir, str(out)), nprocs=WORLD, join=True)
    return torch.load(out / "results.pt", weights_only=False)


def test_replicated_groups_train_as_full_sharding(two_rank_results):
    full, hsdp = two_rank_results[-1], two_rank_results[1]
    for key in ("loss", "actor/grad_norm"):
        assert abs(full["metrics"][key] - hsdp["metrics"][key]) <= 1e-6, key
    assert full["metrics"]["actor/grad_norm"] > 1.0  # the clip (at 1.0) took part
    assert full["weights"].keys() == hsdp["weights"].keys()
    apart = max((full["weights"][k] - hsdp["weights"][k]).abs().max().item() for k in full["weights"])
    assert apart <= 1e-6
    moved = max((full["weights"][k] - full["before"][k]).abs().max().item() for k in full["weights"])
    assert moved > 1e-3  # the step changed the weights (lr 1e-2): equal means equal updates


def test_checkpoint_on_the_2d_mesh(two_rank_results):
    checkpoint = two_rank_results["checkpoint"]
    assert checkpoint["meta"]["shard_group_size"] == 1 and checkpoint["meta"]["world_size"] == 2
    weights = two_rank_results[1]["weights"]
    merged = two_rank_results["merged"]
    for name, tensor in merged.items():  # lm_head is tied: stored once, as the embedding
        assert torch.equal(tensor, weights[name]), name
    assert checkpoint["refusal"].endswith(
        "was saved with shard groups of 1 ranks and this run shards over 2 (fsdp_config.fsdp_size); resume with the "
        "same fsdp_size, or merge it into a Hugging Face folder and start from that"
    )
