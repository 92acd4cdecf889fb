"""The verl processes of a rehearsal: their environment, launch, logs and leftovers.

Each run is the recipe's own entry point in a subprocess of its own session, with the environment of
:func:`environment` (the CPU platform and plugin, the file logger's JSONL, the run's record folder and socket folder,
and whatever the engine adds). :func:`launch` follows its console for verl's step lines (:func:`follow`), stops it
at a time limit that fires on a timer whether or not the run prints (:func:`stop_tree`: its process group and
session, then every process the run left, :func:`kill_leftovers`; :class:`Overrun` says since when it was silent),
and removes the shared memory they recorded (:mod:`.bridges.cpu_leftovers`). Ctrl-C, SIGTERM and SIGHUP
stop a run the same way; a run dies with its launcher (:mod:`dapo_verl.lifetime`). A run that ended because memory
ran out says so (:func:`.memory.memory_kill`). :mod:`.schedule` starts the two runs of a rehearsal.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from dapo_verl import lifetime
from dapo_verl.rehearsal import reaper
from dapo_verl.rehearsal.bridges import cpu_leftovers, cpu_vllm
from dapo_verl.rehearsal.memory import memory_kill, oom_kills

__all__ = [
    "PLUGIN_MODULE",
    "RAY_START_TIMEOUT",
    "Overrun",
    "RunRecord",
    "environment",
    "errors",
    "follow",
    "kill_leftovers",
    "launch",
    "launch_once_more_if_ray_did_not_start",
    "stop_tree",
]

PLUGIN_MODULE = "dapo_verl.rehearsal.bridges.cpu_plugin"
RAY_START_TIMEOUT = "The current node timed out during startup"
_STEP_LINE = re.compile(r"\bstep:(\d+) - ")
_ERROR_LINE = re.compile(r"^(?:\S+\s)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?)$")
_NOTE = "[dapo-verl rehearse] "
_DRAIN_S = 5.0
"""How long, once a run's processes were stopped, the rest of its output may take to reach the log."""


@dataclass
class RunRecord:
    """One verl process of the rehearsal (``error``/``first_error``: the last and the first exception it printed;
    ``records``: its record folder; ``leftovers_removed``: the ``/dev/shm`` entries its processes left, removed
    after it ended, with their sizes; ``stopped_by``: what stopped it before it ended -- a stop signal the
    rehearsal received (``interrupted``: "Ctrl-C", "SIGTERM", "SIGHUP") or why the rehearsal stopped it;
    ``memory_kill``: what killed it for lack of memory, :func:`.memory.memory_kill`)."""

    name: str
    command: list[str]
    returncode: int
    wall_s: float
    log: Path
    metrics: Path
    error: str = ""
    first_error: str = ""
    records: Path | None = None
    leftovers_removed: list[tuple[str, int]] = field(default_factory=list)
    stopped_by: str = ""
    interrupted: bool = False
    memory_kill: str = ""

    @property
    def state(self) -> str:
        """``finished`` (exit 0), ``interrupted`` (by a stop signal), ``stopped`` (by the rehearsal), or ``failed``."""
        if self.returncode == 0:
            return "finished"
        return "interrupted" if self.interrupted else "stopped" if self.stopped_by else "failed"


def environment(metrics: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses num_gpus when it is set (even to "")
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != PLUGIN_MODULE]
    env.update(
        {
            "VERL_PLATFORM": "cpu",
            "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda/npu; the cpu platform runs it
            "VERL_USE_EXTERNAL_MODULES": ",".join([PLUGIN_MODULE, *modules]),
            "VERL_FILE_LOGGER_PATH": str(metrics),
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_DEDUP_LOGS": "0",
            "HYDRA_FULL_ERROR": "1",
            "PYTHONUNBUFFERED": "1",
            **(extra or {}),
        }
    )
    return env


