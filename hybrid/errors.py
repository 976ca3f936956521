"""How a run ends when something goes wrong: the error types of the entry point, and the
one place that turns an exception into a `hybrid: ...` message on stderr and an exit status.

Exit statuses: 2 for a mistake found before training starts (configuration, inputs, a
checkpoint to resume from), 1 for one found during training (a reward function that
raises, a worker that dies) and for unexpected errors, 128 + the signal for a run stopped
by SIGTERM (143) or Ctrl-C (130).

An error we can name prints its message only: our own types, and the exceptions whose
message starts with the config key it is about (`custom_reward_function.path: ...`), which
is how the rest of the code base words a mistake it recognises. When the user's own code
(a reward function, an environment, a dataset class) raised underneath, its traceback is
shown too, cut to the user's frames. Anything else is a bug or a library failure and keeps
its whole traceback. `HYBRID_DEBUG=1` (or Hydra's `HYDRA_FULL_ERROR=1`) prints the whole
traceback for every error.

This module imports only the standard library: the entry point uses it before the config
is composed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import sysconfig
import traceback
from collections.abc import Iterator

EXIT_DURING_TRAINING = 1
EXIT_BEFORE_TRAINING = 2

# Error types of other modules that carry a complete message (matched by name: importing
# them here would load torch, Ray or the config package before the entry point needs them).
NAMED_ERRORS = frozenset(
    {
        "hybrid.config.loading.ConfigError",
        "hybrid.data.DataError",
        "hybrid.checkpoint_folders.CheckpointError",
        "reward.manager_base.RewardFunctionError",
        "reward.environments.base.EnvironmentFailed",
        "hybrid.controller.ray_worker_group.WorkerFailedError",
    }
)
# Types that mean "the input is wrong" wherever they are raised: always status 2.
INPUT_ERRORS = frozenset({"hybrid.config.loading.ConfigError"})
CONFIG_SECTIONS = (
    "data",
    "actor_rollout_ref",
    "critic",
    "reward_model",
    "custom_reward_function",
    "algorithm",
    "trainer",
)
_KEY_FIRST = re.compile(r"^(" + "|".join(CONFIG_SECTIONS) + r")\.[A-Za-z_][\w.]*\s*(?::|=|is |must |needs )")
# Our packages: frames there are not the user's.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN_DIRS = tuple(os.path.join(_REPO, name) + os.sep for name in ("hybrid", "workers", "reward", "protocol", "scripts"))
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p) + os.sep
        for p in (sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    }
)

_phase = {"training": False}


class HybridError(Exception):
    """A mistake the message fully describes (what, where, what to do); no traceback."""

    exit_status: int | None = None  # None: by phase (2 before training starts, 1 during)


class InputError(HybridError):
    """Inputs the run cannot use, found before anything loads: one line per problem.

    `causes` are the exceptions behind some of the problems (a reward file that failed to
    import): their user-code frames are shown under the message.
    """

    exit_status = EXIT_BEFORE_TRAINING

    def __init__(self, problems: list[str], causes: list[BaseException] | tuple = ()):
        self.problems = list(problems)
        self.causes = list(causes)
        if len(self.problems) == 1:
            super().__init__(self.problems[0])
            return
        header = f"invalid inputs ({len(self.problems)} problems):"
        super().__init__("\n".join([header] + [f"  - {p}" for p in self.problems]))


class RunStopped(HybridError):
    """Training stopped on SIGTERM or SIGINT: at a safe point (with the checkpoint saved
    there, when checkpointing is on), or at once while the run was still loading."""

    def __init__(
        self,
        signum: int,
        step: int | None = None,
        total: int | None = None,
        checkpoint: str | None = None,
        save_on_stop: bool | None = None,
    ):
        self.signum = int(signum)
        self.exit_status = 128 + self.signum
        self.step, self.checkpoint = step, checkpoint
        name = signal.Signals(self.signum).name
        if step is None:  # outside the training loop
            when = "after training" if _phase["training"] else "before training started"
            super().__init__(f"stopped by {name} {when}; nothing to save")
            return
        where = f"after step {step}" + (f" of {total}" if total else "") if step else "before the first step"
        if checkpoint:
            saved = f"checkpoint: {checkpoint}; run the same command to resume from it (trainer.resume_mode=auto)"
        elif save_on_stop is False:
            saved = "nothing saved: trainer.save_on_stop=false (set it true to save the finished step on a stop)"
        else:
            saved = "nothing to save"
        super().__init__(f"stopped by {name} {where}; {saved}")


# ----------------------------------------------------------------------------- phase


def mark_training_started() -> None:
    """From here on, a failure is found during training (exit status 1, not 2)."""
    _phase["training"] = True


def reset_phase() -> None:
    _phase["training"] = False


# ----------------------------------------------------------------------------- classifying


def _qualified_names(exc: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}


def is_named(exc: BaseException) -> bool:
    """True for an error whose message says it all (see the module docstring)."""
    if isinstance(exc, HybridError) or _qualified_names(exc) & NAMED_ERRORS:
        return True
    return bool(_KEY_FIRST.match(str(exc)))


def exit_status(exc: BaseException) -> int:
    if isinstance(exc, KeyboardInterrupt):
        return 128 + signal.SIGINT
    if isinstance(exc, HybridError) and exc.exit_status is not None:
        return exc.exit_status
    if _qualified_names(exc) & INPUT_ERRORS:
        return EXIT_BEFORE_TRAINING
    if (is_named(exc) or user_traceback(exc)) and not _phase["training"]:
        return EXIT_BEFORE_TRAINING
    return EXIT_DURING_TRAINING


def debug_enabled() -> bool:
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("HYBRID_DEBUG", "HYDRA_FULL_ERROR")
    )


# ----------------------------------------------------------------------------- user frames


def is_user_file(filename: str) -> bool:
    """A file of the user's (not ours, not the standard library's or an installed package's)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_OWN_DIRS) and not path.startswith(_LIBRARY_DIRS)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def user_traceback(exc: BaseException) -> str:
    """The traceback of the user's code under `exc` (its own or a cause's), starting at the
    first user frame; '' when no user code is involved."""
    candidates = list(_chain(exc))
    if isinstance(exc, InputError):
        for cause in exc.causes:
            candidates.extend(_chain(cause))
    parts = []
    for err in candidates:
        frames = list(traceback.walk_tb(err.__traceback__))
        # User frames below the last of ours: the error came out of the user's code (a
        # user script calling run_ppo sits above ours and does not count).
        files = [frame.f_code.co_filename for frame, _ in frames]
        last_ours = max((i for i, f in enumerate(files) if os.path.abspath(f).startswith(_OWN_DIRS)), default=-1)
        mine = [i for i, f in enumerate(files) if i > last_ours and is_user_file(f)]
        # A user file that fails to compile raises SyntaxError with no frame of its own.
        syntax = isinstance(err, SyntaxError) and is_user_file(err.filename or "")
        if not mine and not syntax:
            continue
        # From the first user frame to the last: the library frames under the user's call
        # and ours above it are not what the user needs to fix.
        stack = traceback.StackSummary.extract(frames[mine[0] : mine[-1] + 1] if mine else [])
        text = "".join(stack.format()) + "".join(traceback.format_exception_only(type(err), err))
        parts.append("Traceback (your code; HYBRID_DEBUG=1 shows the whole trace):\n" + text)
    return "".join(dict.fromkeys(parts))  # one copy when a cause is listed twice


