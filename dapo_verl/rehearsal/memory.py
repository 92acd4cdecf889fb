"""The memory a rehearsal holds: the resident memory of every process it started, sampled, and out-of-memory kills.

:class:`MemorySampler` sums the resident set size (RSS, ``/proc/<pid>/statm``) of the rehearsal's processes every
``interval_s`` seconds in a thread, and keeps the largest sum for the whole rehearsal and for each run. A run's
processes are those the rehearsal can find for it however they were started: the descendants of its driver and
the members of the session its driver leads (:func:`dapo_verl.lifetime.record_session` names the driver in the
run's record folder), and every process whose command line or environment names the run's private Ray folder (Ray's
daemons name it in their command lines, vLLM's engine processes in the environment they inherit), with their
descendants. The whole rehearsal adds its own process and its other descendants (the watchdog).

A sum of RSS counts a page shared by several processes -- a library, a ``/dev/shm`` segment vLLM and the worker
both map -- once per process, so it is an upper bound of what the processes hold together; it is what the kernel's
per-process accounting adds up to, and it is cheap enough to read every half second (a proportional split,
``smaps_rollup``'s PSS, costs milliseconds per process).

:func:`oom_kills` reads the kernel's count of OOM kills, and :func:`memory_kill` says, from a run's log, its exit
status and that count, whether the run ended because memory ran out: Ray's memory monitor killed a worker (Ray's
``OutOfMemoryError``, "running low on memory") or the kernel's OOM killer SIGKILLed a process.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dapo_verl.lifetime import SESSION_RECORD_PREFIX, start_time

__all__ = ["RAY_OOM", "MemoryPeaks", "MemorySampler", "Peak", "Watched", "gib", "memory_kill", "oom_kills",
           "out_of_memory_line", "resident_bytes"]

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
RAY_OOM = re.compile(r"OutOfMemoryError|running low on memory|NODE_OUT_OF_MEMORY|killed due to memory pressure")
"""What Ray prints when its memory monitor kills a worker (ray/exceptions.py, the raylet's kill message)."""


def gib(size: int | None) -> str:
    """``size`` bytes as GiB with one decimal ("-" for None)."""
    return "-" if size is None else f"{size / 2**30:.1f} GiB"


def resident_bytes(pid: int) -> int:
    """The resident set size of ``pid`` in bytes (0 when it is gone or unreadable)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (``/proc/vmstat``), None where unknown."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return None


def memory_kill(log_text: str, returncode: int, kills_before: int | None, kills_after: int | None) -> str | None:
    """What killed a run for lack of memory, in a clause, or None when nothing says memory ran out.

    Args:
        log_text: The run's log.
        returncode: Its driver's exit status (negative: the signal that ended it), when the rehearsal itself did not
            stop it.
        kills_before: :func:`oom_kills` when the run started.
        kills_after: :func:`oom_kills` when it ended. A SIGKILL of the driver counts as the OOM killer's only where
            the kernel keeps no count (None): with a count that did not grow, something else killed it.
    """
    ray = next((line.strip() for line in log_text.splitlines() if RAY_OOM.search(line)), None)
    if ray is not None:
        quoted = ray if len(ray) <= 160 else ray[:157] + "..."
        return f"Ray's memory monitor killed a worker ({quoted!r})"
    killed = None if kills_before is None or kills_after is None else kills_after - kills_before
    if killed:
        return (f"the kernel's OOM killer killed {killed} process(es) on this machine while it ran, and the run "
                f"failed (exit {returncode})")
    if killed is None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):  # no count to tell it apart
        return f"its driver was killed by SIGKILL (exit {returncode}), which is what the kernel's OOM killer sends"
    return None


def out_of_memory_line(name: str, key: str, kill: str, peaks: MemoryPeaks, overlap: bool) -> str:
    """One line for the run ``name`` (``key`` in ``peaks.runs``) that ``kill`` (:func:`memory_kill`) ended: what
    killed it, the memory the rehearsal's processes held at their peak, and what to do."""
    run = peaks.runs.get(key)
    held = (f"the rehearsal's processes held up to {gib(peaks.total.bytes)} resident ({key}: "
            f"{gib(run.bytes if run else None)}), and this machine had {gib(peaks.available_min_bytes)} available at "
            f"the least")
    fix = ("; or rehearse without --overlap-resume: the resume run then starts after the first run ends, and one "
           "trainer, rollout engine and Ray cluster run at a time" if overlap else "")
    return (f"{name} was killed for lack of memory: {kill}; {held}. Close other work and run the same command again "
            f"(docs/rehearse.md, Memory, says what a rehearsal needs){fix}.")


@dataclass(frozen=True)
class Watched:
    """One run whose processes a :class:`MemorySampler` follows.

    Attributes:
        name: The run's name in the peaks (``run1``).
        marker: Its private Ray folder: every process naming it is the run's.
        records: Its record folder, where its launch records the session its driver leads.
    """

    name: str
    marker: str
    records: Path


@dataclass
class Peak:
    """The largest sum of resident memory seen: ``bytes`` over ``processes`` processes, ``at_s`` seconds after
    sampling began (None before any process was seen)."""

    bytes: int = 0
    processes: int = 0
    at_s: float | None = None

    def update(self, size: int, processes: int, at_s: float) -> None:
        if size > self.bytes:
            self.bytes, self.processes, self.at_s = size, processes, at_s


@dataclass
class MemoryPeaks:
    """What a :class:`MemorySampler` saw: the whole rehearsal's peak, each run's, the machine's least available
    memory (``MemAvailable``; None where unknown), how many samples, and how far apart."""

    total: Peak = field(default_factory=Peak)
    runs: dict[str, Peak] = field(default_factory=dict)
    available_min_bytes: int | None = None
    samples: int = 0
    interval_s: float = 0.5


def _available_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


@dataclass
class _Process:
    parent: int
    session: int
    text: bytes  # command line and environment


def _processes(markers: Sequence[str]) -> dict[int, _Process]:
    """Every live process but zombies; ``text`` is read only where a marker could be in it."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            text = b""
            if markers:
                text = (entry / "cmdline").read_bytes()
                with contextlib.suppress(OSError):  # another user's environment is not readable
                    text += (entry / "environ").read_bytes()
            found[int(entry.name)] = _Process(int(fields[1]), int(fields[3]), text)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return found


def _with_descendants(table: dict[int, _Process], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, process in table.items():
        children.setdefault(process.parent, []).append(pid)
    found = {pid for pid in roots if pid in table}
    frontier = list(found)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _drivers(records: Path) -> set[int]:
    """The drivers whose sessions a run's launches recorded in ``records`` (a pid since reused is not one)."""
    found = set()
    for record in records.glob(f"{SESSION_RECORD_PREFIX}*.txt"):
        with contextlib.suppress(OSError, ValueError):
            pid, started = int(record.stem.removeprefix(SESSION_RECORD_PREFIX)), record.read_text().strip()
            if not started or start_time(pid) in (None, started):
                found.add(pid)
    return found


class MemorySampler:
    """Sample the resident memory of a rehearsal's processes in a thread (see the module docstring).

    Args:
        runs: The runs to follow.
        interval_s: Seconds between samples.
        root: The rehearsal's own process (this one by default): it and all its descendants count in the total.

    Example:
        ``with MemorySampler([Watched("run1", ray_dir, out / "run1" / "engine")]) as sampler: ...``, then
        ``sampler.peaks``.
    """

    def __init__(self, runs: Sequence[Watched], interval_s: float = 0.5, root: int | None = None) -> None:
        self._runs, self._interval_s = list(runs), interval_s
        self._root = os.getpid() if root is None else root
        self._peaks = MemoryPeaks(runs={run.name: Peak() for run in runs}, interval_s=interval_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()

    def members(self) -> dict[str | None, set[int]]:
        """The pids of each run now (by name), and under None those of the whole rehearsal."""
        table = _processes([run.marker for run in self._runs])
        members: dict[str | None, set[int]] = {}
        for run in self._runs:
            marked = {pid for pid, p in table.items() if run.marker.encode() in p.text}
            drivers = _drivers(run.records)
            sessions = {pid for pid, p in table.items() if p.session in drivers}
            members[run.name] = _with_descendants(table, drivers | sessions | marked)
        members[None] = _with_descendants(table, {self._root}).union(*members.values())
        return members

    def sample(self) -> None:
        """Take one sample now."""
        at_s = time.monotonic() - self._start
        members = self.members()
        sizes = {pid: resident_bytes(pid) for pid in members[None]}
        available = _available_bytes()
        with self._lock:
            peaks = self._peaks
            peaks.samples += 1
            for name, pids in members.items():
                peak = peaks.total if name is None else peaks.runs[name]
                peak.update(sum(sizes.get(pid, 0) for pid in pids), len(pids), at_s)
            if available is not None:
                peaks.available_min_bytes = min(available, peaks.available_min_bytes or available)

    @property
    def peaks(self) -> MemoryPeaks:
        """A copy of the peaks so far."""
        with self._lock:
            peaks = self._peaks
            return MemoryPeaks(Peak(**vars(peaks.total)), {n: Peak(**vars(p)) for n, p in peaks.runs.items()},
                               peaks.available_min_bytes, peaks.samples, peaks.interval_s)

    def _sample_until_stopped(self) -> None:
        while True:
            began = time.monotonic()
            self.sample()
            if self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - began))):
                return

    def start(self) -> MemorySampler:
        """Start sampling in a thread of its own (the first sample is taken at once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._sample_until_stopped, name="rehearsal-memory", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> MemoryPeaks:
        """Stop sampling (after one last sample) and return the peaks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.sample()
        return self.peaks

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
