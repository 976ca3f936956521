"""Where the rollout engine's own log lines go: all of them to a file beside the run's
metrics, only the warnings that ask something of the user to the console.

vLLM prints about 40 lines at start-up and 3 more at every weight sync; on the console they
bury the one metric line per step. vLLM (re)applies its logging config at import and at
every engine start, so ours is handed to it as a dictConfig file (`VLLM_LOGGING_CONFIG_PATH`).
The driver names the folder (`ENGINE_LOG_DIR_ENV`, set from `trainer.default_local_dir` and
passed to every worker); each rank appends to `engine_rank<R>.log` there. `HYBRID_DEBUG=1`,
or a `VLLM_LOGGING_CONFIG_PATH` of the user's, leaves vLLM's logging as vLLM sets it.

Some start-up notices bypass Python altogether: torch's C++ warnings (TORCH_WARN, e.g. the
NUMA binding notice of vLLM's CPU worker) are written by c10 straight to file descriptor 2,
and torch has no switch for them short of `TORCH_CPP_LOG_LEVEL`, which is read once at
import and would hide every C++ warning of the whole run. `stderr_to_engine_log` sends
descriptor 2 to the same file for the engine's construction only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator

ENGINE_LOG_DIR_ENV = "HYBRID_ENGINE_LOG_DIR"
CONFIG_PATH_ENV = "VLLM_LOGGING_CONFIG_PATH"
_WRITTEN: set[str] = set()  # config files this process wrote (not the user's)

# Warnings that are true on every run of this set-up and need nothing from the user:
# vLLM's CPU backend notices, its per-sync note about rotary embeddings (they have no
# weights to load), and Ray's notice that a local cluster uses token authentication (a
# token exists in ~/.ray). vLLM's still reach the log file.
HARMLESS_WARNINGS = re.compile(
    "|".join(
        [
            r"RotaryEmbedding: Failed to load weights",
            r"doesn't allow to use `torch\.set_num_threads`",
            r"is not found in LD_PRELOAD",
            r"Triton is (installed, but doesn't include CPU backend|not installed)",
            r"Triton is installed but 0 active driver",
            r"Triton not installed or not compatible",
            r"Model Runner V2 requires Triton",
            r"Inductor compilation was disabled",
            r"Enforce eager set, disabling torch\.compile",
            r"OMP_NUM_THREADS=\d+ is set; leaving Torch threads",
            r"Reset SSM cache type",
            r"The global random seed is set to",
            r"Token authentication is enabled for this Ray cluster",
        ]
    )
)


class HarmlessWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or not HARMLESS_WARNINGS.search(record.getMessage())


def drop_harmless_warnings(filterer: logging.Filterer) -> None:
    """Give a logger or handler the HarmlessWarnings filter, once."""
    if not any(isinstance(f, HarmlessWarnings) for f in filterer.filters):
        filterer.addFilter(HarmlessWarnings())


def debug_enabled() -> bool:
    return os.environ.get("HYBRID_DEBUG", "").lower() in ("1", "true", "yes")


def engine_log_path() -> str | None:
    folder = os.environ.get(ENGINE_LOG_DIR_ENV)
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"engine_rank{os.environ.get('RANK', '0')}.log")


def logging_config(log_path: str | None) -> dict:
    """The `dictConfig` vLLM applies to its loggers (at import and again when an engine
    starts): warnings worth reading to stdout, everything from INFO up to the file."""
    handlers = {
        "console": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
            "level": "WARNING",
            "filters": ["harmless"],
            "formatter": "console",
        }
    }
    if log_path:
        handlers["file"] = {"class": "logging.FileHandler", "filename": log_path, "level": "INFO", "formatter": "file"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"harmless": {"()": f"{__name__}.HarmlessWarnings"}},
        "formatters": {
            "console": {"format": "vllm %(levelname)s: %(message)s"},
            "file": {"format": "%(asctime)s %(levelname)s [%(name)s] %(message)s"},
        },
        "handlers": handlers,
        "loggers": {"vllm": {"handlers": list(handlers), "level": "INFO", "propagate": False}},
    }


def quiet_engine_before_import() -> str | None:
    """Point vLLM at our logging config (`VLLM_LOGGING_CONFIG_PATH`, unless the user set
    one or HYBRID_DEBUG=1); returns the engine log file's path. A few of vLLM's lines are
    logged during its import, before its config applies, through the root handlers: those
    get the same filter."""
    current = os.environ.get(CONFIG_PATH_ENV)
    if debug_enabled() or (current and current not in _WRITTEN):
        return None
    path = engine_log_path()
    fd, config_path = tempfile.mkstemp(prefix="hybrid-vllm-logging-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(logging_config(path), f)
    os.environ[CONFIG_PATH_ENV] = config_path
    _WRITTEN.add(config_path)
    if current:  # an earlier engine's config in this process (another run's folder)
        os.remove(current)
    # vLLM applies its logging config only when an engine starts; until then its records go
    # to the root handlers, or, in a process without any (a Ray worker), to logging's
    # last-resort stderr handler.
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None:
            drop_harmless_warnings(handler)
    # vLLM's own use of a deprecated torch name, printed with the source lines at import.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)
    return path


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # a closed or broken stream has nothing to flush
                stream.flush()


@contextlib.contextmanager
def stderr_to_engine_log(log_path: str | None) -> Iterator[None]:
    """Everything written to file descriptor 2 inside the block (C/C++ writes as well as
    Python's sys.stderr) is appended to `log_path` instead of reaching the console; the
    descriptor is restored on the way out, exception or not. `None` (HYBRID_DEBUG=1, the
    user's own vLLM logging config, no run folder) leaves stderr alone.

    For the engine's construction only: what it writes there is start-up chatter (torch's
    NUMA binding notice), its warnings worth reading go through vLLM's logger to stdout,
    and an exception still propagates with its message; a note then says where the
    engine's stderr output of the window went."""
    if not log_path:
        yield
        return
    _flush_python_streams()
    saved = os.dup(2)
    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.dup2(log_fd, 2)
        finally:
            os.close(log_fd)
        failed = False
        try:
            yield
        except Exception:
            failed = True
            raise
        finally:
            _flush_python_streams()
            os.dup2(saved, 2)
            if failed:
                print(
                    f"hybrid: the rollout engine's stderr output during its start is in {log_path}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        os.close(saved)
