"""Sharded checkpoints across three ranks (gloo, one process each), where FSDP2's dim-0
shards are uneven (64 rows -> 22/22/20, LoRA rank 8 -> 3/3/2): every rank saves its own
shard after a real optimizer step, a fresh model and optimizer on the same three ranks load
them back bit for bit, and the merger rebuilds a Hugging Face folder whose logits equal the
sharded model's, for full fine-tuning and for LoRA (merged, and equal to the worker's own
`hf_model` export)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.integration.checkpoint_helpers import probe_batch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORLD = 3


def _build(model_dir: str, lora: bool):
    from transformers import AutoModelForCausalLM

    from hybrid.config import build_config
    from workers.fsdp_utils import build_optimizer
    from workers.model_loading import load_hf_model

    arr = build_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.model.lora_rank={8 if lora else 0}",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
            "actor_rollout_ref.actor.optim.lr=1e-2",
        ]
    ).actor_rollout_ref
    module, hf_config = load_hf_model(
        AutoModelForCausalLM,
        model_dir,
        arr.actor.fsdp_config,
        seed=0,
        trainable=True,
        lora_config=arr.model if lora else None,
    )
    optimizer = build_optimizer([p for p in module.parameters() if p.requires_grad], arr.actor.optim)
    return module, optimizer, hf_config


def _checkpointer(module, optimizer, hf_config, model_dir, lora):
    from transformers import AutoTokenizer

    from workers.checkpoint import FSDPCheckpointer
    from workers.lora import merged_state

    return FSDPCheckpointer(
        module,
        optimizer,
        None,
        hf_config,
        AutoTokenizer.from_pretrained(model_dir),
        model_dir,
        hf_state_fn=(lambda: merged_state(module)) if lora else None,
        tie_word_embeddings=True,
    )


def _rank_main(rank: int, port: int, model_dir: str, out_dir: str, probe: torch.Tensor) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for lora in (False, True):
            path = os.path.join(out_dir, "lora" if lora else "full", "actor")
            module, optimizer, hf_config = _build(model_dir, lora)
            loss = module(input_ids=probe, use_cache=False).logits.float().pow(2).mean()
            loss.backward()
            optimizer.step()
            _checkpointer(module, optimizer, hf_config, model_dir, lora).save(
                path, 1, ["model", "optimizer", "extra", "hf_model"]
            )
            with torch.no_grad():
                logits = module(input_ids=probe, use_cache=False).logits.float()
            if rank == 0:
                torch.save(logits, os.path.join(path, "..", "logits.pt"))

            fresh, fresh_opt, _ = _build(model_dir, lora)
            _checkpointer(fresh, fresh_opt, hf_config, model_dir, lora).load(path, ["model", "optimizer", "extra"])
            for (name, a), (_, b) in zip(module.state_dict().items(), fresh.state_dict().items()):
                local_a = a.to_local() if isinstance(a, DTensor) else a
                local_b = b.to_local() if isinstance(b, DTensor) else b
                assert torch.equal(local_a, local_b), f"rank {rank}: {name} differs after load"
            for index, state in optimizer.state_dict()["state"].items():
                for key, value in state.items():
                    other = fresh_opt.state_dict()["state"][index][key]
                    value = value.to_local() if isinstance(value, DTensor) else value
                    other = other.to_local() if isinstance(other, DTensor) else other
                    assert torch.equal(value, other), f"rank {rank}: optimizer {index}/{key} differs after load"
            with torch.no_grad():
                assert torch.equal(fresh(input_ids=probe, use_cache=False).logits.float(), logits)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def three_rank_checkpoints(tiny_model_dir, tokenizer, tmp_path_factory):
    from workers.base import find_free_port

    out = tmp_path_factory.mktemp("three_ranks")
    mp.spawn(
        _rank_main, args=(find_free_port(), tiny_model_dir, str(out), probe_batch(tokenizer)), nprocs=WORLD, join=True
    )
    return out


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_three_rank_checkpoint_merges_to_equal_logits(three_rank_checkpoints, kind, tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    from scripts.model_merger import main as merger_main

    actor = three_rank_checkpoints / kind / "actor"
    assert sorted(p.name for p in actor.glob("model_world_size_*")) == [
        f"model_world_size_3_rank_{r}.safetensors" for r in range(3)
    ]
    target = tmp_path / "hf"
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(target)]) == 0
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=probe_batch(tokenizer), use_cache=False).logits
    expected = torch.load(three_rank_checkpoints / kind / "logits.pt", weights_only=True)
    assert (logits - expected).abs().max().item() <= 1e-5
    # The workers' own full export at save time (hf_model) is the same model.
    assert (
        merger_main(
            [
                "test",
                "--backend",
                "fsdp",
                "--local_dir",
                str(actor),
                "--test_hf_dir",
                str(actor / "huggingface"),
                "--atol",
                "0",
            ]
        )
        == 0
    )
