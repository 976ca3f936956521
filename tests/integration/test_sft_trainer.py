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
    common = ["optim.lr=2e-3", "optim.lr_warmup_steps_ratio=0", "use_remove_padding=true", "data.train_batch_size=8"]
    common += ["trainer.save_freq=4", "trainer.test_freq=4", f"trainer.default_local_dir={out}"]
    first = run_sft(_config(tiny_model_dir, sft_files, "trainer.total_epochs=1", *common))
    assert first["steps"] == 8
    assert first["last_loss"] < first["first_loss"] - 0.5
    (s4, v4), (s8, v8) = first["val_loss"]
    assert (s4, s8) == (4, 8) and v8 < v4
    listing = ["global_step_4", "global_step_8", "latest_checkpointed_iteration.txt", "metrics.jsonl"]
    assert sorted(os.listdir(out)) == listing
    assert os.path.isfile(out / "global_step_8" / "actor" / "huggingface" / "model.safetensors")
    second = run_sft(_config(tiny_model_dir, sft_files, "trainer.total_training_steps=10", *common))
    assert second["steps"] == 10
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
    assert steps == list(range(1, 11))  # the second run continued at step 9
    assert second["first_loss"] < first["first_loss"] - 0.5


def test_the_epochs_end_a_run_before_total_training_steps(tiny_model_dir, sft_files, tmp_path, capsys):
    """As verl's SFT trainer: total_epochs passes at most; the schedule still spans the steps asked."""
    from hybrid.sft_trainer import run_sft

    sizes = ["data.train_batch_size=8", "trainer.total_epochs=1", "trainer.total_training_steps=12"]
    summary = run_sft(_config(tiny_model_dir, sft_files, *sizes, f"trainer.default_local_dir={tmp_path / 'run'}"))
    assert summary["steps"] == 8
    assert (
        "hybrid: the run ends with its epochs at step 8, before trainer.total_training_steps=12: "
        "trainer.total_epochs=1 x 8 steps per epoch" in capsys.readouterr().out
    )


def test_verl_peft_example_runs_with_paths_and_sizes_changed(tiny_model_dir, tmp_path):
    """examples/sft/gsm8k_sft_peft.sh (verl's run_qwen_05_peft.sh) through torchrun, LoRA on
    GSM8K-shaped rows (prompt and response inside `extra_info`), then the merge tool."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    rows = [
        {"extra_info": {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}}
        for i in range(8)
    ]
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rows), data / f"{split}.parquet")
    env = {**os.environ, "HOME": str(tmp_path), "MODEL_PATH": tiny_model_dir, "OMP_NUM_THREADS": "1"}
    env["TORCHRUN"] = os.path.join(os.path.dirname(sys.executable), "torchrun")
    sizes = ["data.train_batch_size=4", "trainer.save_freq=2", "trainer.total_training_steps=2", "trainer.device=cpu"]
    script = os.path.join(repo, "examples", "sft", "gsm8k_sft_peft.sh")
    done = subprocess.run(
        ["bash", script, "1", str(tmp_path / "save"), *sizes], env=env, cwd=repo, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    actor = tmp_path / "save" / "global_step_2" / "actor"
    meta = json.loads((actor / "fsdp_config.json").read_text())
    assert meta["lora"]["adapter_config"]["r"] == 32
    assert os.path.isfile(actor / "huggingface" / "model.safetensors")  # LoRA merged into the base