# ----------------------------------------------------------------------------- reporting


def format_error(exc: BaseException, prog: str = "hybrid", debug: bool = False) -> str:
    """What the user reads for `exc`: a traceback when one helps (the user's frames; the
    whole one for an unexpected error or with `debug`), then the `hybrid: ...` message."""
    user = user_traceback(exc)
    if isinstance(exc, KeyboardInterrupt):
        message, trace = "interrupted (Ctrl-C); steps since the last checkpoint are lost", ""
    elif _qualified_names(exc) & INPUT_ERRORS:
        message, trace = f"configuration error:\n{exc}", user
    elif is_named(exc):
        message, trace = str(exc), user
    elif user:
        message, trace = f"your code raised {type(exc).__name__}: {exc}", user
    else:
        message = f"unexpected error {type(exc).__name__}: {exc} (the traceback above says where)"
        trace = "".join(traceback.format_exception(exc))
    if debug:
        trace = "".join(traceback.format_exception(exc))
    return f"{trace}{prog}: {message}\n"


def _close_progress_bars() -> None:
    """End any progress bar still open (a failure in the middle of training), so the message
    starts on a line of its own. tqdm is looked up, not imported: see the module docstring."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def report(exc: BaseException, prog: str = "hybrid") -> int:
    """Print `exc` for the user on stderr; returns the exit status."""
    text = format_error(exc, prog, debug_enabled())
    _close_progress_bars()
    sys.stdout.flush()
    sys.stderr.write(text)
    sys.stderr.flush()
    return exit_status(exc)


@contextlib.contextmanager
def exit_on_error(prog: str = "hybrid"):
    """Run the body; on any exception print it (`report`) and exit with its status.

    Each program run starts before training (a process may run several: tests, notebooks),
    so the phase is reset on entry."""
    reset_phase()
    try:
        yield
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure ends here, reported, never dropped
        raise SystemExit(report(exc, prog)) from None


__all__ = [
    "EXIT_BEFORE_TRAINING",
    "EXIT_DURING_TRAINING",
    "HybridError",
    "InputError",
    "RunStopped",
    "debug_enabled",
    "exit_on_error",
    "exit_status",
    "format_error",
    "is_named",
    "is_user_file",
    "mark_training_started",
    "report",
    "reset_phase",
    "user_traceback",
]