@dataclass(frozen=True)
class Overrun:
    """A run stopped at its time limit by :func:`follow`, and since when it had been silent.

    Attributes:
        limit_s: The time limit, seconds.
        silent_s: Seconds from its last output line (from its start when it printed none) to the limit.
        last_line: Its last output line, stripped ("" when it printed none).
        last_line_at_s: Seconds from its start to that line (None when it printed none).
        output_closed: Its output had ended but its process had not exited.
    """

    limit_s: float
    silent_s: float
    last_line: str = ""
    last_line_at_s: float | None = None
    output_closed: bool = False

    def describe(self, name: str) -> str:
        """One line for the run ``name``: the limit, how long it was silent, its last line, and what to do."""
        if self.last_line_at_s is None:
            silent = "silent since it started (it printed nothing)"
        else:
            line = self.last_line if len(self.last_line) <= 200 else self.last_line[:197] + "..."
            silent = (
                f"silent for the last {self.silent_s:.0f} s, since its line at {self.last_line_at_s:.0f} s: {line!r}"
            )
        closed = "; its output had ended but its process had not exited" if self.output_closed else ""
        return (
            f"{name} reached its time limit of {self.limit_s:.0f} s and was stopped with every process it "
            f"started; it had been {silent}{closed}. A run silent for long usually waits on a process that died "
            f"(the first error in its log names it); if it was only slow, raise RehearsalOptions.timeout_s."
        )


def _read_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    try:
        for line in stream:
            lines.put(line)
    finally:
        lines.put(None)  # the end of the output, even when reading failed


def follow(
    process: subprocess.Popen[str], on_line: Callable[[str], None], limit_s: float, stop: Callable[[], None]
) -> Overrun | None:
    """Hand each line ``process`` prints to ``on_line`` until it exits, for at most ``limit_s`` seconds.

    A reader thread moves the lines to a queue whose reads are timed, so the limit fires whether the process prints
    or not (a run whose rollout engine died waits without printing). At the limit ``stop`` is called
    (:func:`stop_tree`), then the lines printed up to then still reach ``on_line``.

    Args:
        process: Started with ``stdout=subprocess.PIPE`` in text mode.
        on_line: Called in this thread with each line, newline included.
        limit_s: Seconds from this call to the limit.
        stop: Stops the process and everything it started.

    Returns:
        None when the process exited within the limit, else what :class:`Overrun` says of it.
    """
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), name="rehearsal-output", daemon=True)
    reader.start()
    start = last_at = time.monotonic()
    deadline, last_line, ended = start + limit_s, "", False
    while not ended and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            ended = True
        else:
            last_at, last_line = time.monotonic(), line
            on_line(line)
    if ended:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
            return None
    overrun = Overrun(
        limit_s,
        max(0.0, time.monotonic() - last_at),
        last_line.strip(),
        last_at - start if last_line else None,
        output_closed=ended,
    )
    stop()
    reader.join(_DRAIN_S)
    while not lines.empty():  # what it printed before it was stopped
        if (line := lines.get()) is not None:
            on_line(line)
    return overrun


