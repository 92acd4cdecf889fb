"""The memory a rehearsal holds: the resident memory of every process it started, sampled, and out-of-memory kills.

:class:`MemorySampler` sums the memory of the rehearsal's processes every ``interval_s`` seconds in a thread, and
keeps the largest sum for the whole rehearsal and for each run. A run's processes are those the rehearsal can find
for it however they were started: the descendants of its driver and the members of the session its driver leads
(:func:`dapo_verl.rehearsal.reaper.record_session` names the driver in the run's record folder), and every process whose
command line or environment names the run's private Ray folder (Ray's daemons name it in their command lines, vLLM's
engine processes in the environment they inherit), with their descendants. The whole rehearsal adds its own process
and its other descendants (the watchdog).

Two sums are kept. The proportional set size (PSS, ``/proc/<pid>/smaps_rollup``) splits a page that several
processes map among them, so the PSS of a group of processes adds up to the memory the group holds: a library,
or a ``/dev/shm`` segment vLLM and verl's worker both map, counts once. It is the rehearsal's memory, and what
the documented bound is about. Reading it walks each process's page tables in the kernel, holding each one's memory
map lock: 0.1 s for a quiet rehearsal's 28 processes, up to seconds for vLLM's while they start and the machine is
loaded. So it is read when a sum of RSS reaches a new peak (a run starting or growing) and otherwise every
``pss_every``-th sample, where the RSS sum could beat the PSS peak (PSS never exceeds RSS); and never more than a
``pss_share`` of the time: after a read that took ``d`` seconds the next waits until ``d / pss_share`` seconds after
that one began (docs/rehearse.md, Memory, says what it saves). A peak between two reads can go unseen in the PSS;
the RSS sum, sampled every time, bounds it. The last sample always reads it. The resident set size
(RSS, ``/proc/<pid>/statm``, cheap) of every sample counts a shared page once per process that maps it: its sum
is an upper bound, about 1.4 times the PSS on a vLLM rehearsal, kept beside it.

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

from dapo_verl.rehearsal.reaper import SESSION_RECORD_PREFIX, start_time

__all__ = [
    "RAY_OOM",
    "MemoryPeaks",
    "MemorySampler",
    "Peak",
    "Watched",
    "gib",
    "memory_kill",
    "oom_kills",
    "out_of_memory_line",
    "proportional_bytes",
    "resident_bytes",
]

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


def proportional_bytes(pid: int) -> int:
    """The proportional set size of ``pid`` in bytes (``smaps_rollup``'s ``Pss``; 0 when it is gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
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
        return (
            f"the kernel's OOM killer killed {killed} process(es) on this machine while it ran, and the run "
            f"failed (exit {returncode})"
        )
    if killed is None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):  # no count to tell it apart
        return f"its driver was killed by SIGKILL (exit {returncode}), which is what the kernel's OOM killer sends"
    return None


def out_of_memory_line(name: str, key: str, kill: str, peaks: MemoryPeaks, overlap: bool) -> str:
    """One line for the run ``name`` (``key`` in ``peaks.runs``) that ``kill`` (:func:`memory_kill`) ended: what
    killed it, the memory the rehearsal's processes held at their peak, and what to do."""
    run = peaks.runs_pss.get(key)
    held = (
        f"the rehearsal's processes held up to {gib(peaks.pss.bytes)} ({key}: {gib(run.bytes if run else None)}; "
        f"the sum of their proportional set sizes, that of their RSS up to {gib(peaks.total.bytes)}), and this "
        f"machine had {gib(peaks.available_min_bytes)} available at the least"
    )
    fix = (
        "; or rehearse without --overlap-resume: the resume run then starts after the first run ends, and one "
        "trainer, rollout engine and Ray cluster run at a time"
        if overlap
        else ""
    )
    return (
        f"{name} was killed for lack of memory: {kill}; {held}. Close other work and run the same command again "
        f"(docs/rehearse.md, Memory, says what a rehearsal needs){fix}."
    )


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
    """The largest sum of memory seen: ``bytes`` over ``processes`` processes, ``at_s`` seconds after sampling
    began (None before any process was seen)."""

    bytes: int = 0
    processes: int = 0
    at_s: float | None = None

    def update(self, size: int, processes: int, at_s: float) -> None:
        if size > self.bytes:
            self.bytes, self.processes, self.at_s = size, processes, at_s


