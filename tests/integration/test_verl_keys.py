"""verl keys that need a model (issue 14), on the tiny random 2-layer model, one in-process
rank: `lora_adapter_path` starts the actor from a saved peft adapter (loaded through
`use_shm`'s copy in shared memory), its reference policy is the base model; the profiler
writes a chrome trace of the chosen step during a short training run."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.integration.checkpoint_helpers import response_log_probs, run_config, train
from tests.integration.engine_helpers import engine_config, synthetic_rollout

pytestmark = [pytest.mark.integration]


def _saved_adapter(model_dir: str, folder) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # init_lora_weights=False: B is random too, so the adapter changes what the model computes.
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, init_lora_weights=False
    )
    get_peft_model(base, config).save_pretrained(folder)
    return str(folder)


def test_lora_adapter_path_and_use_shm(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    import workers.model_loading as model_loading
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(model_loading, "SHM_ROOT", str(shm))
    adapter = _saved_adapter(tiny_model_dir, tmp_path / "adapter")
    cfg = engine_config(
        tiny_model_dir,
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.model.lora_adapter_path={adapter}",
        "actor_rollout_ref.model.use_shm=true",
        "actor_rollout_ref.actor.use_kl_loss=true",
    )
    group = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor_rollout_ref")
    try:
        group.init_model()
        worker = group.worker
        assert worker.config.model.path.startswith(str(shm))  # actor, ref and engine read the copy
        module = worker.actor_module
        assert module.peft_config["default"].r == 4 and module.peft_config["default"].lora_dropout == 0.0
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
        batch = synthetic_rollout(tokenizer)
        actor = worker.compute_log_prob(batch).batch["old_log_probs"]
        ref = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
    finally:
        group.shutdown()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mask = batch.batch["response_mask"].bool()
    assert torch.allclose(ref[mask], response_log_probs(base, batch)[mask], atol=1e-5)
    adapted = PeftModel.from_pretrained(base, adapter).eval()
    expected = response_log_probs(adapted, batch)
    assert torch.allclose(actor[mask], expected[mask], atol=1e-5)
    assert (actor[mask] - ref[mask]).abs().max() > 1e-3  # the adapter is really there


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=16, n_val=4, seed=3)


def test_profiler_writes_the_chosen_steps_trace(tiny_model_dir, arithmetic_files, tmp_path):
    traces = tmp_path / "profile"
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path / "run",
        "trainer.total_training_steps=2",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={traces}",
        "actor_rollout_ref.actor.profiler.enable=true",
    )
    train(cfg)
    assert os.listdir(traces) == ["actor"] and os.listdir(traces / "actor") == ["step2_rank0.json"]
    events = json.loads((traces / "actor" / "step2_rank0.json").read_text())["traceEvents"]
    names = {str(event.get("name", "")) for event in events}
    assert any("aten::" in name for name in names)  # the step's forward and backward ops
