"""SIGTERM and Ctrl-C: what a run does when a scheduler preempts it or a person stops it.

`StopSignals` installs handlers for SIGTERM and SIGINT for the duration of a `with` block
and puts the previous handlers back at its end. Two modes:

- `defer=False` (loading: models, engines, data): a signal stops the run at once by
  raising `RunStopped`; nothing has been trained, so nothing is lost.
- `defer=True` (the training loop): a signal only records the request; the trainer looks
  at `requested` at its safe points (between steps, after the step's checkpoint), saves
  and raises `RunStopped` itself. A checkpoint being written is finished first. A second
  Ctrl-C raises KeyboardInterrupt at once.

Handlers can only be installed from the main thread; elsewhere the block runs without
them (the signals keep whatever handling they had).
"""

from __future__ import annotations

import os
import signal
import threading

from hybrid.errors import RunStopped

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    def __init__(self, defer: bool, save_on_stop: bool | None = None):
        self.defer = defer
        self.save_on_stop = save_on_stop
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            # None: the previous handler was not installed from Python and cannot be put back.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, whatever is running
        if not self.defer:
            raise RunStopped(signum)
        if self.requested:
            return  # a repeated SIGTERM changes nothing: the stop is on its way
        self.signum = signum
        _say(_stopping_message(signum, self.save_on_stop))


def _stopping_message(signum: int, save_on_stop: bool | None) -> str:
    name = signal.Signals(signum).name
    if save_on_stop:
        then = "save a checkpoint and exit"
    else:
        then = "exit without saving (trainer.save_on_stop=false)"
    again = "; press Ctrl-C again to exit at once" if signum == signal.SIGINT else ""
    return f"\nhybrid: {name} received: finishing the current step, then I will {then}{again}\n"


def _say(text: str) -> None:
    # os.write, not print: a handler can run while the main thread is inside a print to
    # the same stream, and a buffered write from here would then fail as reentrant.
    os.write(2, text.encode())


__all__ = ["STOP_SIGNALS", "StopSignals"]
