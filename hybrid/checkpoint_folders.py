"""Checkpoint folders on disk: the layout, what makes one complete, the rename that
publishes it, the tracker file, retention, and which folder a run resumes from.

Layout (verl's):

    trainer.default_local_dir/
        global_step_N/actor/      every actor rank's shards (workers/checkpoint.py)
        global_step_N/critic/     the same for the critic, when there is one
        global_step_N/data.pt     global step, data loader position, KL coefficient
        global_step_N/checkpoint_manifest.json   every file's size and CRC-32, written last
        latest_checkpointed_iteration.txt

A checkpoint is written into `global_step_N.partial` and renamed to `global_step_N` only
after every rank of every role has returned from its save and data.pt is written: a crash
at any point leaves either the previous complete checkpoints or a `.partial` folder,
which resume never reads and removes. Retention (`max_actor_ckpt_to_keep`,
`max_critic_ckpt_to_keep`) runs after the rename, so the newest complete checkpoint is
never deleted to make room for one that may not finish.

The manifest (`write_manifest`, just before the rename) lets resume trust a folder only
after checking it (`manifest_problem`): every listed file present with its size and CRC-32
(zlib, about 2 GB/s). Resume in `auto` mode names a folder that fails (a truncated shard, a
missing optimizer file, an unreadable manifest) in one line and takes the newest one that
passes; `resume_path` stops in one line naming the folder and the file. A folder without a
manifest (written before manifests existed) is accepted with a one-line notice that it is
unverified. Files added after the rename (merge_on_finish's weights in actor/huggingface) are
not listed and not checked; a role folder removed whole by retention is not required unless
the run needs that role.

hybrid/checkpointing.py writes and reads them for a run; hybrid/model_merge.py turns an
actor folder into a Hugging Face folder. This module imports only the standard library:
config validation uses the folder checks without loading torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib

STEP_DIR = re.compile(r"^global_step_(\d+)$")
PARTIAL_SUFFIX = ".partial"
PARTIAL_DIR = re.compile(r"^global_step_\d+(\.old)?\.partial$")
TRACKER_FILE = "latest_checkpointed_iteration.txt"
DATA_FILE = "data.pt"
MANIFEST_FILE = "checkpoint_manifest.json"
MANIFEST_VERSION = 1
CHUNK_BYTES = 8 << 20
ROLES = ("actor", "critic")


def say(line: str) -> None:
    """A console line that does not tear the trainer's progress bar (tqdm redraws it below)."""
    import sys

    from tqdm import tqdm

    tqdm.write(line)
    sys.stdout.flush()  # a run stopped right after (preemption) still shows it


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from; the message names the path and what to do."""


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{int(step)}")


def checkpoint_problem(path: str, need_critic: bool = False) -> str | None:
    """Why `path` is not a complete checkpoint to resume from, or None when it is."""
    name = os.path.basename(os.path.normpath(path))
    if not os.path.exists(path):
        return f"{path} does not exist"
    if not os.path.isdir(path):
        return f"{path} is not a folder"
    if name.endswith(PARTIAL_SUFFIX):
        return (
            f"{path} is a partial checkpoint (written under a temporary name; the run stopped before every "
            f"rank finished saving it)"
        )
    if not STEP_DIR.match(name):
        inside = os.path.basename(os.path.dirname(os.path.normpath(path)))
        hint = f"; did you mean its parent {os.path.dirname(os.path.normpath(path))}?" if STEP_DIR.match(inside) else ""
        return f"{path} is not a global_step_N checkpoint folder{hint}"
    if not os.path.isfile(os.path.join(path, DATA_FILE)):
        return f"{path} is incomplete: {DATA_FILE} is missing"
    if not os.path.isfile(os.path.join(path, "actor", "fsdp_config.json")):
        return f"{path} is incomplete: it has no actor checkpoint (removed by trainer.max_actor_ckpt_to_keep?)"
    if need_critic and not os.path.isfile(os.path.join(path, "critic", "fsdp_config.json")):
        return (
            f"{path} has no critic checkpoint but this run trains a critic "
            f"(removed by trainer.max_critic_ckpt_to_keep?)"
        )
    return None


def complete_checkpoints(root: str, need_critic: bool = False) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = STEP_DIR.match(name)
        path = os.path.join(root, name)
        if match and checkpoint_problem(path, need_critic) is None:
            found.append((int(match.group(1)), path))
    return sorted(found)


def partial_checkpoints(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, n) for n in os.listdir(root) if PARTIAL_DIR.match(n))


def remove_partial_checkpoints(root: str) -> list[str]:
    removed = partial_checkpoints(root)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
        say(f"checkpoint: removed partial checkpoint {path} (a save that never completed)")
    return removed


def read_tracker(root: str) -> int | None:
    try:
        with open(os.path.join(root, TRACKER_FILE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def latest_checkpoint(root: str, need_critic: bool = False) -> str | None:
    """The tracker's checkpoint when complete (it names this run's newest save, even when an
    abandoned run left higher steps behind), else the highest complete step, else None.
    Structure only: `verified_checkpoint` also checks the manifests."""
    candidates = resume_candidates(root, need_critic)
    return candidates[0] if candidates else None


def resume_candidates(root: str, need_critic: bool = False) -> list[str]:
    """Complete checkpoints in the order resume tries them: the tracker's (when complete) and
    the ones below it, newest first; without a usable tracker every complete one, newest first."""
    found = complete_checkpoints(root, need_critic)
    step = read_tracker(root)
    if step is not None and checkpoint_problem(step_dir(root, step), need_critic) is None:
        return [p for s, p in reversed(found) if s <= step]
    return [p for _, p in reversed(found)]


def verified_checkpoint(root: str, need_critic: bool = False) -> str | None:
    """The newest resume candidate whose manifest check passes; each one that fails is named
    in one line and skipped."""
    for path in resume_candidates(root, need_critic):
        problem = manifest_problem(path, need_critic)
        if problem is None:
            return path
        say(f"checkpoint: skipping {path}: {problem}; trying an older checkpoint")
    return None


def resume_path_problem(path: str, need_critic: bool = False) -> str | None:
    """The message for `trainer.resume_from_path` pointing somewhere resume cannot use."""
    problem = checkpoint_problem(path, need_critic)
    if problem is None:
        return None
    root = os.path.dirname(os.path.normpath(path))
    found = [p for _, p in complete_checkpoints(root, need_critic)]
    hint = f"; complete checkpoints there: {', '.join(found)}" if found else ""
    return f"trainer.resume_from_path: {problem}{hint}"


def resume_checkpoint(config, need_critic: bool) -> str | None:
    """The checkpoint folder this run starts from (None: a fresh start)."""
    trainer_cfg = config.trainer
    mode = trainer_cfg.resume_mode
    root = os.path.abspath(str(trainer_cfg.default_local_dir))
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = trainer_cfg.resume_from_path
        if not path:
            raise CheckpointError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N folder)"
            )
        path = os.path.abspath(str(path))
        problem = resume_path_problem(path, need_critic)
        if problem:
            raise CheckpointError(problem)
        problem = manifest_problem(path, need_critic)
        if problem:
            raise CheckpointError(f"trainer.resume_from_path: {path} fails its check: {problem}")
        return path
    if mode != "auto":
        raise CheckpointError(f"trainer.resume_mode={mode!r} is not one of auto, disable, resume_path")
    return verified_checkpoint(root, need_critic)


def publish(temp: str, final: str) -> None:
    """Give the finished checkpoint its real name (a rename: atomic on one filesystem)."""
    if os.path.exists(final):
        # Saving a step again (resumed from an older checkpoint): move the old one aside
        # under a name resume ignores, then drop it once the new one is in place.
        old = final + ".old" + PARTIAL_SUFFIX
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(temp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(temp, final)


def write_tracker(root: str, step: int) -> None:
    temp = os.path.join(root, TRACKER_FILE + ".tmp")
    with open(temp, "w") as f:
        f.write(str(step))
    os.replace(temp, os.path.join(root, TRACKER_FILE))


def apply_retention(root: str, current_step: int, keep: dict) -> list[str]:
    """Delete each role's folder beyond its newest `keep[role]` checkpoints (None or <= 0:
    keep all); a step folder left with no role is removed whole. Only steps up to the
    current one count: higher ones belong to an abandoned run and are replaced as this
    run reaches them."""
    removed = []
    steps = [(s, p) for s, p in _step_dirs(root) if s <= current_step]
    for role, limit in keep.items():
        if limit is None or int(limit) <= 0:
            continue
        with_role = [(s, p) for s, p in steps if os.path.isdir(os.path.join(p, role))]
        for _, path in with_role[: max(len(with_role) - int(limit), 0)]:
            shutil.rmtree(os.path.join(path, role), ignore_errors=True)
            removed.append(os.path.join(path, role))
    for _, path in steps:
        if not any(os.path.isdir(os.path.join(path, role)) for role in ROLES):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _step_dirs(root: str) -> list[tuple[int, str]]:
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        match = STEP_DIR.match(name)
        if match:
            out.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(out)


# ----------------------------------------------------------------------------- the manifest


def file_crc32(path: str) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def write_manifest(folder: str) -> dict:
    """List every file under `folder` (a checkpoint being written) with its size and CRC-32
    in `checkpoint_manifest.json`, written last (a temporary name, then a rename)."""
    files = {}
    for dirpath, _, names in os.walk(folder):
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if rel in (MANIFEST_FILE, MANIFEST_FILE + ".tmp"):
                continue
            files[rel] = {"size": os.path.getsize(path), "crc32": file_crc32(path)}
    manifest = {"version": MANIFEST_VERSION, "checksum": "crc32", "files": dict(sorted(files.items()))}
    temp = os.path.join(folder, MANIFEST_FILE + ".tmp")
    with open(temp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, os.path.join(folder, MANIFEST_FILE))
    return manifest


def read_manifest(folder: str) -> dict | None:
    """The folder's manifest; None when it has none; CheckpointError when it cannot be read."""
    path = os.path.join(folder, MANIFEST_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
        files = manifest["files"]
        if manifest.get("checksum") != "crc32" or not isinstance(files, dict):
            raise ValueError(f"checksum {manifest.get('checksum')!r}, files of type {type(files).__name__}")
        for entry in files.values():
            int(entry["size"]), int(entry["crc32"], 16)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"its manifest {path} is unreadable ({type(err).__name__}: {err})") from err
    return manifest


