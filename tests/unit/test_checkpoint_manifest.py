"""The checkpoint manifest on hand-made step folders: what it lists (sizes and CRC-32s equal to
zlib's over each file's bytes), what fails its check (a truncated file, a missing file, a byte
changed at the same size, an unreadable manifest) with the file named, what passes (an older
folder without a manifest, with a notice; a role folder removed whole by retention), and how
resume picks: auto skips a failing folder in one line for the newest one that passes,
resume_path stops in one line naming the folder and the file."""

from __future__ import annotations

import json
import os
import zlib

import pytest
from omegaconf import OmegaConf

from hybrid.checkpoint_folders import (
    MANIFEST_FILE,
    CheckpointError,
    manifest_problem,
    resume_checkpoint,
    verified_checkpoint,
    write_manifest,
    write_tracker,
)

FILES = {
    "data.pt": b"trainer state" * 10,
    "actor/fsdp_config.json": b'{"world_size": 1}',
    "actor/model_world_size_1_rank_0.safetensors": bytes(range(256)) * 40,
    "actor/optim_world_size_1_rank_0.pt": b"optimizer" * 300,
    "actor/huggingface/config.json": b"{}",
    "critic/fsdp_config.json": b'{"world_size": 1}',
    "critic/model_world_size_1_rank_0.safetensors": b"critic" * 100,
}


def make_step(root, step: int, manifest: bool = True) -> str:
    folder = os.path.join(root, f"global_step_{step}")
    for rel, data in FILES.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data + bytes([step]))
    if manifest:
        write_manifest(folder)
    return folder


def config(root, mode="auto", path=None):
    return OmegaConf.create(
        {"trainer": {"default_local_dir": str(root), "resume_mode": mode, "resume_from_path": path}}
    )


def test_manifest_lists_every_file_with_zlib_crc32(tmp_path):
    folder = make_step(tmp_path, 2)
    with open(os.path.join(folder, MANIFEST_FILE)) as f:
        manifest = json.load(f)
    assert set(manifest["files"]) == set(FILES)
    for rel, data in FILES.items():
        raw = data + bytes([2])
        assert manifest["files"][rel] == {"size": len(raw), "crc32": f"{zlib.crc32(raw):08x}"}
    assert manifest_problem(folder, need_critic=True) is None


def damage_truncate(folder):
    path = os.path.join(folder, "actor/model_world_size_1_rank_0.safetensors")
    os.truncate(path, os.path.getsize(path) // 2)
    return "actor/model_world_size_1_rank_0.safetensors", "truncated"


def damage_missing(folder):
    os.remove(os.path.join(folder, "actor/optim_world_size_1_rank_0.pt"))
    return "actor/optim_world_size_1_rank_0.pt", "missing"


def damage_flip(folder):
    path = os.path.join(folder, "actor/model_world_size_1_rank_0.safetensors")
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    return "actor/model_world_size_1_rank_0.safetensors", "checksum"


def damage_manifest(folder):
    path = os.path.join(folder, MANIFEST_FILE)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    return MANIFEST_FILE, "unreadable"


@pytest.mark.parametrize("damage", [damage_truncate, damage_missing, damage_flip, damage_manifest])
def test_a_damaged_folder_fails_naming_the_file_and_auto_takes_the_older_one(tmp_path, capsys, damage):
    make_step(tmp_path, 1)
    newest = make_step(tmp_path, 2)
    write_tracker(str(tmp_path), 2)
    name, words = damage(newest)
    problem = manifest_problem(newest)
    assert problem is not None and name in problem and words in problem
    capsys.readouterr()
    assert resume_checkpoint(config(tmp_path), need_critic=False) == os.path.join(tmp_path, "global_step_1")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1 and newest in lines[0] and name in lines[0] and "skipping" in lines[0]
    with pytest.raises(CheckpointError) as err:
        resume_checkpoint(config(tmp_path, "resume_path", newest), need_critic=False)
    message = str(err.value)
    assert "\n" not in message and newest in message and name in message


def test_every_folder_damaged_is_a_fresh_start(tmp_path, capsys):
    damage_truncate(make_step(tmp_path, 1))
    damage_missing(make_step(tmp_path, 2))
    assert verified_checkpoint(str(tmp_path)) is None
    assert len(capsys.readouterr().out.strip().splitlines()) == 2


def test_a_folder_without_manifest_is_used_with_a_notice(tmp_path, capsys):
    old = make_step(tmp_path, 3, manifest=False)
    assert resume_checkpoint(config(tmp_path), need_critic=False) == old
    out = capsys.readouterr().out
    assert MANIFEST_FILE in out and "unverified" in out and old in out


def test_a_role_removed_by_retention_is_required_only_when_the_run_needs_it(tmp_path):
    folder = make_step(tmp_path, 4)
    import shutil

    shutil.rmtree(os.path.join(folder, "critic"))
    assert manifest_problem(folder, need_critic=False) is None
    assert "critic/fsdp_config.json is missing" in manifest_problem(folder, need_critic=True)


def test_files_added_after_the_rename_are_not_checked(tmp_path):
    folder = make_step(tmp_path, 5)
    with open(os.path.join(folder, "actor/huggingface/model.safetensors"), "wb") as f:
        f.write(b"merged on finish")
    assert manifest_problem(folder) is None


def test_the_merge_tool_checks_one_role(tmp_path):
    from hybrid.model_merge import verify_against_manifest

    folder = make_step(tmp_path, 6)
    damage_truncate(folder)
    with pytest.raises(CheckpointError) as err:
        verify_against_manifest(os.path.join(folder, "actor"))
    assert "actor/model_world_size_1_rank_0.safetensors" in str(err.value) and folder in str(err.value)
    verify_against_manifest(os.path.join(folder, "critic"))  # the critic's files are whole
