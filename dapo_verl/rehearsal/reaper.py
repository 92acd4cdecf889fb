"""What a rehearsal starts ends with it, SIGKILL included: finding a run's processes, stopping them, and the watchdog.

A rehearsal's children die with it (:func:`dapo_verl.lifetime.dying_with_this_process`), but that reaches direct
children only: Ray's daemons and workers and vLLM's engine processes are started by the child and re-parented when
it dies. A :class:`Watchdog` -- a standard-library-only process in a session of its own, so signals sent to the
command's process group miss it -- reads cleanup tasks from a pipe whose only writer is the command. When the command
ends, however it ends, the kernel closes the pipe and the watchdog reads its end at once (a pid poll would be slower
and could be fooled by pid reuse). Unless the command said ``done`` first (it cleaned up itself), the watchdog then
SIGKILLs every process that names one of the run's private markers -- the run's Ray temporary directory: Ray's
daemons name it in their command lines, the other processes in the environment they inherit -- with every process
in those processes' groups, and every process of the sessions the run's drivers lead (:func:`record_session`; Ray's
dashboard and runtime-env agents blank both markers when they retitle themselves, and their raylet dies with the
driver, but they stay in its session). It then unlinks the shared-memory segments the run's processes recorded
(:func:`remove_recorded`), removes the run's temporary folders (its sockets live there) and exits.

Everything here is standard library, and the watchdog runs this file as a script (``python -I -S``), so it starts
in milliseconds and holds a few MiB while it waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "SESSION_RECORD_PREFIX",
    "SHM_RECORD_PREFIX",
    "SHM_ROOT",
    "Watchdog",
    "kill_marked",
    "kill_recorded_sessions",
    "kill_session",
    "processes_naming",
    "processes_with",
    "record_session",
    "recorded_names",
    "remove_recorded",
    "start_time",
]

SHM_ROOT = Path("/dev/shm")
SHM_RECORD_PREFIX = "dev-shm-"
"""Each process of a rehearsal records the ``/dev/shm`` names it creates in ``<records>/dev-shm-<pid>.txt``."""
SESSION_RECORD_PREFIX = "session-"
"""A run's launch records the session its driver leads in ``<records>/session-<pid>.txt`` (:func:`record_session`)."""

_KILL_PASSES, _KILL_PAUSE_S = 20, 0.1  # rounds of kills: a dying raylet may still start a worker


# -- finding and stopping a run's processes --------------------------------------------------------------------