def stop_tree(process: subprocess.Popen[Any], marker: str) -> None:
    """SIGKILL ``process`` with its process group and session (it leads both: ``start_new_session=True``), then
    every process whose command line or environment names ``marker`` (any that left the session); reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    reaper.kill_session(process.pid)  # not reaped yet, so the number cannot have been reused
    kill_leftovers(marker)
    process.wait()


def kill_leftovers(marker: str) -> None:
    """Stop the run's processes still alive: the private Ray cluster's (their command lines name its temporary
    directory), those the run's processes started (vLLM's engine processes; their environment names it), and the
    process groups of both (:func:`dapo_verl.rehearsal.reaper.kill_marked`)."""
    reaper.kill_marked(marker)


_NOT_A_MESSAGE = re.compile(
    r"^(Traceback|File |During handling|The above exception|Error executing|Set the environment"
    r"|For further information|[\^~]+$)"
)


def errors(log: Path) -> tuple[str, str]:
    """The first and the last exception verl's run printed (Ray prefixes stripped), or the log's last line.

    The last is where the run stopped; the first is usually the cause when one process's failure brings down
    the others (an actor that died in its constructor, then every call to it). A message that goes on over the
    next lines (pydantic's validation errors name the field there) keeps up to three of them, joined by " / ".
    """
    lines = _log_lines(log)
    found = _exceptions(lines)
    if found:
        return found[0], found[-1]
    last = next((line for line in reversed(lines) if line.strip()), "(empty log)")
    return last, last


def _log_lines(log: Path) -> list[str]:
    """The log's lines, Ray's ``(process) `` prefixes stripped."""
    return [
        re.sub(r"^\x1b\[\d+m\(.*?\)\x1b\[\d+m\s*", "", line).rstrip()
        for line in log.read_text(errors="replace").splitlines()
    ]


def _exceptions(lines: list[str]) -> list[str]:
    """Each exception message in ``lines``, in order, with up to three lines that continue it."""
    found = []
    for i, line in enumerate(lines):
        match = _ERROR_LINE.match(line.strip())
        if not match or match.group(1).startswith(("UserWarning", "FutureWarning", "DeprecationWarning")):
            continue
        message = [match.group(1)]
        for following in lines[i + 1 : i + 4]:
            text = following.strip()
            if not text or _NOT_A_MESSAGE.match(text) or _ERROR_LINE.match(text):
                break
            message.append(text)
        found.append(" / ".join(message))
    return found


def launch(
    name: str,
    command: list[str],
    run_dir: Path,
    timeout_s: float,
    ray_dir: str,
    steps: int,
    echo: Callable[[str], None],
    on_step: Callable[[int], None] | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    env: dict[str, str] | None = None,
    stopped: Callable[[], tuple[str, bool] | None] | None = None,
    metrics: Path | None = None,
) -> RunRecord:
    """Run one verl process to its end (or ``timeout_s``); ``on_step`` hears each step verl's console logged.

    The run's processes record into ``run_dir/engine`` (:mod:`.bridges.cpu_vllm`) and keep their sockets
    in ``ray_dir``; what they left in ``/dev/shm`` is removed once they have ended. ``stopped``, asked once the
    process has ended, says whether the rehearsal stopped it from another thread: (what stopped it, whether that
    was a stop signal), or None. ``metrics`` is verl's JSONL where the run chooses it (default
    ``run_dir/metrics.jsonl``, given to verl as ``VERL_FILE_LOGGER_PATH``).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    log, records = run_dir / "log.txt", run_dir / "engine"
    metrics = metrics or run_dir / "metrics.jsonl"
    if records.exists():  # a second start of the same run (Ray missed its window) begins a fresh record
        shutil.rmtree(records)
    records.mkdir()
    env = {**(env or {}), cpu_vllm.RECORD_ENV: str(records), cpu_vllm.SOCKET_ENV: ray_dir}
    echo(f"[{name}] {' '.join(command[:4])} ... ({len(command) - 4} overrides); log: {log}")
    start, kills_before = time.perf_counter(), oom_kills()
    overrun: Overrun | None = None
    stop: tuple[str, bool] | None = None
    with open(log, "w") as sink:
        sink.write(" ".join(command) + "\n\n")
        sink.flush()
        process = subprocess.Popen(
            lifetime.dying_with_this_process(command),
            stdout=subprocess.PIPE,
            text=True,
            stderr=subprocess.STDOUT,
            errors="replace",
            env=environment(metrics, env),
            start_new_session=True,
            bufsize=1,
        )
        reaper.record_session(records, process.pid)  # for the watchdog, should this process be killed
        if on_start is not None:
            on_start(process)

        heard_steps: set[int] = set()

        def heard(line: str) -> None:
            sink.write(line)
            step = _STEP_LINE.search(line)
            # Once per step: on several Ray nodes of one machine each node's log monitor forwards the same line.
            if step and int(step.group(1)) not in heard_steps:
                heard_steps.add(int(step.group(1)))
                echo(f"[{name}] step {step.group(1)}/{steps} logged ({time.perf_counter() - start:.0f} s)")
                if on_step is not None:
                    on_step(int(step.group(1)))

        try:
            overrun = follow(process, heard, timeout_s, stop=lambda: stop_tree(process, ray_dir))
            if overrun is not None:
                sink.write(f"\n{_NOTE}{overrun.describe(name)}\n")
            elif stopped is not None and process.returncode != 0:  # it did not finish by itself
                stop = stopped()
        except KeyboardInterrupt as signalled:  # Ctrl-C, or SIGTERM / SIGHUP (lifetime.Stopped)
            stop_tree(process, ray_dir)
            by = lifetime.signal_name(signalled.signum) if isinstance(signalled, lifetime.Stopped) else "Ctrl-C"
            stop = (by, True)
        finally:
            if process.returncode is None:  # a hook raised while the run was going
                stop_tree(process, ray_dir)
            kill_leftovers(ray_dir)
        if stop is not None:
            sink.write(f"\n{_NOTE}{_stop_note(stop, time.perf_counter() - start)}\n")
        returncode = -signal.SIGKILL if overrun is not None or stop is not None else process.returncode
    record = RunRecord(
        name,
        command,
        returncode,
        time.perf_counter() - start,
        log,
        metrics,
        records=records,
        leftovers_removed=cpu_leftovers.remove_recorded(records),
    )
    _explain(record, overrun, stop, kills_before, echo)
    return record


