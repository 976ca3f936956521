"""Every key of SkyRL's and ROLL's own configuration classes and of verl's generated
ppo_trainer.yaml, read from a checkout of each repository, written to
tests/data/peer_config_keys.json with the commit it came from; SkyRL's defaults also go to
hybrid/dialects/skyrl_default_values.py, the table the SkyRL dialect fills keys not given from.

The examples the dialects are measured on use only some of the keys; a user's file may set any
of them. tests/unit/test_peer_config_keys.py checks that every key listed here is known to the
dialect (mapped, a documented no-op, or refused with its reason), offline, from that file.

    python -m scripts.peer_config_keys [--skyrl DIR] [--roll DIR] [--verl DIR] [--out PATH] [--skyrl-defaults PATH]

DIR is a git directory (a bare mirror works): the files are read with `git show HEAD:path`. The
classes are dataclasses; their modules import parts of their repository that only matter at run
time (logging, device platform, the inference servers), which are replaced by small stand-ins in
a temporary folder so the classes can be imported and walked here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

SKYRL_FILES = ("skyrl/train/config/config.py",)
ROLL_FILES = (
    "roll/configs/__init__.py",
    "roll/configs/base_config.py",
    "roll/configs/data_args.py",
    "roll/configs/generating_args.py",
    "roll/configs/model_args.py",
    "roll/configs/training_args.py",
    "roll/configs/worker_config.py",
    "roll/pipeline/agentic/agentic_config.py",
    "roll/pipeline/rlvr/rlvr_config.py",
)
# Stand-ins for the run-time imports of those modules (what each name is used for there: a
# logger, a device platform object, two megatron batch helpers, a cloud-path test).
ROLL_STANDINS = {
    "roll/utils/logging.py": "import logging\n\ndef get_logger(*a, **k):\n    return logging.getLogger('roll')\n",
    "roll/utils/config_utils.py": (
        "def calculate_megatron_dp_size(*a, **k):\n    return 1\n\n"
        "def validate_megatron_batch_size(*a, **k):\n    return None\n"
    ),
    "roll/platforms.py": "class _P:\n    device_type = 'cuda'\n\n    def __getattr__(self, n):\n        return None\n\n"
    "current_platform = _P()\n",
}
SKYRL_STANDINS = {
    "skyrl/backends/skyrl_train/utils/io/io.py": (
        "def is_cloud_path(p):\n    return str(p).startswith(('s3://', 'gs://', 'gcs://'))\n"
    ),
}


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def _materialise(repo: str, files: tuple[str, ...], standins: dict[str, str], root: Path) -> str:
    for path in files:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(_git(repo, "show", f"HEAD:{path}"))
    for path, text in standins.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    for folder in {p.parent for p in root.rglob("*.py")}:
        while folder != root:
            (folder / "__init__.py").touch(exist_ok=True)
            folder = folder.parent
    return _git(repo, "rev-parse", "HEAD").strip()


def _default(field: dataclasses.Field) -> typing.Any:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        try:
            value = field.default_factory()
        except Exception as err:  # a factory needing run-time state: named, not guessed
            return f"<default from {getattr(field.default_factory, '__name__', 'a factory')}: {type(err).__name__}>"
    else:
        return "<required>"
    return json.loads(json.dumps(value, default=lambda v: repr(v)))


def walk(cls: type, prefix: str = "", seen: tuple[type, ...] = ()) -> dict[str, typing.Any]:
    """Leaf keys of a dataclass (nested dataclass fields, Optional ones included, are descended
    into), each with its default."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # forward references to names the stand-ins lack: the raw annotations
        hints = {}
    out: dict[str, typing.Any] = {}
    for field in dataclasses.fields(cls):
        kind = hints.get(field.name, field.type)
        nested = [t for t in (kind, *typing.get_args(kind)) if inspect.isclass(t) and dataclasses.is_dataclass(t)]
        if nested and nested[0] not in seen:
            out.update(walk(nested[0], f"{prefix}{field.name}.", (*seen, nested[0])))
        else:
            out[f"{prefix}{field.name}"] = _default(field)
    return out


def _import(root: Path, module: str) -> typing.Any:
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(root))


