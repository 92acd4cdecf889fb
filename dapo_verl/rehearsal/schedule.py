"""The two runs of a rehearsal: the first run, then the resume run -- after it, or beside it -- and how they ended.

:func:`run_both` launches the first run (:func:`.processes.launch`) and, unless the rehearsal has no resume, the
resume run, which resumes from the first run's checkpoint of step ``steps - 1`` and trains the last step again. By
default the resume run starts once the first run has ended, so the rehearsal holds one trainer, one rollout engine
and one Ray cluster at a time. With ``overlap`` it starts together with the first run, in a Ray cluster of its own,
and waits at verl's checkpoint load (:mod:`.bridges.resume_barrier`) until the first run has logged the
checkpointed step and verl's tracker file names it: its start-up then uses the core the first run's start-up leaves
idle, at the price of two of everything in memory (docs/rehearse.md, "Memory").

A :class:`.memory.MemorySampler` follows both runs' processes throughout. A stop signal (Ctrl-C, SIGTERM, SIGHUP)
stops the run going and the resume run, whichever is up, and is kept in :attr:`Outcome.interrupted_by`; every run
that started is in :attr:`Outcome.runs` with how it ended, and a run that never started is in
:attr:`Outcome.not_started` with why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_verl import lifetime
from dapo_verl.rehearsal.bridges import resume_barrier
from dapo_verl.rehearsal.changes import Change
from dapo_verl.rehearsal.memory import MemoryPeaks, MemorySampler, Watched, out_of_memory_line
from dapo_verl.rehearsal.processes import RunRecord, kill_leftovers, launch_once_more_if_ray_did_not_start

if TYPE_CHECKING:
    from dapo_verl.rehearsal.options import RehearsalOptions

__all__ = ["FIRST", "RESUME", "Outcome", "Resume", "Target", "checkpointed_step", "run_both"]

FIRST, RESUME = "run1", "run2 (resume)"
"""The runs' names in the console, the logs and the report (their folders: ``run1``, ``run2``)."""


def _no_env(run: str, ray_dir: str) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Target:
    """Where a rehearsal's runs go and what each needs.

    Attributes:
        command: What starts a run, without overrides: the recipe's entry point (one node), or
            ``bash recipes/run_ray.sh CONFIG --follow`` (a job on the rehearsal's cluster, :mod:`.multinode`).
        checkpoints: verl's checkpoint folder of the run in the folder named (``run1``, ``run2``).
        env: Environment additions of the run named, given its private folder.
        metrics: verl's JSONL of the run named, where the run itself chooses it (None: ``runN/metrics.jsonl``, set
            through ``VERL_FILE_LOGGER_PATH``).
        sets_checkpoint_dir: Whether the resume run is given its checkpoint folder on the command line (else the
            recipe's own path, under the run's ``DAPO_OUTPUT_DIR``, applies).
    """

    command: list[str]
    checkpoints: Callable[[str], Path]
    env: Callable[[str, str], dict[str, str]] = _no_env
    metrics: Callable[[str], Path] | None = None
    sets_checkpoint_dir: bool = True


@dataclass
class Outcome:
    """How the runs of a rehearsal ended.

    Attributes:
        runs: Every run that started, in order, with how it ended (:attr:`.processes.RunRecord.state`).
        not_started: Each run that was to start and did not, with why.
        interrupted_by: The stop signal that ended the rehearsal ("Ctrl-C", "SIGTERM", "SIGHUP"), "" when none did.
        memory: The resident memory its processes held (:class:`.memory.MemoryPeaks`).
    """

    runs: list[RunRecord] = field(default_factory=list)
    not_started: dict[str, str] = field(default_factory=dict)
    interrupted_by: str = ""
    memory: MemoryPeaks = field(default_factory=MemoryPeaks)