def _stop_note(stop: tuple[str, bool], after_s: float) -> str:
    by, signalled = stop
    return f"stopped by {by} after {after_s:.0f} s" if signalled else f"stopped after {after_s:.0f} s: {by}"


def _explain(
    record: RunRecord,
    overrun: Overrun | None,
    stop: tuple[str, bool] | None,
    kills_before: int | None,
    echo: Callable[[str], None],
) -> None:
    """Fill in why ``record``'s run ended other than by finishing, and echo how it ended."""
    name = record.name
    if overrun is not None:
        found = _exceptions(_log_lines(record.log))
        record.first_error, record.error = (found[0] if found else ""), overrun.describe(name)
        echo(f"[{name}] {record.error}")
    elif stop is not None:
        record.stopped_by, record.interrupted = stop
        record.error = _stop_note(stop, record.wall_s)
    elif record.returncode != 0:
        record.first_error, record.error = errors(record.log)
        output = record.log.read_text(errors="replace").removeprefix(" ".join(record.command) + "\n\n")
        record.memory_kill = memory_kill(output, record.returncode, kills_before, oom_kills()) or ""
    ending = {
        "finished": "finished in",
        "failed": "FAILED in",
        "interrupted": f"interrupted by {record.stopped_by} after",
        "stopped": f"stopped ({record.stopped_by}) after",
    }[record.state]
    echo(f"[{name}] {ending} {record.wall_s:.0f} s")
    if record.leftovers_removed:
        size = sum(n for _, n in record.leftovers_removed) / 2**20
        echo(
            f"[{name}] removed {len(record.leftovers_removed)} shared-memory entries ({size:.0f} MiB) its "
            f"processes left in {cpu_leftovers.SHM_ROOT}"
        )


def launch_once_more_if_ray_did_not_start(*args: Any, echo: Callable[[str], None], **hooks: Any) -> RunRecord:
    """:func:`launch`, repeated once when Ray's local node missed its fixed 30 s start-up window.

    Ray gives the raylet 30 s to register (``ray/_private/node.py``); a machine busy with other work can miss it.
    Nothing of the recipe has run by then, so a second start is the same run.
    """
    record = launch(*args, echo=echo, **hooks)
    if record.returncode != 0 and RAY_START_TIMEOUT in record.error:
        echo(f"[{args[0]}] Ray's local node did not start within its 30 s window (a busy machine); starting again")
        record = launch(*args, echo=echo, **hooks)
    return record
