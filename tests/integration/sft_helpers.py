"""Shared pieces of the SFT tests that start the trainer as a user does: the overrides of a
tiny run (the arithmetic task's worked answers, the tiny random model on the CPU, the file
logger) and the torchrun command line."""

from __future__ import annotations

import os
import sys

from hybrid.sft_data import write_arithmetic_sft_parquet

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_sft_run(data_dir, model_dir, n_train: int, n_val: int) -> list[str]:
    """Overrides every small SFT run shares, after writing `n_train`/`n_val` rows into
    `data_dir` (no validation set for `n_val=0`). Callers add sizes, steps and saving."""
    files = write_arithmetic_sft_parquet(data_dir, n_train=n_train, n_val=max(n_val, 1))
    return [
        f"model.partial_pretrain={model_dir}",
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}" if n_val else "data.val_files=null",
        "model.enable_gradient_checkpointing=false",
        "trainer.logger=[file]",
        "trainer.device=cpu",
    ]


def torchrun(ranks: int) -> list[str]:
    """`torchrun ... -m hybrid.sft_trainer` on this machine, verl's way of starting SFT."""
    launcher = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [launcher, "--standalone", "--nnodes=1", f"--nproc_per_node={ranks}", "-m", "hybrid.sft_trainer"]


def one_thread_env() -> dict[str, str]:
    """The environment of a started run: each rank one thread (the test machine's cores are
    shared by the ranks), and not this process's own rendezvous (an in-process run of an
    earlier test set MASTER_PORT and still listens on it)."""
    rendezvous = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    return {**{k: v for k, v in os.environ.items() if k not in rendezvous}, "OMP_NUM_THREADS": "1"}
