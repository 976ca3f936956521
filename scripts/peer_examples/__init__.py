"""The peers' own example launch files, read the way `python -m hybrid.main_ppo` reads them.

Each dialect module here (skyrl.py, roll.py) has:

    REPOSITORY = "owner/name"
    extract(git_dir: Path) -> dict
        {"commit": sha, "examples": [{"path": str, "selected": bool, "why_not": str | None, ...}]}
        read from a git directory (no work tree needed): every example file of the repository, the
        FSDP/vLLM ones selected, the others with the reason they are not (Megatron, SGLang, ...).
        The result is kept in tests/data/peer_examples/<name>.json so counting needs no network.
    check(example: dict, workdir: Path) -> tuple[str, str]
        ("understood", "") or ("refused", reason) or ("error", reason), usually through
        `check_argv` below.

scripts/count_peer_examples.py runs both and writes the count into docs/config_dialects.md.
"""

from __future__ import annotations

import traceback

UNDERSTOOD, REFUSED, ERROR = "understood", "refused", "error"
LARGE_MACHINE_CORES = 4096


def check_argv(argv: list[str]) -> tuple[str, str]:
    """Translate a dialect command line and build the checked configuration, as main_ppo does
    before anything starts (the data files and model are not opened).

    A ConfigError or InputError is a refusal (the message says what to change); any other
    exception is an error: a traceback the user would have seen.

    The examples are written for their own machines (8 GPUs a node and more), so the one check
    that weighs the configuration against this machine's devices (engines beside the trainer
    need that many GPUs, or CPU cores; hybrid/config/rules_async.py) is given a machine large
    enough: the count judges whether hybrid understands the file, not whether this host fits it.
    """
    from unittest import mock

    from hybrid.config import ConfigError, build_config
    from hybrid.dialects import translate_argv
    from hybrid.errors import InputError

    try:
        with mock.patch("hybrid.config.rules_async.os.cpu_count", return_value=LARGE_MACHINE_CORES):
            build_config(translate_argv(list(argv)))
    except (ConfigError, InputError) as refusal:
        return REFUSED, " | ".join(line.strip() for line in str(refusal).splitlines() if line.strip())
    except Exception as exc:  # noqa: BLE001 - counted and reported, never hidden
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return ERROR, f"{type(exc).__name__}: {exc} ({frame.filename}:{frame.lineno})"
    return UNDERSTOOD, ""
