"""Train local runs side by side in worker processes, and stop them together: ``dapo-verl ablate --jobs N``.

:func:`train_runs` trains a list of runs ``jobs`` at a time (in this process when ``jobs`` is 1) and yields each
as it finishes. A run is handed to a worker only when one is free, so nothing is queued inside the pool.

Stopping. The first Ctrl-C (SIGINT; in the CLI also SIGTERM and SIGHUP, see :func:`dapo_verl.lifetime.stop_signals`)
starts no further run, and each run in training stops at its next step boundary with that step's checkpoint, as
``dapo-verl train`` does; then :class:`AblationInterrupted` is raised, and the same command continues (finished runs
are reused, stopped ones resume from their checkpoint). A second Ctrl-C ends the workers at once. The driver tells
the workers itself: each worker sits in a process group of its own, so the terminal's Ctrl-C reaches the driver
alone and a run never sees it twice (which would stop it at once, without its checkpoint). Between runs a worker
ignores SIGINT; SIGINT is blocked while a worker starts, until it has left the driver's process group. An error
in one run stops the others the same way before it is raised.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dapo_verl.lifetime import die_with_parent, signal_name

__all__ = ["AblationInterrupted", "PlannedTraining", "TrainOne", "train_runs"]

_stop_event: Any = None
"""In a worker process: the driver's stop (a ``multiprocessing.Event``), set before it signals the workers."""


class PlannedTraining(Protocol):
    """What :func:`train_runs` needs of a planned run (:class:`dapo_verl.local.ablate.PlannedRun`)."""

    @property
    def overrides(self) -> tuple[str, ...]: ...

    @property
    def run_dir(self) -> Path: ...


_Run = TypeVar("_Run", bound=PlannedTraining)
TrainOne = Callable[[Sequence[str], str], dict[str, Any]]
"""Trains one run: ``(overrides, run directory) -> the fields of its outcome``."""


class AblationInterrupted(RuntimeError):
    """Ctrl-C, SIGTERM or SIGHUP stopped the runs at their step boundary; no queued run was started."""


def _train(overrides: Sequence[str], run_dir: str) -> dict[str, Any]:
    """Train one run (in this process or a worker); returns the plain fields of its outcome."""
    from dapo_verl.local.train import run  # imported here: the worker process needs nothing else

    result = run(list(overrides), run_dir)
    return {
        "final_accuracy": result.final_accuracy,
        "final_exact": result.final_exact,
        "steps": result.steps,
        "wall_s": result.wall_s,
    }


def _train_in_worker(train: TrainOne, overrides: Sequence[str], run_dir: str) -> dict[str, Any] | None:
    """``train`` in a worker: None when the driver's stop ended the run at a step boundary, or before it began."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the run installs its own stop request on top
    try:
        if _stop_event.is_set():
            return None
        return train(overrides, run_dir)
    except KeyboardInterrupt:
        if _stop_event.is_set():
            return None
        raise
    except Exception as err:
        from dapo_verl.local.train import RunInterrupted  # imported by the run already

        if _stop_event.is_set() and isinstance(err, RunInterrupted):
            return None
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _init_worker(levels: Mapping[str, int], parent: int, stop: Any) -> None:
    """Make a worker die with ``parent`` (even when it is SIGKILLed), leave its process group, ignore SIGINT between
    runs (the driver's stop reaches it as ``stop`` and one SIGINT), and take the parent's log levels (a spawned
    process starts unconfigured)."""
    global _stop_event
    die_with_parent(parent)
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a Ctrl-C meant for the driver is dropped here
    _stop_event = stop
    from tqdm import tqdm  # the run's progress bar (disabled in a worker)

    tqdm.set_lock(threading.RLock())  # tqdm's own is a semaphore the resource tracker reports when a worker is ended
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


class _Stop:
    """What asked the runs to stop (``Ctrl-C``, ``SIGTERM``, ...), or None."""

    by: str | None = None


@contextlib.contextmanager
def _first_interrupt_stops(stop_runs: Callable[[], None]) -> Iterator[_Stop]:
    """For the block: the first SIGINT records itself and calls ``stop_runs``; a second raises KeyboardInterrupt."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.by is not None:
            raise KeyboardInterrupt
        stop.by = signal_name(signum)
        stop_runs()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _submit(pool: ProcessPoolExecutor, train: TrainOne, planned: PlannedTraining) -> Future[dict[str, Any] | None]:
    """Submit one run; a worker the pool starts now inherits SIGINT blocked (see :func:`_init_worker`)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(_train_in_worker, train, planned.overrides, str(planned.run_dir))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _workers(pool: ProcessPoolExecutor) -> list[Any]:
    return list((getattr(pool, "_processes", None) or {}).values())  # the pool has no public handle


def _kill(pool: ProcessPoolExecutor) -> None:
    for process in _workers(pool):
        process.kill()


def train_runs(
    pending: Sequence[_Run], jobs: int, levels: Mapping[str, int], *, train: TrainOne = _train
) -> Iterator[tuple[_Run, dict[str, Any]]]:
    """Train ``pending``, ``jobs`` at a time; yield each run with its outcome's fields as it finishes.

    Args:
        pending: The runs, in the order to start them.
        jobs: Runs trained at the same time; 1 trains in this process.
        levels: Logger name -> level, set in each worker.
        train: Trains one run from its overrides and directory and returns its outcome's fields; a module-level
            function (workers import it), which stops at a step boundary with ``RunInterrupted`` on SIGINT.

    Raises:
        AblationInterrupted: after Ctrl-C, SIGTERM or SIGHUP, once the runs in training stopped (see the module).
    """
    if jobs == 1 or len(pending) == 1:
        for planned in pending:
            yield planned, train(planned.overrides, str(planned.run_dir))
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's thread pools
    stop_event = context.Event()
    pool = ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_init_worker, initargs=(dict(levels), os.getpid(), stop_event)
    )

    def stop_runs() -> None:
        stop_event.set()  # before the signal: a worker that has not begun its run yet then skips it
        for process in _workers(pool):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGINT)

    queue, stopped = list(pending), 0
    running: dict[Future[dict[str, Any] | None], _Run] = {}
    try:
        with _first_interrupt_stops(stop_runs) as stop:
            while queue or running:
                while queue and len(running) < jobs and stop.by is None:
                    planned = queue.pop(0)
                    running[_submit(pool, train, planned)] = planned
                if not running:
                    break
                for future in wait(running, return_when=FIRST_COMPLETED).done:
                    planned, fields = running.pop(future), future.result()
                    if fields is None:
                        stopped += 1
                    else:
                        yield planned, fields
            if stop.by is not None:  # every run has stopped: end the idle workers now, not after their slow exit
                _kill(pool)
                raise AblationInterrupted(
                    f"stopped by {stop.by}: {stopped} run(s) in training stopped at a step boundary with a checkpoint "
                    f"and {len(queue)} queued run(s) were not started. Run the same command to continue (finished "
                    "runs are reused, stopped ones continue from their checkpoint)."
                )
    except KeyboardInterrupt:  # a second Ctrl-C: end the runs now (each continues from its last checkpoint)
        _kill(pool)
        raise
    except AblationInterrupted:
        raise
    except BaseException:  # an error in one run, or in the caller: stop the others before it is raised
        stop_runs()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
