"""Checkpoints verified before they are trusted, on a real run of the tiny model (one in-process
rank on CPU): a two-step run saves global_step_1 and global_step_2, each with a manifest that
passes; then, on copies of that run's folder, the newest checkpoint with its model shard
truncated, its optimizer file missing, or its manifest corrupted is skipped with one line
naming it, and the run resumes from global_step_1 and reproduces step 2's metrics (today: a
SafetensorError or FileNotFoundError with a stack trace). resume_mode=resume_path on the
damaged folder stops in one line naming it and the file, and the merge command refuses it in
one `model_merger:` line with exit status 2."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.integration.checkpoint_helpers import assert_metrics_close, run_config, train

pytestmark = pytest.mark.integration

SHARD = "actor/model_world_size_1_rank_0.safetensors"
OPTIM = "actor/optim_world_size_1_rank_0.pt"


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=16, n_val=4, seed=3)


@pytest.fixture(scope="module")
def two_steps(tiny_model_dir, arithmetic_files, tmp_path_factory):
    root = tmp_path_factory.mktemp("verified_run")
    cfg = run_config(tiny_model_dir, arithmetic_files, root, "trainer.total_training_steps=2", "trainer.save_freq=1")
    out = train(cfg)
    out["root"] = root
    return out


def truncate_shard(step_dir):
    path = step_dir / SHARD
    os.truncate(path, os.path.getsize(path) // 2)
    return SHARD


def remove_optimizer(step_dir):
    (step_dir / OPTIM).unlink()
    return OPTIM


def corrupt_manifest(step_dir):
    from hybrid.checkpoint_folders import MANIFEST_FILE

    (step_dir / MANIFEST_FILE).write_text('{"version": 1, "checksum": "crc32", "files": {"data.pt": ')
    return MANIFEST_FILE


def test_every_saved_checkpoint_passes_its_manifest(two_steps):
    from hybrid.checkpoint_folders import MANIFEST_FILE, manifest_problem

    for step in (1, 2):
        folder = two_steps["root"] / f"global_step_{step}"
        assert (folder / MANIFEST_FILE).is_file()
        assert manifest_problem(str(folder)) is None


@pytest.mark.parametrize("damage", [truncate_shard, remove_optimizer, corrupt_manifest])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(
    two_steps, tiny_model_dir, arithmetic_files, tmp_path, capsys, damage
):
    from hybrid.checkpoint_folders import CheckpointError, resume_checkpoint

    root = tmp_path / "run"
    shutil.copytree(two_steps["root"], root)
    newest = root / "global_step_2"
    name = damage(newest)
    cfg = run_config(tiny_model_dir, arithmetic_files, root, "trainer.total_training_steps=2", "trainer.save_freq=1")
    capsys.readouterr()
    resumed = train(cfg)
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and str(newest) in skipped[0] and name in skipped[0], out[-2000:]
    assert f"resumed from {root / 'global_step_1'} at step 1" in out
    assert "Traceback" not in out
    assert [h["step"] for h in resumed["history"]] == [2]
    assert_metrics_close(two_steps["history"][1], resumed["history"][0])
    # The damaged folder was saved again by the resumed run's step 2, whole this time.
    from hybrid.checkpoint_folders import manifest_problem

    assert manifest_problem(str(newest)) is None

    # resume_path naming a damaged folder stops in one line naming it and the file.
    damaged = tmp_path / "damaged" / "global_step_2"
    shutil.copytree(two_steps["root"] / "global_step_2", damaged)
    damage(damaged)
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path / "other",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={damaged}",
    )
    with pytest.raises(CheckpointError) as err:
        resume_checkpoint(cfg, need_critic=False)
    assert "\n" not in str(err.value) and str(damaged) in str(err.value) and name in str(err.value)


def test_the_merge_command_refuses_a_damaged_folder(two_steps, tmp_path, capsys):
    from scripts.model_merger import cli

    damaged = tmp_path / "global_step_2"
    shutil.copytree(two_steps["root"] / "global_step_2", damaged)
    truncate_shard(damaged)
    target = tmp_path / "merged"
    with pytest.raises(SystemExit) as exit_info:
        cli(["merge", "--backend", "fsdp", "--local_dir", str(damaged / "actor"), "--target_dir", str(target)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("model_merger:"), err
    assert SHARD in err and str(damaged) in err and "Traceback" not in err
    assert not target.exists()
    # The intact checkpoint merges.
    assert (
        cli(
            [
                "merge",
                "--backend",
                "fsdp",
                "--local_dir",
                str(two_steps["root"] / "global_step_1" / "actor"),
                "--target_dir",
                str(target),
            ]
        )
        == 0
    )