def run_both(
    options: RehearsalOptions,
    target: Target,
    changes: Sequence[Change],
    out: Path,
    ray_dirs: Sequence[str],
    echo: Callable[[str], None],
) -> Outcome:
    """Run the first run and the resume run (see the module docstring) and say how each ended.

    Args:
        options: The rehearsal's options (``steps``, ``resume``, ``overlap``, ``timeout_s``, ``overrides``).
        target: What starts a run and what each run needs (:class:`Target`).
        changes: The rehearsal's changes to the recipe (the first run's; the resume run's own folders replace
            its checkpoint folder and Ray folder).
        out: The rehearsal's folder.
        ray_dirs: The private folder of each run (its Ray cluster's on one node; its sockets').
        echo: Prints a console line.
    """
    outcome = Outcome()
    resume = None
    if options.resume:
        barrier = Path(ray_dirs[1]) / "checkpoint-ready"
        resume = Resume(
            _resume_launcher(options, target, changes, out, ray_dirs[1], barrier, echo),
            target.checkpoints("run1"),
            options.steps - 1,
            barrier,
            options.timeout_s,
        )
    sampler = MemorySampler(
        [Watched(f"run{i + 1}", ray_dir, out / f"run{i + 1}" / "engine") for i, ray_dir in enumerate(ray_dirs)]
    ).start()
    try:
        if resume is not None and options.overlap:
            resume.start()
        first = launch_once_more_if_ray_did_not_start(
            FIRST,
            [*target.command, *options.overrides, *(c.override() for c in changes)],
            out / "run1",
            options.timeout_s,
            ray_dirs[0],
            options.steps,
            echo=echo,
            on_step=resume.on_step if resume else None,
            env=target.env("run1", ray_dirs[0]),
            metrics=target.metrics("run1") if target.metrics else None,
        )
        outcome.runs.append(first)
        outcome.interrupted_by = first.stopped_by if first.interrupted else ""
        if resume is not None and first.returncode == 0 and (second := resume.result()) is not None:
            outcome.runs.append(second)
    except KeyboardInterrupt as stop:  # outside a launch in this thread: waiting for the resume run, or before
        outcome.interrupted_by = lifetime.signal_name(stop.signum) if isinstance(stop, lifetime.Stopped) else "Ctrl-C"
    finally:
        if resume is not None:  # told before its processes are killed, so that it knows why it ended
            resume.stop(outcome.interrupted_by or "the first run did not finish", bool(outcome.interrupted_by))
        for ray_dir in ray_dirs:  # then a resume run's daemons, which hold its output open, so its thread returns
            kill_leftovers(ray_dir)
        stopped = resume.join() if resume is not None else None
        if stopped is not None and all(stopped is not run for run in outcome.runs):
            outcome.runs.append(stopped)
        outcome.memory = sampler.stop()
    _note_not_started(outcome, options.resume)
    for run in outcome.runs:
        if run.memory_kill:
            run.error = out_of_memory_line(
                run.name, run.log.parent.name, run.memory_kill, outcome.memory, options.overlap
            )
            echo(f"[{run.name}] {run.error}")
    return outcome


def _note_not_started(outcome: Outcome, resume: bool) -> None:
    started = {run.name for run in outcome.runs}
    before = f"the rehearsal was interrupted by {outcome.interrupted_by} before it started"
    if FIRST not in started:
        outcome.not_started[FIRST] = before
    if resume and RESUME not in started:
        first = next((run for run in outcome.runs if run.name == FIRST), None)
        outcome.not_started[RESUME] = (
            before
            if outcome.interrupted_by or first is None
            else f"the first run {first.state}; the resume run needs its checkpoint"
        )


def _resume_launcher(
    options: RehearsalOptions,
    target: Target,
    changes: Sequence[Change],
    out: Path,
    ray_dir: str,
    barrier: Path,
    echo: Callable[[str], None],
) -> Callable[..., RunRecord]:
    """The resume run's launch: the first run's command, resuming from its checkpoint of step ``steps - 1`` once
    ``barrier`` exists. Overlapped, its time limit covers the first run's too."""

    def own_ray(change: Change) -> Change:
        return replace(change, rehearsal=ray_dir) if change.key == "ray_kwargs.ray_init._temp_dir" else change

    own = ("trainer.default_local_dir", "trainer.resume_mode")
    folder = [f"trainer.default_local_dir={target.checkpoints('run2')}"] if target.sets_checkpoint_dir else []
    resumed = [
        *target.command,
        *options.overrides,
        *(own_ray(c).override() for c in changes if c.key not in own),
        *folder,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={target.checkpoints('run1') / f'global_step_{options.steps - 1}'}",
        "trainer.val_before_train=false",
    ]
    env = {
        **target.env("run2", ray_dir),
        resume_barrier.ENV: str(barrier),
        resume_barrier.TIMEOUT_ENV: str(options.timeout_s),
    }
    metrics = target.metrics("run2") if target.metrics else None
    limit_s = (2 if options.overlap else 1) * options.timeout_s

    def launch(**hooks: Any) -> RunRecord:
        return launch_once_more_if_ray_did_not_start(
            RESUME, resumed, out / "run2", limit_s, ray_dir, options.steps, echo=echo, env=env, metrics=metrics, **hooks
        )

    return launch


