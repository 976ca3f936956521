"""Offloading through whole worker calls, on a tiny random model (Hugging Face rollout engine):
with `param_offload` and `optimizer_offload` on, every forward, weight sync and optimizer
step runs with its state on the device, and after every call the actor's, the reference's
and the critic's parameters and optimizer state are back on the host.

On a CPU the real moves are no-ops, so the moves are recorded instead: each object's place
is what the last move said. The fused worker also refuses to generate before the engine
has the actor's weights, and again after a checkpoint load replaced them."""

from __future__ import annotations

import pytest
import torch

import workers.actor_rollout_ref_worker
import workers.critic_worker
import workers.fsdp_utils
from protocol.data_proto import DataProto
from tests.integration.engine_helpers import engine_config, prompt_batch, synthetic_rollout

pytestmark = pytest.mark.integration

OFFLOAD = [
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
    "actor_rollout_ref.ref.fsdp_config.param_offload=true",
    "critic.model.fsdp_config.param_offload=true",
    "critic.model.fsdp_config.optimizer_offload=true",
    "critic.model.fsdp_config.mixed_precision=fp32",
]


class Placement:
    """Where each module / optimizer is, as the last move put it (absent: the host)."""

    def __init__(self, monkeypatch):
        self.where: dict[int, str] = {}
        moves = {
            "load_params": "device",
            "offload_params": "host",
            "load_optimizer": "device",
            "offload_optimizer": "host",
        }
        for module in (workers.fsdp_utils, workers.actor_rollout_ref_worker, workers.critic_worker):
            for name, place in moves.items():
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, lambda obj, place=place: self.where.__setitem__(id(obj), place))

    def of(self, obj) -> str:
        return self.where.get(id(obj), "host")

    def require(self, obj, what: str) -> None:
        assert self.of(obj) == "device", f"{what} ran with its state on the host"

    def watch_forward(self, module, what: str) -> None:
        module.register_forward_pre_hook(lambda m, args: self.require(m, f"{what} forward"))

    def watch_step(self, optimizer, module, what: str) -> None:
        def check(opt, args, kwargs):
            self.require(opt, f"{what} optimizer step")
            self.require(module, f"{what} optimizer step")

        optimizer.register_step_pre_hook(check)


def _all_on_host(placement, *objects):
    return [placement.of(o) for o in objects] == ["host"] * len(objects)


def test_actor_rollout_ref_state_is_on_the_host_between_calls(tiny_model_dir, tokenizer, monkeypatch, tmp_path):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    placement = Placement(monkeypatch)
    cfg = engine_config(tiny_model_dir, *OFFLOAD)
    group = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor_rollout_ref")
    group.init_model()
    worker = group.worker
    actor, ref, optimizer = worker.actor_module, worker.ref.module, worker.actor.optimizer
    assert ref is not actor
    state = (actor, ref, optimizer)
    assert _all_on_host(placement, *state)
    placement.watch_forward(actor, "actor")
    placement.watch_forward(ref, "reference")
    placement.watch_step(optimizer, actor, "actor")
    update_weights = worker.rollout.update_weights
    monkeypatch.setattr(
        worker.rollout, "update_weights", lambda w: (placement.require(actor, "weight sync"), update_weights(w))
    )

    with pytest.raises(RuntimeError, match="call update_rollout_weights first"):
        group.generate_sequences(prompt_batch(tokenizer))
    group.update_rollout_weights()
    assert _all_on_host(placement, *state)
    gen = group.generate_sequences(prompt_batch(tokenizer))
    assert _all_on_host(placement, *state)
    batch = synthetic_rollout(tokenizer)
    old = group.compute_log_prob(batch)
    assert _all_on_host(placement, *state)
    ref_lp = group.compute_ref_log_prob(batch)
    assert _all_on_host(placement, *state)
    tensors = {"ref_log_prob": ref_lp.batch["ref_log_prob"], "old_log_probs": old.batch["old_log_probs"]}
    batch = batch.union(DataProto.from_dict(tensors=tensors))
    group.update_actor(batch)
    assert optimizer.state, "the update did not step the optimizer"
    assert _all_on_host(placement, *state)
    group.save_checkpoint(str(tmp_path / "actor"), global_step=1)
    assert _all_on_host(placement, *state)
    group.load_checkpoint(str(tmp_path / "actor"))
    assert _all_on_host(placement, *state)
    with pytest.raises(RuntimeError, match="call update_rollout_weights first"):
        group.generate_sequences(prompt_batch(tokenizer))  # the checkpoint replaced the weights
    group.update_rollout_weights()
    group.weights_digest()
    assert _all_on_host(placement, *state)
    assert old.batch["old_log_probs"].shape == batch.batch["responses"].shape and len(gen) == len(batch)


def test_critic_state_is_on_the_host_between_calls(tiny_model_dir, tokenizer, monkeypatch, tmp_path):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.critic_worker import CriticWorker

    placement = Placement(monkeypatch)
    cfg = engine_config(tiny_model_dir, *OFFLOAD)
    group = LocalWorkerGroup(CriticWorker, cfg.critic, name="critic")
    group.init_model()
    module, optimizer = group.worker.module, group.worker.critic.optimizer
    assert _all_on_host(placement, module, optimizer)
    placement.watch_forward(module, "critic")
    placement.watch_step(optimizer, module, "critic")
    batch = synthetic_rollout(tokenizer)
    values = group.compute_values(batch).batch["values"]
    assert _all_on_host(placement, module, optimizer)
    batch.batch["values"] = values
    batch.batch["returns"] = torch.randn_like(values) * batch.batch["response_mask"]
    group.update_critic(batch)
    assert optimizer.state and _all_on_host(placement, module, optimizer)
    group.save_checkpoint(str(tmp_path / "critic"), global_step=1)
    group.load_checkpoint(str(tmp_path / "critic"))
    assert _all_on_host(placement, module, optimizer)