def skyrl_keys(repo: str) -> dict[str, typing.Any]:
    with tempfile.TemporaryDirectory() as tmp:
        commit = _materialise(repo, SKYRL_FILES, SKYRL_STANDINS, Path(tmp))
        config = _import(Path(tmp), "skyrl.train.config.config")
        return {"commit": commit, "SkyRLTrainConfig": walk(config.SkyRLTrainConfig)}


def roll_keys(repo: str) -> dict[str, typing.Any]:
    with tempfile.TemporaryDirectory() as tmp:
        commit = _materialise(repo, ROLL_FILES, ROLL_STANDINS, Path(tmp))
        rlvr = _import(Path(tmp), "roll.pipeline.rlvr.rlvr_config")
        agentic = _import(Path(tmp), "roll.pipeline.agentic.agentic_config")
        return {"commit": commit, "RLVRConfig": walk(rlvr.RLVRConfig), "AgenticConfig": walk(agentic.AgenticConfig)}


def verl_keys(repo: str) -> dict[str, typing.Any]:
    """The leaves of verl's _generated_ppo_trainer.yaml (the FSDP trainer's whole composed config),
    each with its default; a mapping with no keys is a leaf of its own."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    tree = OmegaConf.create(_git(repo, "show", "HEAD:verl/trainer/config/_generated_ppo_trainer.yaml"))

    def leaves(node: DictConfig, prefix: str) -> dict[str, typing.Any]:
        out: dict[str, typing.Any] = {}
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and len(child):
                out.update(leaves(child, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = (
                    OmegaConf.to_container(child, resolve=False)
                    if isinstance(child, (DictConfig, ListConfig))
                    else child._value()
                )
        return out

    return {"commit": _git(repo, "rev-parse", "HEAD").strip(), "ppo_trainer": leaves(tree, "")}


def _literal(value: typing.Any) -> str:
    """A JSON value as Python source, strings in double quotes (as ruff format writes them)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _entry(key: str, value: typing.Any) -> list[str]:
    line = f"    {_literal(key)}: {_literal(value)},"
    if len(line) <= 120 or not isinstance(value, dict):
        return [line]
    return [f"    {_literal(key)}: {{", *(f"        {_literal(k)}: {_literal(v)}," for k, v in value.items()), "    },"]


def skyrl_defaults_module(found: dict[str, typing.Any]) -> str:
    """The text of hybrid/dialects/skyrl_default_values.py: SkyRL's default for each key of its
    config classes that has one (required keys and factories needing run-time state left out)."""
    defaults = {k: v for k, v in found["SkyRLTrainConfig"].items() if not (isinstance(v, str) and v.startswith("<"))}
    lines = [
        '"""SkyRL\'s own defaults: every key of SkyRLTrainConfig (skyrl/train/config/config.py) with its',
        "default, at SkyRL commit COMMIT. Generated by `python -m scripts.peer_config_keys`; do not edit.",
        "",
        "The SkyRL dialect (hybrid/dialects/skyrl_defaults.py) gives keys a user does not set these values.",
        '"""',
        "",
        "from typing import Any",
        "",
        f'COMMIT = "{found["commit"]}"',
        "",
        "DEFAULTS: dict[str, Any] = {",
        *(line for k, v in sorted(defaults.items()) for line in _entry(k, v)),
        "}",
        "",
    ]
    return "\n".join(lines).replace("COMMIT.", found["commit"][:12] + ".", 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skyrl", default="/work/.mirror/NovaSky-AI+SkyRL/repo")
    parser.add_argument("--roll", default="/work/.mirror/alibaba+ROLL/repo")
    parser.add_argument("--verl", default="/work/.mirror/volcengine+verl/repo")
    parser.add_argument("--out", default="tests/data/peer_config_keys.json")
    parser.add_argument("--skyrl-defaults", default="hybrid/dialects/skyrl_default_values.py")
    args = parser.parse_args(argv)
    keys = {"skyrl": skyrl_keys(args.skyrl), "roll": roll_keys(args.roll), "verl": verl_keys(args.verl)}
    Path(args.out).write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    Path(args.skyrl_defaults).write_text(skyrl_defaults_module(keys["skyrl"]))
    for name, found in keys.items():
        sizes = ", ".join(f"{cls} {len(v)}" for cls, v in found.items() if cls != "commit")
        print(f"{name} {found['commit'][:12]}: {sizes} keys")


if __name__ == "__main__":
    main()
