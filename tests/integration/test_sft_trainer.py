"""The SFT trainer on a tiny random model: its loss is the plain cross-entropy of the target
tokens (padded and packed rows alike, against a forward of the unsharded model), a short
run lowers it, writes metrics.jsonl and PPO-layout checkpoints with the merged model, and a
second run resumes from the last checkpoint."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hybrid.config.sft_schema import load_sft_config, typed_sft_config
from hybrid.sft_data import SFTDataset, make_collate, write_arithmetic_sft_parquet


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory):
    paths = write_arithmetic_sft_parquet(tmp_path_factory.mktemp("sft_data"), n_train=64, n_val=16)
    return {k: str(v) for k, v in paths.items()}


def _config(model_dir, files, *overrides):
    return typed_sft_config(
        load_sft_config(
            [
                f"model.partial_pretrain={model_dir}",
                f"data.train_files={files['train']}",
                f"data.val_files={files['val']}",
                "data.train_batch_size=16",
                "data.micro_batch_size_per_gpu=4",
                "model.enable_gradient_checkpointing=false",
                "trainer.logger=[file]",
                "trainer.device=cpu",
                *overrides,
            ]
        )
    )


@pytest.mark.parametrize("packed", [False, True])
def test_loss_is_the_cross_entropy_of_the_target_tokens(tiny_model_dir, tokenizer, sft_files, packed):
    from transformers import AutoModelForCausalLM

    from workers.sft import SFTWorker

    cfg = _config(tiny_model_dir, sft_files, "model.fsdp_config.mixed_precision=fp32", f"use_remove_padding={packed}")
    rows = SFTDataset(sft_files["val"], tokenizer, cfg.data)
    batch = make_collate(tokenizer.pad_token_id)([rows[i] for i in range(6)])
    worker = SFTWorker(cfg, total_steps=1)
    worker.init_model()
    total, count = worker.loss_sums(batch)
    # By hand: each row alone through the unsharded model; targets are the masked tokens.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).requires_grad_(False)
    want_total = want_count = 0.0
    for ids, attn, mask in zip(batch["input_ids"], batch["attention_mask"], batch["loss_mask"]):
        n = int(attn.sum())
        logp = torch.log_softmax(model(ids[None, :n]).logits[0].double(), -1)
        targets = mask[1:n].bool()
        want_total -= float(logp[:-1].gather(-1, ids[1:n, None])[:, 0][targets].sum())
        want_count += float(targets.sum())
    assert count == want_count > 0
    assert total == pytest.approx(want_total, rel=1e-5)


def test_training_lowers_the_loss_saves_and_resumes(tiny_model_dir, sft_files, tmp_path):
    from hybrid.sft_trainer import run_sft

    out = tmp_path / "run"
    common = ["optim.lr=2e-3", "optim.lr_warmup_steps_ratio=0", "use_remove_padding=true"]
    common += ["trainer.save_freq=4", "trainer.test_freq=4", f"trainer.default_local_dir={out}"]
    first = run_sft(_config(tiny_model_dir, sft_files, "trainer.total_epochs=2", *common))
    assert first["steps"] == 8
    assert first["last_loss"] < first["first_loss"] - 0.5
    (s4, v4), (s8, v8) = first["val_loss"]
    assert (s4, s8) == (4, 8) and v8 < v4
    listing = ["global_step_4", "global_step_8", "latest_checkpointed_iteration.txt", "metrics.jsonl"]
    assert sorted(os.listdir(out)) == listing
    assert os.path.isfile(out / "global_step_8" / "actor" / "huggingface" / "model.safetensors")
    second = run_sft(_config(tiny_model_dir, sft_files, "trainer.total_epochs=3", *common))
    assert second["steps"] == 12
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
    assert steps == list(range(1, 13))  # the second run continued at step 9
    assert second["first_loss"] < first["first_loss"] - 0.5