@dataclass
class MemoryPeaks:
    """What a :class:`MemorySampler` saw: the whole rehearsal's and each run's peak of the sum of RSS (``total``,
    ``runs``) and of the sum of PSS (``pss``, ``runs_pss``; read at most every ``pss_interval_s`` seconds, and
    ``pss_reads`` times in all), the machine's least available memory (``MemAvailable``; None where unknown), how many
    samples, and how far apart."""

    total: Peak = field(default_factory=Peak)
    runs: dict[str, Peak] = field(default_factory=dict)
    available_min_bytes: int | None = None
    samples: int = 0
    interval_s: float = 0.5
    pss: Peak = field(default_factory=Peak)
    runs_pss: dict[str, Peak] = field(default_factory=dict)
    pss_interval_s: float = 2.0
    pss_reads: int = 0


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
    for name in os.listdir("/proc"):  # plain os calls: this runs every sample, over every process of the machine
        if not name.isdigit():
            continue
        try:
            fields = _read(f"/proc/{name}/stat").rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            text = b""
            if markers:
                text = _read(f"/proc/{name}/cmdline")
                with contextlib.suppress(OSError):  # another user's environment is not readable
                    text += _read(f"/proc/{name}/environ")
            found[int(name)] = _Process(int(fields[1]), int(fields[3]), text)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return found


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


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
        pss_every: Read the proportional set sizes at every ``pss_every``-th sample (the first included).
        pss_share: The largest share of the time spent reading them, in (0, 1].
        root: The rehearsal's own process (this one by default): it and all its descendants count in the total.

    Example:
        ``with MemorySampler([Watched("run1", ray_dir, out / "run1" / "engine")]) as sampler: ...``, then
        ``sampler.peaks``.
    """

    def __init__(
        self,
        runs: Sequence[Watched],
        interval_s: float = 0.5,
        pss_every: int = 4,
        pss_share: float = 0.05,
        root: int | None = None,
    ) -> None:
        if pss_every < 1:
            raise ValueError(f"pss_every={pss_every!r}: expected a whole number of samples >= 1")
        if not 0 < pss_share <= 1:
            raise ValueError(f"pss_share={pss_share!r}: expected a share of the time in (0, 1]")
        self._runs, self._interval_s, self._pss_every, self._pss_share = list(runs), interval_s, pss_every, pss_share
        self._pss_next = float("-inf")  # monotonic time before which no proportional sizes are read
        self._root = os.getpid() if root is None else root
        self._peaks = MemoryPeaks(
            runs={run.name: Peak() for run in runs},
            interval_s=interval_s,
            runs_pss={run.name: Peak() for run in runs},
            pss_interval_s=interval_s * pss_every,
        )
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

    def sample(self, pss: bool | None = None) -> None:
        """Take one sample now; ``pss`` says whether to read the proportional set sizes too (by default when a sum
        of RSS reaches a new peak, and at every ``pss_every``-th sample where one could beat their peak)."""
        at_s = time.monotonic() - self._start
        members = self.members()
        sizes = {pid: resident_bytes(pid) for pid in members[None]}
        rss = {name: sum(sizes.get(pid, 0) for pid in pids) for name, pids in members.items()}
        with self._lock:
            due = self._peaks.samples % self._pss_every == 0
            rising = any(size > self._rss_peak(name).bytes for name, size in rss.items())
            beatable = any(size > self._pss_peak(name).bytes for name, size in rss.items())
        if pss is None:
            read_pss = (rising or (due and beatable)) and time.monotonic() >= self._pss_next
        else:
            read_pss = pss
        shares = {}
        if read_pss:
            began = time.monotonic()
            shares = {pid: proportional_bytes(pid) for pid in members[None]}
            self._pss_next = began + (time.monotonic() - began) / self._pss_share
        available = _available_bytes()
        with self._lock:
            peaks = self._peaks
            peaks.samples += 1
            peaks.pss_reads += read_pss
            for name, pids in members.items():
                self._rss_peak(name).update(rss[name], len(pids), at_s)
                if read_pss:
                    self._pss_peak(name).update(sum(shares.get(pid, 0) for pid in pids), len(pids), at_s)
            if available is not None:
                peaks.available_min_bytes = min(available, peaks.available_min_bytes or available)

    def _rss_peak(self, name: str | None) -> Peak:
        return self._peaks.total if name is None else self._peaks.runs[name]

    def _pss_peak(self, name: str | None) -> Peak:
        return self._peaks.pss if name is None else self._peaks.runs_pss[name]

    @property
    def peaks(self) -> MemoryPeaks:
        """A copy of the peaks so far."""
        with self._lock:
            peaks = self._peaks
            return MemoryPeaks(
                Peak(**vars(peaks.total)),
                {n: Peak(**vars(p)) for n, p in peaks.runs.items()},
                peaks.available_min_bytes,
                peaks.samples,
                peaks.interval_s,
                Peak(**vars(peaks.pss)),
                {n: Peak(**vars(p)) for n, p in peaks.runs_pss.items()},
                peaks.pss_interval_s,
                peaks.pss_reads,
            )

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
        """Stop sampling (after one last sample, with the proportional set sizes) and return the peaks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.sample(pss=True)
        return self.peaks

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