def checkpointed_step(checkpoints: Path) -> int:
    """The step verl's tracker file says was last checkpointed under ``checkpoints`` (0 before any)."""
    try:
        return int((checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


class Resume:
    """The resume run, in a thread: started with the first run (or after it), released once its checkpoint is on
    disk.

    Args:
        launch: Runs the resume process to its end (given ``on_start``, which records the process, and
            ``stopped``, which says whether :meth:`stop` stopped it).
        checkpoints: The first run's checkpoint folder.
        step: The checkpointed step the resume starts from.
        barrier: The file whose existence lets the resume run load the checkpoint
            (:mod:`.bridges.resume_barrier`).
        timeout_s: How long to wait for verl's tracker file to name ``step`` once the step was logged.
    """

    def __init__(
        self, launch: Callable[..., RunRecord], checkpoints: Path, step: int, barrier: Path, timeout_s: float
    ) -> None:
        self._launch, self._checkpoints, self._step = launch, checkpoints, step
        self.barrier, self._timeout_s = barrier, timeout_s
        self._thread: threading.Thread | None = None
        self._record: RunRecord | None = None
        # Set when the thread's launch has returned. Waited on instead of Thread.join: a KeyboardInterrupt inside
        # Thread.join can leave the thread marked as stopped while it still runs (CPython gh-90882, before 3.13), and
        # a later join then returns before the run's record exists.
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._process: subprocess.Popen | None = None
        self._stopped = threading.Event()
        self._stopped_by: tuple[str, bool] = ("", False)

    def start(self) -> None:
        """Start the resume run now; it starts up and then waits for :attr:`barrier`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rehearsal-resume", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._record = self._launch(on_start=self._started, stopped=self._stopped_why)
        except BaseException as err:  # re-raised by result() in the main thread
            self._error = err
        finally:
            self._done.set()

    def _started(self, process: subprocess.Popen) -> None:
        self._process = process
        if self._stopped.is_set():
            os.killpg(process.pid, signal.SIGKILL)

    def _stopped_why(self) -> tuple[str, bool] | None:
        return self._stopped_by if self._stopped.is_set() else None

    def on_step(self, step: int) -> None:
        """The first run logged ``step`` (verl saves before it logs): release the resume run once the tracker
        file names the checkpointed step (an asynchronous save may still be writing when the step is logged)."""
        if step == self._step:
            threading.Thread(target=self._release_when_saved, name="rehearsal-release", daemon=True).start()

    def _release_when_saved(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        while checkpointed_step(self._checkpoints) < self._step:
            if self._stopped.wait(0.2) or time.monotonic() > deadline:
                return
        self.release()

    def release(self) -> None:
        """Let the resume run load the checkpoint (idempotent)."""
        self.barrier.touch()

    def result(self) -> RunRecord | None:
        """Release the resume run (starting it if it was not started with the first), wait for it, and return its
        record (None only if its launch returned none)."""
        self.release()
        self.start()
        while not self._done.wait(0.5):  # short waits keep Ctrl-C responsive
            pass
        if self._error is not None:
            raise self._error
        return self._record

    def stop(self, by: str = "the rehearsal stopped it", interrupted: bool = False) -> None:
        """Stop the resume run if it is running (its process group; its Ray daemons, which hold its output open,
        go with :func:`.processes.kill_leftovers`), recording ``by`` (a stop signal when ``interrupted``) as what
        stopped it. It never starts after this."""
        if not self._stopped.is_set():
            self._stopped_by = (by, interrupted)
            self._stopped.set()
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)

    def join(self) -> RunRecord | None:
        """Wait for the resume run's thread; return its record, None when it never started."""
        if self._thread is not None:
            self._done.wait()
        return self._record
