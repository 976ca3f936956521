"""Where the rollout engine's own log lines go: all of them to a file beside the run's
metrics, only the warnings that ask something of the user to the console.

vLLM prints about 40 lines at start-up and 3 more at every weight sync; on the console they
bury the one metric line per step. The driver names the folder (`ENGINE_LOG_DIR_ENV`, set
from `trainer.default_local_dir` and passed to every worker); each rank appends to
`engine_rank<R>.log` there. `HYBRID_DEBUG=1` leaves vLLM's console output as vLLM sets it.
"""

from __future__ import annotations

import logging
import os
import re

ENGINE_LOG_DIR_ENV = "HYBRID_ENGINE_LOG_DIR"

# Warnings of vLLM's that are true on every run of this set-up and need nothing from the
# user: the CPU backend's notices and the per-sync note about rotary embeddings (they
# have no weights to load). They still reach the log file.
HARMLESS_WARNINGS = re.compile(
    "|".join(
        [
            r"RotaryEmbedding: Failed to load weights",
            r"doesn't allow to use `torch\.set_num_threads`",
            r"is not found in LD_PRELOAD",
            r"Triton is (installed, but doesn't include CPU backend|not installed)",
            r"Model Runner V2 requires Triton",
            r"Inductor compilation was disabled",
            r"Enforce eager set, disabling torch\.compile",
            r"OMP_NUM_THREADS=\d+ is set; leaving Torch threads",
            r"Reset SSM cache type",
            r"The global random seed is set to",
        ]
    )
)


class HarmlessWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or not HARMLESS_WARNINGS.search(record.getMessage())


def _debug() -> bool:
    return os.environ.get("HYBRID_DEBUG", "").lower() in ("1", "true", "yes")


def quiet_engine_before_import() -> None:
    """vLLM reads its console level once, at import: warnings and up, unless debugging.
    A few harmless ones are logged during the import itself, through the root handlers."""
    if _debug():
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, HarmlessWarnings) for f in handler.filters):
            handler.addFilter(HarmlessWarnings())


def route_engine_logs() -> str | None:
    """After vLLM is imported: its console handlers keep the warnings worth reading, a file
    gets everything from INFO up. Returns the file's path (None when no folder was named)."""
    if _debug():
        return None
    logger = logging.getLogger("vllm")
    for handler in logger.handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(max(handler.level, logging.WARNING))
            if not any(isinstance(f, HarmlessWarnings) for f in handler.filters):
                handler.addFilter(HarmlessWarnings())
    folder = os.environ.get(ENGINE_LOG_DIR_ENV)
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"engine_rank{os.environ.get('RANK', '0')}.log")
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == os.path.abspath(path) for h in logger.handlers):
        file_handler = logging.FileHandler(path)
        file_handler.setLevel(logging.INFO)
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(name)s] %(message)s"))
        logger.addHandler(file_handler)
    logger.setLevel(logging.INFO)
    return path
