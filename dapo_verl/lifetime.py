"""Nothing a command starts outlives it: stop signals, and children that die with their parent.

A ``dapo-verl`` command that starts processes (a rehearsal's verl runs with their private Ray clusters and vLLM
engines, an ablation's workers, the reliability checks' commands) ends them however it ends itself.

* **Ctrl-C, SIGTERM, SIGHUP** (what ``timeout``, Slurm, systemd, CI cancellation and a closed terminal send).
  :func:`stop_signals`, held by the CLI around every command, turns SIGTERM and SIGHUP into whatever Ctrl-C does at
  that moment: the command's own SIGINT handler when it installed one (a training run stops at its next step
  boundary), else :class:`Stopped`, a :class:`KeyboardInterrupt`, so every ``except KeyboardInterrupt`` and
  ``finally`` that stops processes on Ctrl-C runs for these signals too. A later SIGTERM or SIGHUP is ignored so
  that the cleanup finishes, and the command exits with 128 + the signal's number (:meth:`StopSignals.exit_status`).
  A signal ignored when the command started (``nohup``'s SIGHUP) stays ignored.
* **SIGKILL of the command** (``kill -9``, the OOM killer) runs no code in it, so two things outside it act:

  - every child is started through :func:`dying_with_this_process` (or calls :func:`die_with_parent` first thing,
    as a process pool's initializer), which sets Linux's parent-death signal, ``prctl(PR_SET_PDEATHSIG,
    SIGKILL)``: the kernel kills the child when its parent dies. The signal is set in a tiny interpreter that then
    ``exec``\\ s the command (it survives ``exec``), not in a ``preexec_fn``, which is unsafe in a process with
    threads. It fires when the *thread* that started the child ends, so a child is started from a thread that
    outlives it.
  - that reaches direct children only; what they start in turn (Ray's daemons and workers, vLLM's engine processes)
    is re-parented when they die, and a rehearsal's watchdog stops it (:mod:`dapo_verl.rehearsal.reaper`).

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STOP_SIGNALS",
    "StopSignals",
    "Stopped",
    "die_with_parent",
    "dying_with_this_process",
    "signal_name",
    "stop_signals",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1

_EXEC_DYING_WITH_PARENT = f"""
import ctypes, os, sys
try:
    ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)})
except (AttributeError, OSError):
    pass  # not Linux: the watchdog alone stops what the command started
if os.getppid() != int(sys.argv[1]):
    os._exit(128 + {int(signal.SIGKILL)})  # the parent died before the signal was set
os.execvp(sys.argv[2], sys.argv[2:])
"""


def dying_with_this_process(command: Sequence[str]) -> list[str]:
    """``command`` started so that the kernel SIGKILLs it when this process (the thread starting it) dies.

    The process keeps its pid, command line and environment: a small interpreter sets the parent-death signal and
    then ``exec``\\ s ``command``.
    """
    return [sys.executable, "-I", "-S", "-c", _EXEC_DYING_WITH_PARENT, str(os.getpid()), *command]


def die_with_parent(parent: int) -> None:
    """In a child process: be SIGKILLed by the kernel when ``parent`` dies; exit at once if it already has."""
    import ctypes

    with contextlib.suppress(AttributeError, OSError):  # not Linux: nothing to set
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(128 + int(signal.SIGKILL))


# -- stop signals ------------------------------------------------------------------------------------------


def signal_name(signum: int) -> str:
    """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be (:func:`stop_signals`).

    Attributes:
        signum: The signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


@dataclass
class StopSignals:
    """What :func:`stop_signals` saw: ``signum`` is the first SIGTERM or SIGHUP received (None before any)."""

    signum: int | None = None

    def exit_status(self, status: int) -> int:
        """128 + the stop signal's number once one was received, else ``status``."""
        return status if self.signum is None else 128 + self.signum


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Turn SIGTERM and SIGHUP into Ctrl-C's clean stop for the block (in the main thread; elsewhere a no-op).

    The first one calls the SIGINT handler installed at that moment, or raises :class:`Stopped` where that is
    Python's own (which raises KeyboardInterrupt); later ones are ignored so that the stop's cleanup finishes.
    """
    stop = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.signum is not None:
            return  # a stop is under way: let its cleanup finish
        stop.signum = signum
        on_interrupt = signal.getsignal(signal.SIGINT)
        if callable(on_interrupt) and on_interrupt is not signal.default_int_handler:
            on_interrupt(signum, frame)  # the command's own Ctrl-C: a training run stops at its step boundary
            return
        raise Stopped(signum)

    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    installed = [number for number, old in previous.items() if old is not signal.SIG_IGN]
    for number in installed:
        signal.signal(number, handler)
    try:
        yield stop
    finally:
        for number in installed:
            old = previous[number]
            signal.signal(number, old if old is not None else signal.SIG_DFL)
