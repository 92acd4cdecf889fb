"""The folders a rehearsal owns: its ``--out`` (one writer, its processes included) and its private temporary folders.

:func:`own_out` holds ``--out``'s lock for the rehearsal and refuses a folder that an earlier rehearsal's processes
still write into (its command was killed and they have not stopped yet), naming them. :func:`private_folders` makes
one private Ray folder per run and the bridges' site folder, and stops every process naming them and removes them
however the rehearsal ends -- through a :class:`~.reaper.Watchdog` when its command is killed outright.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dapo_verl.rehearsal.bridges.cpu_vllm import RECORD_ENV
from dapo_verl.rehearsal.processes import kill_leftovers
from dapo_verl.rehearsal.reaper import Watchdog, processes_with

__all__ = ["REHEARSAL_MARK", "RehearsalError", "live_processes", "own_out", "private_folders"]

REHEARSAL_MARK = ".rehearsal"
"""Written into ``--out`` as soon as a rehearsal owns it, so a rehearsal killed before its ``changes.json`` can
still be replaced with ``--overwrite``."""


class RehearsalError(RuntimeError):
    """The rehearsal could not start or a run failed; the message names the cause and the log."""


@contextlib.contextmanager
def own_out(out: Path, overwrite: bool) -> Iterator[None]:
    """Make ``out`` this rehearsal's for the block: one writer at a time, as a training run directory has.

    The folder's lock (:func:`dapo_verl.local.rundir.run_directory_lock`, ``out/.lock``) is held from before
    anything is removed until the report is written, and covers the rehearsal's processes too: a second rehearsal
    into a folder whose rehearsal still runs, or whose earlier rehearsal's processes still live (its command was
    killed and they have not stopped yet), is refused, ``--overwrite`` included. ``--overwrite`` empties only a
    folder that holds an earlier rehearsal (a ``changes.json`` or the :data:`REHEARSAL_MARK`), finished or failed,
    keeping the lock file it holds.

    Raises:
        RehearsalError: for a file, a folder that is not a rehearsal's, an earlier rehearsal without
            ``--overwrite``, or a rehearsal (or a process of one) still running there.
    """
    from dapo_verl.local.rundir import LOCK_FILE, RunDirectoryBusy, run_directory_lock

    if out.exists() and not out.is_dir():
        raise RehearsalError(f"--out {out} is a file; give a folder (new, empty, or an earlier rehearsal's).")
    entries = sorted(p for p in out.iterdir() if p.name not in (LOCK_FILE, REHEARSAL_MARK)) if out.is_dir() else []
    if entries and not ((out / "changes.json").exists() or (out / REHEARSAL_MARK).exists()):
        raise RehearsalError(
            f"--out {out} exists and is not a rehearsal folder (it has no changes.json); --overwrite "
            f"replaces only an earlier rehearsal's folder. Choose an empty or new folder."
        )
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(run_directory_lock(out))
        except RunDirectoryBusy as err:
            raise RehearsalError(
                f"--out {out} belongs to a rehearsal that is still running, and neither a second "
                f"rehearsal nor --overwrite may replace it: {err}"
            ) from None
        _refuse_live_processes(out)
        if entries and not overwrite:
            raise RehearsalError(
                f"--out {out} holds an earlier rehearsal; pass --overwrite to replace it or choose another folder."
            )
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        (out / REHEARSAL_MARK).write_text("This folder is written by `dapo-verl rehearse`.\n")
        yield


def live_processes(out: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every process of a rehearsal into ``out`` still alive: each run gives its processes
    its record folder and its metrics file under ``out`` in the environment, and Ray's and vLLM's inherit them."""
    return processes_with(out, RECORD_ENV, "VERL_FILE_LOGGER_PATH")


def _refuse_live_processes(out: Path) -> None:
    """Refuse ``out`` while processes of an earlier rehearsal into it still live: they still write into it."""
    live = live_processes(out)
    if not live:
        return
    named = ", ".join(f"pid {pid} ({command[:60]})" for pid, command in live[:4])
    more = f" and {len(live) - 4} more" if len(live) > 4 else ""
    raise RehearsalError(
        f"--out {out} is still in use by {len(live)} process(es) of an earlier rehearsal that outlived its command: "
        f"{named}{more}; they still write there, so neither a second rehearsal nor --overwrite may start. They stop "
        f"within seconds of their command's end: wait, or end them (kill -9 {' '.join(str(p) for p, _ in live)}), "
        f"then run the same command again."
    )


@contextlib.contextmanager
def private_folders(out: Path, cluster: bool = False) -> Iterator[tuple[list[str], Path]]:
    """One private Ray folder per run (the two overlap), with ``cluster`` a third for a multi-node cluster's nodes
    (:mod:`.cluster`, recording their sessions in ``out/cluster``), and the bridges' site folder, for the block.

    On leaving the block, however it is left, every process naming a Ray folder is stopped and the folders are
    removed. If this process dies first (SIGKILL), a :class:`~dapo_verl.rehearsal.reaper.Watchdog` does the same, stops
    the sessions the runs' drivers and the cluster's nodes lead and removes the shared memory the runs recorded
    (which each run's launch does otherwise).
    """
    # Short paths: Ray's socket paths must fit in 107 bytes.
    ray_dirs = [tempfile.mkdtemp(prefix="dvr-") for _ in range(3 if cluster else 2)]
    folders = [*ray_dirs, tempfile.mkdtemp(prefix="dvr-site-")]
    with Watchdog(str(out)) as watchdog:
        for ray_dir in ray_dirs:
            watchdog.kill(ray_dir)
        for records in [out / "run1" / "engine", out / "run2" / "engine", *([out / "cluster"] if cluster else [])]:
            watchdog.watch_records(records)
        for folder in folders:
            watchdog.remove(folder)
        try:
            yield ray_dirs, Path(folders[-1])
        finally:
            for ray_dir in ray_dirs:
                kill_leftovers(ray_dir)
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
