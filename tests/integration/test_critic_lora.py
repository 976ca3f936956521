"""The critic with LoRA (critic.model.lora_rank > 0, SkyRL's trainer.critic.model.lora.*) on the
tiny random model, one in-process rank: only adapters train, the value head's included under
all-linear (as peft wraps SkyRL's critic); before any update it computes the plain critic's
values (B = 0); an update moves the values but no base weight; and its Hugging Face folder
(hf_model content, adapters merged) loaded as a plain critic computes the trained values, as
does a LoRA critic resumed from the checkpoint."""

from __future__ import annotations

import os

import pytest
import torch

from tests.integration.engine_helpers import engine_config, synthetic_rollout

pytestmark = pytest.mark.integration

CRITIC = [
    "algorithm.adv_estimator=gae",
    "critic.model.fsdp_config.mixed_precision=fp32",
    "critic.optim.lr=1e-2",
    "critic.ppo_micro_batch_size_per_gpu=2",
]
LORA = ["critic.model.lora_rank=4", "critic.model.lora_alpha=8"]


def _critic(model_dir, *overrides):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.critic_worker import CriticWorker

    group = LocalWorkerGroup(CriticWorker, engine_config(model_dir, *CRITIC, *overrides).critic, name="critic")
    group.init_model()
    return group


@pytest.mark.slow  # four tiny critics and one checkpoint: about 7 s on two CPU cores
def test_critic_lora_trains_adapters_only_and_its_export_computes_the_trained_values(
    tiny_model_dir, tokenizer, tmp_path
):
    from workers.checkpoint import HF_DIR

    batch = synthetic_rollout(tokenizer, n=2)
    mask = batch.batch["response_mask"].bool()
    plain = _critic(tiny_model_dir)
    plain_values = plain.compute_values(batch).batch["values"]
    plain.shutdown()

    group = _critic(tiny_model_dir, *LORA, "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]")
    module = group.worker.module
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert any(".score.lora_" in name for name in trainable)  # the value head is adapted too
    frozen = {name: p.detach().full_tensor().clone() for name, p in module.named_parameters() if not p.requires_grad}
    values = group.compute_values(batch).batch["values"]
    assert (values - plain_values)[mask].abs().max() <= 1e-6  # B = 0: the plain critic's function

    data = batch.select(deepcopy=True)
    data.batch["values"] = values
    data.batch["returns"] = torch.linspace(-1, 1, values.numel()).view_as(values) * data.batch["response_mask"]
    group.update_critic(data)
    after = group.compute_values(batch).batch["values"]
    assert (after - values)[mask].abs().max() > 1e-3, "the update did not move the values"
    for name, p in module.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p.detach().full_tensor(), frozen[name]), name
    group.save_checkpoint(str(tmp_path / "ckpt"), global_step=1)
    group.shutdown()

    resumed = _critic(tiny_model_dir, *LORA)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert torch.equal(resumed.compute_values(batch).batch["values"][mask], after[mask])
    resumed.shutdown()

    exported = os.path.join(tmp_path, "ckpt", HF_DIR)
    merged = _critic(tiny_model_dir, f"critic.model.path={exported}", f"critic.model.tokenizer_path={tiny_model_dir}")
    merged_values = merged.compute_values(batch).batch["values"]
    merged.shutdown()
    assert (merged_values - after)[mask].abs().max() <= 1e-5
