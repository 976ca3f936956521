"""trainer.pad_mini_batches on two gloo ranks, one process each: mini-batches of 3 samples,
which do not split over 2 ranks, padded with one zero-mask dummy row each (hybrid/batch_ops.py,
as SkyRL's MeshDispatch.stage_chunks) and split as the dispatcher splits them, train through the
actor's real update (workers/actor.py: PPO loss, KL loss, entropy bonus, gradient clipping) to
the same metrics, gradient norm and weights as the unpadded batch on one rank, a plain
transformers model with no FSDP and no dummies, within 1e-6 in fp32: for token-mean and
seq-mean-token-mean, two optimizer steps each (the second starts from the first's weights)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = [pytest.mark.integration]

WORLD = 2
MINI = 3  # samples per optimizer step: 2 mini-batches of 3 in a batch of 6
MODES = ("token-mean", "seq-mean-token-mean")
TOL = 1e-6


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    """6 samples: left-padded prompts (width 4), responses of 1 to 6 tokens, PPO inputs."""
    gen = torch.Generator().manual_seed(7)
    prompt_lens, response_lens = [4, 2, 3, 4, 1, 3], [6, 1, 4, 3, 5, 2]
    rows, width = len(prompt_lens), 10
    ids = torch.randint(3, vocab, (rows, width), generator=gen)
    attention = torch.zeros(rows, width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attention[i, 4 - p : 4 + r] = 1
    response_mask = attention[:, 4:].clone()
    # old log-probs near the random model's (about -ln(vocab)), so the ratio stays near 1
    old = -torch.log(torch.tensor(float(vocab))) + 0.1 * torch.randn(rows, 6, generator=gen)
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, 4:],
        "response_mask": response_mask,
        "advantages": torch.randn(rows, 6, generator=gen),
        "old_log_probs": old,
        "ref_log_prob": old + 0.05 * torch.randn(rows, 6, generator=gen),
    }


def _update(module, mode: str, ranks: int, data) -> dict[str, float]:
    """Two optimizer steps of the actor's update (SGD, lr 5) on `data`, this rank's rows."""
    from hybrid.config import build_config
    from workers.actor import DataParallelPPOActor

    cfg = build_config(
        [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.entropy_coeff=0.01",
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"actor_rollout_ref.actor.loss_agg_mode={mode}",
            "actor_rollout_ref.actor.grad_clip=1.0",
        ]
    ).actor_rollout_ref.actor
    # The derived fields the driver fills: one response per prompt, mini-batches of MINI prompts.
    cfg = dataclasses.replace(
        cfg, rollout_n=1, data_parallel_size=ranks, ppo_mini_batch_size=MINI, on_policy_update=False
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=5.0)
    actor = DataParallelPPOActor(module, False, cfg, optimizer)
    return actor.update_policy(data, temperature=1.0)


def _full_weights(module) -> dict[str, torch.Tensor]:
    from workers.weight_sync import iter_full_weights

    return {name: t.clone() for name, t in iter_full_weights(module.state_dict(), torch.float32, 1 << 20, False)}


def _rank_main(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from hybrid.batch_ops import pad_mini_batches
    from hybrid.config import build_config
    from protocol.data_proto import DataProto
    from protocol.dispatch import Dispatch, dispatch_to_ranks
    from workers.model_loading import load_hf_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        fsdp = build_config(["actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32"])
        fsdp_config = fsdp.actor_rollout_ref.actor.fsdp_config
        results = {}
        for mode in MODES:
            module, hf_config = load_hf_model(AutoModelForCausalLM, model_dir, fsdp_config, seed=0, trainable=True)
            batch = DataProto.from_dict(tensors=_batch(hf_config.vocab_size))
            padded, dummies = pad_mini_batches(batch, MINI, WORLD)
            per_rank, _ = dispatch_to_ranks(Dispatch.DP_COMPUTE_PROTO, WORLD, (padded,), {})
            metrics = _update(module, mode, WORLD, per_rank[rank][0][0])
            results[mode] = {"metrics": metrics, "weights": _full_weights(module), "dummies": dummies}
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "results.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _one_rank(model_dir: str, mode: str):
    """The reference: the unpadded batch on one rank, a plain model (no FSDP, no process group)."""
    from transformers import AutoModelForCausalLM

    from protocol.data_proto import DataProto

    module = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    batch = DataProto.from_dict(tensors=_batch(module.config.vocab_size))
    before = {n: p.detach().clone() for n, p in module.state_dict().items()}
    metrics = _update(module, mode, 1, batch)
    return metrics, {n: p.detach().clone() for n, p in module.state_dict().items()}, before


@pytest.fixture(scope="module")
def two_rank_results(tiny_model_dir, tmp_path_factory):
    from workers.base import find_free_port

    out = tmp_path_factory.mktemp("padding")
    mp.spawn(_rank_main, args=(find_free_port(), tiny_model_dir, str(out)), nprocs=WORLD, join=True)
    return torch.load(out / "results.pt", weights_only=False)


@pytest.mark.parametrize("mode", MODES)
def test_padded_update_on_two_ranks_equals_one_rank(two_rank_results, tiny_model_dir, mode):
    padded = two_rank_results[mode]
    assert padded["dummies"] == 2  # one per mini-batch of 3
    metrics, weights, before = _one_rank(tiny_model_dir, mode)
    assert padded["metrics"].keys() == metrics.keys()
    for name, value in metrics.items():
        assert abs(padded["metrics"][name] - value) <= TOL * max(1.0, abs(value)), name
    assert metrics["actor/grad_norm"] > 1.0  # the clip (at 1.0) took part
    assert abs(metrics["actor/pg_loss"]) > 1e-3 and metrics["actor/kl_loss"] > 1e-4
    for name, tensor in padded["weights"].items():
        assert (tensor - weights[name]).abs().max().item() <= TOL, name
    moved = max((weights[n] - before[n]).abs().max().item() for n in padded["weights"])
    assert moved > 1e-3  # the steps changed the weights: equal means equal updates