def _processes(matches: Callable[[bytes, bytes], bool]) -> list[tuple[int, str]]:
    """(pid, command line) of every other process whose command line and environment satisfy ``matches``."""
    found, own = [], os.getpid()
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(pid_dir.name)
            if pid == own:
                continue
            cmdline, environ = (pid_dir / "cmdline").read_bytes(), (pid_dir / "environ").read_bytes()
        except (OSError, ValueError):  # gone meanwhile, or another user's
            continue
        if matches(cmdline, environ):
            found.append((pid, cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def processes_naming(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every other process whose command line or environment contains ``marker``."""
    text = marker.encode()
    return _processes(lambda cmdline, environ: text in cmdline or text in environ)


def processes_with(folder: str | os.PathLike[str], *variables: str) -> list[tuple[int, str]]:
    """(pid, command line) of every other process whose environment sets one of ``variables`` to ``folder`` or a
    path in it."""
    exact = tuple(f"{variable}={folder}".encode() for variable in variables)
    inside = tuple(f"{variable}={folder}/".encode() for variable in variables)
    return _processes(
        lambda cmdline, environ: any(entry in exact or entry.startswith(inside) for entry in environ.split(b"\0"))
    )


def _kill_until_gone(find: Callable[[], list[int]], *, with_groups: bool = False) -> list[int]:
    """SIGKILL the pids ``find`` returns (``with_groups``: their process groups too, never this process's), again
    until it returns none or :data:`_KILL_PASSES` rounds passed; return the pids found."""
    killed: list[int] = []
    own_group = os.getpgrp()
    for _ in range(_KILL_PASSES):
        found = find()
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                os.kill(pid, signal.SIGKILL)
                if with_groups and group != own_group:
                    os.killpg(group, signal.SIGKILL)
        killed += [pid for pid in found if pid not in killed]
        time.sleep(_KILL_PAUSE_S)
    return killed


def kill_marked(marker: str) -> list[int]:
    """SIGKILL every other process whose command line or environment names ``marker``, and every process in their
    process groups, until none is left; return the pids found.

    The groups reach the processes that carry no marker any more: Ray's dashboard and runtime-env agents overwrite
    their command line and blank the start of their environment, but stay in the group of the raylet that started
    them. This process's own group is never killed.
    """
    return _kill_until_gone(lambda: [pid for pid, _ in processes_naming(marker)], with_groups=True)


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks after boot), which tells a reused pid apart; None when it is gone."""
    fields = _stat(pid)
    return fields[19] if fields else None


def _session_members(session: int) -> list[int]:
    """The live processes of the session ``session``, this one excepted."""
    return [
        int(entry.name)
        for entry in Path("/proc").glob("[0-9]*")
        if int(entry.name) != os.getpid()
        and (fields := _stat(entry.name))
        and fields[0] != "Z"
        and fields[3] == str(session)
    ]


def kill_session(session: int, started: str | None = None) -> list[int]:
    """SIGKILL every other process of the session ``session`` (a run's driver leads one: ``start_new_session``)
    until none is left; return the pids found.

    Every process of a run stays in its driver's session, whatever it does to its command line, environment or
    process group. With ``started`` (the driver's :func:`start_time`), nothing is killed when the pid ``session``
    now belongs to a process started at another time: the number was reused.
    """
    if started is not None and start_time(session) not in (None, started):
        return []
    return _kill_until_gone(lambda: _session_members(session))


def record_session(folder: str | os.PathLike[str], pid: int) -> None:
    """Record in ``folder`` that ``pid`` leads a session of a run (with its start time), for
    :func:`kill_recorded_sessions`."""
    (Path(folder) / f"{SESSION_RECORD_PREFIX}{pid}.txt").write_text(f"{start_time(pid) or ''}\n")


def kill_recorded_sessions(folder: str | os.PathLike[str]) -> list[int]:
    """:func:`kill_session` for each session recorded in ``folder``; return the pids found."""
    killed = []
    for record in sorted(Path(folder).glob(f"{SESSION_RECORD_PREFIX}*.txt")):
        with contextlib.suppress(OSError, ValueError):
            started = record.read_text().strip() or None
            killed += kill_session(int(record.stem.removeprefix(SESSION_RECORD_PREFIX)), started)
    return killed


def recorded_names(folder: str | os.PathLike[str]) -> list[str]:
    """The ``/dev/shm`` entries recorded in ``folder`` (``dev-shm-<pid>.txt``), in recording order, without repeats."""
    names: dict[str, None] = {}
    for record in sorted(Path(folder).glob(f"{SHM_RECORD_PREFIX}*.txt")):
        with contextlib.suppress(OSError):
            names.update(dict.fromkeys(line.strip() for line in record.read_text().splitlines() if line.strip()))
    return list(names)


def remove_recorded(
    folder: str | os.PathLike[str], root: Path = SHM_ROOT, also: Iterable[str] = ()
) -> list[tuple[str, int]]:
    """Unlink what ``folder`` records (and the names in ``also``) that is still a file under ``root``; return
    (name, bytes) of each entry removed."""
    removed = []
    for name in dict.fromkeys([*recorded_names(folder), *also]):
        path = root / name
        if "/" in name or not path.is_file():
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:  # its own process unlinked it meanwhile
            continue
        removed.append((name, size))
    return removed


# -- the watchdog ------------------------------------------------------------------------------------------


class Watchdog:
    """A process of its own that cleans up after this one if this one ends before :meth:`close` (see the module).

    Args:
        label: Shown in the watchdog's command line (``ps``): what it watches, e.g. the rehearsal's folder.

    Example:
        ``with Watchdog(str(out)) as watchdog: watchdog.kill(marker); ...`` -- leaving the block normally says
        ``done``; an exception leaving it has the watchdog clean up at once, and waits for that.
    """

    def __init__(self, label: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), label],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def _send(self, **task: Any) -> None:
        assert self._process.stdin is not None
        with contextlib.suppress(OSError):  # the watchdog is gone; nothing more to tell it
            self._process.stdin.write(json.dumps(task) + "\n")
            self._process.stdin.flush()

    def kill(self, marker: str) -> None:
        """Stop every process whose command line or environment names ``marker``."""
        self._send(kill=marker)

    def watch_records(self, records: str | os.PathLike[str]) -> None:
        """Stop the sessions recorded in the folder ``records`` (:func:`record_session`) and unlink the ``/dev/shm``
        entries recorded there."""
        self._send(records=str(records))

    def remove(self, folder: str | os.PathLike[str]) -> None:
        """Remove ``folder`` and everything in it."""
        self._send(remove=str(folder))

    def close(self, *, cleaned: bool = True, timeout_s: float = 60.0) -> None:
        """End the watchdog: with ``cleaned``, this process cleaned up itself and the watchdog does nothing; else
        it runs every task now. Waits up to ``timeout_s`` for it to finish."""
        if cleaned:
            self._send(done=True)
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout_s)

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        self.close(cleaned=kind is None)


def _clean_up(markers: Sequence[str], records: Sequence[str], folders: Sequence[str]) -> None:
    # The records are read before the kill too: a new rehearsal may replace the folder once its processes are gone.
    before = {folder: recorded_names(folder) for folder in records}
    for folder in records:
        kill_recorded_sessions(folder)
    for marker in markers:
        kill_marked(marker)
    for folder, names in before.items():
        remove_recorded(folder, also=names)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _watch(tasks: IO[str]) -> None:
    """The watchdog's body: collect tasks until the pipe ends; clean up unless told ``done``."""
    markers: list[str] = []
    records: list[str] = []
    folders: list[str] = []
    for line in tasks:
        try:
            task = json.loads(line)
        except ValueError:
            continue
        if task.get("done"):
            return
        markers += [task["kill"]] if "kill" in task else []
        records += [task["records"]] if "records" in task else []
        folders += [task["remove"]] if "remove" in task else []
    _clean_up(markers, records, folders)


if __name__ == "__main__":  # the watchdog: python -I -S reaper.py LABEL, cleanup tasks on stdin
    for ignored in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are for the command, not for its cleaner
        signal.signal(ignored, signal.SIG_IGN)
    _watch(sys.stdin)
