"""ROLL's own example pipeline files (github.com/alibaba/ROLL, examples/**/*.yaml), read the
way `python -m hybrid.main_ppo --roll-config FILE` reads them.

Which files are counted (selected), decided from the file as ROLL composes it:
- a pipeline file that trains with reinforcement learning: it has both an `actor_train`
  section (the trained policy) and an `actor_infer` section (the generating engine), as
  ROLL's RLVR and agentic pipelines do;
- `actor_train.strategy_args.strategy_name` is `fsdp2_train` (FSDP2 training) and
  `actor_infer.strategy_args.strategy_name` is `vllm`.
The other worker sections do not decide: a `reference` on `hf_infer`, `fsdp2_infer` or even
`megatron_infer`, a critic, a reward worker on `hf_infer` are part of the example and judged
by the check like any other key. Every other file is kept with the reason it is not counted:
a fragment that other files pull in through Hydra `defaults` (examples/config/*: environment
lists, not launches), an empty file, a rollout-only pipeline (no actor_train, or an actor_train
without a strategy in a file that the launch scripts beside it run only with a
start_*_rollout_pipeline.py), a pipeline that is not RL with a generating engine (SFT, DPO,
distillation: no actor_infer), or a pipeline on another training strategy (megatron_train,
deepspeed_train) or inference engine (sglang).

Kept per selected example: the file's text and the text of every file it pulls in through
`defaults` (resolved relative to the file's folder, as ROLL's launcher resolves them with its
config path, recursively), so `check` needs no checkout: it writes them into a folder at their
relative paths and runs `check_argv(["--roll-config", path])`.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

import yaml

from scripts.peer_examples import check_argv

REPOSITORY = "alibaba/ROLL"


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True, capture_output=True, text=True).stdout


def _defaults_paths(path: str, data: object) -> list[str]:
    """The files a `defaults:` list pulls in, as repository paths (`../config/x@_here_` -> examples/config/x.yaml)."""
    entries = data.get("defaults") if isinstance(data, dict) else None
    out = []
    for entry in entries or []:
        if isinstance(entry, dict):
            (group, option), *_ = entry.items()
            name = f"{str(group).split('@', 1)[0]}/{option}"
        else:
            name = str(entry).split("@", 1)[0]
        if name in ("_self_",) or name.startswith("override "):
            continue
        out.append(posixpath.normpath(posixpath.join(posixpath.dirname(path), name + ".yaml")))
    return out


def _strategy(data: dict, section: str) -> str | None:
    value = data.get(section)
    if not isinstance(value, dict):
        return None
    return (value.get("strategy_args") or {}).get("strategy_name")


_LAUNCH = re.compile(r"examples/(start_\w+_pipeline)\.py\b.*--config_name\s+([\w.-]+)")


def _launchers(git_dir: Path, names: list[str]) -> dict[str, set[str]]:
    """{example path: the start_*_pipeline scripts that the launch scripts in its folder run it with}."""
    out: dict[str, set[str]] = {}
    for script in [p for p in names if p.endswith(".sh")]:
        for launcher, config in _LAUNCH.findall(_git(git_dir, "show", f"HEAD:{script}")):
            out.setdefault(posixpath.join(posixpath.dirname(script), config + ".yaml"), set()).add(launcher)
    return out


def _why_not(path: str, data: object, fragments: set[str], launchers: set[str]) -> str | None:
    if path in fragments or path.startswith("examples/config/"):
        return "fragment pulled in through Hydra defaults (an environment list), not a pipeline file"
    if not data:
        return "empty file"
    rollout_only = (
        launchers
        and all(name.endswith("_rollout_pipeline") for name in launchers)
        and _strategy(data, "actor_train") is None
    )
    if ("actor_train" not in data and "actor_infer" in data) or rollout_only:
        return "rollout-only pipeline (no actor_train, or none with a strategy, run by start_*_rollout_pipeline.py)"
    if "actor_train" not in data or "actor_infer" not in data:
        return "not an RL pipeline with a generating engine (SFT, DPO or distillation: no actor_infer)"
    train, infer = _strategy(data, "actor_train"), _strategy(data, "actor_infer")
    if train != "fsdp2_train":
        return f"actor_train on {train} (not fsdp2_train)"
    if infer != "vllm":
        return f"actor_infer on {infer} (not vllm)"
    return None


def extract(git_dir: Path) -> dict:
    commit = _git(git_dir, "rev-parse", "HEAD").strip()
    listed = _git(git_dir, "ls-tree", "-r", "--name-only", "HEAD", "examples").split("\n")
    names = [p for p in listed if p.endswith(".yaml")]
    launchers = _launchers(git_dir, listed)
    texts = {p: _git(git_dir, "show", f"HEAD:{p}") for p in names}
    parsed = {p: yaml.safe_load(t) for p, t in texts.items()}
    fragments = {f for p in names for f in _defaults_paths(p, parsed[p])}
    examples = []
    for path in sorted(names):
        pulled, todo = {}, _defaults_paths(path, parsed[path])
        while todo:  # fragments may have defaults of their own
            name = todo.pop(0)
            if name in pulled:
                continue
            pulled[name] = texts.get(name)  # None: the file named is not in the repository
            if name in parsed:
                todo += _defaults_paths(name, parsed[name])
        why = _why_not(path, parsed[path], fragments, launchers.get(path, set()))
        example = {"path": path, "selected": why is None, "why_not": why}
        if why is None:  # what check needs; the others are only counted
            example.update(text=texts[path], defaults_files=pulled)
        examples.append(example)
    return {"commit": commit, "examples": examples}


def check(example: dict, workdir: Path) -> tuple[str, str]:
    for rel, text in [(example["path"], example["text"]), *example["defaults_files"].items()]:
        if text is None:
            continue  # missing in ROLL too: composing reports it as ROLL's launcher would
        target = workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return check_argv(["--roll-config", str(workdir / example["path"])])