def manifest_problem(folder: str, need_critic: bool = False, under: str | None = None) -> str | None:
    """Why `folder`'s files do not match its manifest (naming the file), or None when they do.
    A folder without a manifest passes with a one-line notice that it is unverified. `under`:
    check only the files below that subfolder (the merge tool checks one role)."""
    try:
        manifest = read_manifest(folder)
    except CheckpointError as err:
        return str(err)
    if manifest is None:
        say(f"checkpoint: {folder} has no {MANIFEST_FILE} (written before checkpoints had one); using it unverified")
        return None
    entries = manifest["files"]
    if under is not None:
        entries = {rel: e for rel, e in entries.items() if rel.startswith(under.rstrip("/") + "/")}
    else:
        # A role folder that retention removed whole is required only when the run needs that role.
        needed = {"actor"} | ({"critic"} if need_critic else set())
        entries = {
            rel: e
            for rel, e in entries.items()
            if rel.split("/")[0] not in ROLES
            or rel.split("/")[0] in needed
            or os.path.isdir(os.path.join(folder, rel.split("/")[0]))
        }
    for rel, entry in entries.items():  # sizes first: a truncated or missing file costs no reading
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            return f"{rel} is missing (listed in its manifest)"
        size = os.path.getsize(path)
        if size != int(entry["size"]):
            return f"{rel} has {size} bytes, its manifest says {entry['size']} (truncated or overwritten)"
    for rel, entry in entries.items():
        if file_crc32(os.path.join(folder, rel)) != entry["crc32"].lower():
            return f"{rel} does not match its manifest's checksum (corrupted)"
    return None
