"""The SFT trainer on two gloo ranks, started as verl starts it (`torchrun --nproc_per_node=2 -m
hybrid.sft_trainer`), against one rank on the same data, order and schedule.

Two data-parallel ranks (padded rows) and two Ulysses ranks (`ulysses_sequence_parallel_size=2`,
one packed row split between them) must give the one-rank run's (packed rows) training loss,
gradient norm and validation loss at every step, and its parameters after the steps. The
tolerances are what fp32 leaves between the two orders of summation (the two runs differ
by the packed or padded attention kernel, the micro-batch split and gloo's reduce-scatter):
measured 6e-8 relative on the losses, 5e-6 on the gradient norm, 4e-6 absolute on a
parameter that three AdamW steps at lr 1e-3 moved by up to 2e-3. A rank that trained its
rows with a local instead of the global token mean, or counted a row twice, would be off by
orders of magnitude more. The two-rank checkpoints are written by both ranks, merged by the
merge tool's library, and resumed: the resumed step equals the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from tests.integration.sft_helpers import REPO, one_thread_env, tiny_sft_run, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 3
LOSS_RTOL, GRAD_NORM_RTOL, PARAM_ATOL = 1e-6, 1e-4, 1e-5


@pytest.fixture(scope="module")
def common(tmp_path_factory, tiny_model_dir):
    return [
        *tiny_sft_run(tmp_path_factory.mktemp("sft_data"), tiny_model_dir, n_train=64, n_val=16),
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=2",
        "model.fsdp_config.mixed_precision=fp32",
        "optim.lr=1e-3",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
    ]


@pytest.fixture(scope="module")
def one_rank(common, tmp_path_factory):
    """The reference: one rank, in this process, packed rows."""
    from hybrid.config.sft_schema import load_sft_config, typed_sft_config
    from hybrid.sft_trainer import run_sft

    out = tmp_path_factory.mktemp("one_rank")
    run_sft(typed_sft_config(load_sft_config([*common, "use_remove_padding=true", f"trainer.default_local_dir={out}"])))
    return out


def _torchrun(out, common, *overrides) -> str:
    command = [*torchrun(2), *common, f"trainer.default_local_dir={out}", *overrides]
    done = subprocess.run(command, cwd=REPO, env=one_thread_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _metrics(out) -> dict[int, dict]:
    """The last line logged for each step (a resumed run logs its steps again)."""
    return {row["step"]: row for row in map(json.loads, open(os.path.join(out, "metrics.jsonl")))}


def _assert_same_steps(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step]["train/loss"] == pytest.approx(want[step]["train/loss"], rel=LOSS_RTOL)
        assert got[step]["train/grad_norm"] == pytest.approx(want[step]["train/grad_norm"], rel=GRAD_NORM_RTOL)
        assert got[step]["train/tokens"] == want[step]["train/tokens"]  # each row counted once
        if "val/loss" in want[step]:
            assert got[step]["val/loss"] == pytest.approx(want[step]["val/loss"], rel=LOSS_RTOL)


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def _assert_same_weights(got: dict, want: dict, base: dict) -> None:
    assert sorted(got) == sorted(want)
    moved = max(float((want[k] - base[k]).abs().max()) for k in want)
    assert moved > 100 * PARAM_ATOL  # the steps changed the weights far beyond the tolerance
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=PARAM_ATOL, msg=name)


def test_two_ranks_train_as_one_save_merge_and_resume(common, one_rank, tiny_model_dir, tmp_path):
    from hybrid.model_merge import merge

    out = tmp_path / "two_ranks"
    _torchrun(out, common)
    _assert_same_steps(_metrics(out), _metrics(one_rank))
    actor = out / "global_step_2" / "actor"
    assert json.loads((actor / "fsdp_config.json").read_text())["world_size"] == 2
    for kind in ("model", "optim", "extra_state"):
        ext = "safetensors" if kind == "model" else "pt"
        assert {f"{kind}_world_size_2_rank_{r}.{ext}" for r in (0, 1)} <= set(os.listdir(actor))
    assert not [name for name in os.listdir(out) if name.endswith(".partial")]
    # Step 2 with the merge tool's library; the last step was merged by the run itself.
    merge(str(actor), str(tmp_path / "merged_2"), progress=False)
    merge(str(one_rank / "global_step_2" / "actor"), str(tmp_path / "reference_2"), progress=False)
    base = _weights(tiny_model_dir)
    _assert_same_weights(_weights(tmp_path / "merged_2"), _weights(tmp_path / "reference_2"), base)
    last = f"global_step_{STEPS}/actor/huggingface"
    want = _weights(one_rank / last)
    _assert_same_weights(_weights(out / last), want, base)
    # Resume: without the last checkpoint the same command continues from step 2.
    uninterrupted = _metrics(out)[STEPS]
    shutil.rmtree(out / f"global_step_{STEPS}")
    log = _torchrun(out, common)
    assert log.count(f"checkpoint: resumed from {out}/global_step_2 at step 2") == 1  # rank 0 reports
    resumed = _metrics(out)[STEPS]
    assert resumed["train/loss"] == pytest.approx(uninterrupted["train/loss"], rel=1e-12)
    assert resumed["train/grad_norm"] == pytest.approx(uninterrupted["train/grad_norm"], rel=1e-12)
    _assert_same_weights(_weights(out / last), want, base)


def test_ulysses_sequence_parallel_trains_as_one_rank(common, one_rank, tiny_model_dir, tmp_path):
    out = tmp_path / "ulysses"
    _torchrun(out, common, "ulysses_sequence_parallel_size=2")
    _assert_same_steps(_metrics(out), _metrics(one_rank))
    last = f"global_step_{STEPS}/actor/huggingface"
    _assert_same_weights(_weights(out / last), _weights(one_rank / last), _weights(tiny_model_dir))
