"""The verl processes of a rehearsal: their environment, launch, logs, leftovers, and the resume run beside the first.

Each run is the recipe's own entry point in a subprocess of its own session, with the environment of
:func:`environment` (the CPU platform and plugin, the file logger's JSONL, the run's record folder and socket folder,
and whatever the engine adds). :func:`launch` follows its console for verl's step lines, stops it at a time limit,
stops every process the run left (:func:`kill_leftovers`) and removes the shared memory they recorded
(:mod:`dapo_verl.adapter.cpu_leftovers`). :class:`Resume` runs the resume process in a thread, started with the first
run or after it, and releases it at verl's checkpoint load once the first run's checkpoint is on disk.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_verl.adapter import cpu_leftovers, cpu_vllm

__all__ = ["PLUGIN_MODULE", "RAY_START_TIMEOUT", "Resume", "RunRecord", "checkpointed_step", "environment", "errors",
           "kill_leftovers", "launch", "launch_once_more_if_ray_did_not_start"]

PLUGIN_MODULE = "dapo_verl.adapter.cpu_plugin"
RAY_START_TIMEOUT = "The current node timed out during startup"
_STEP_LINE = re.compile(r"\bstep:(\d+) - ")
_ERROR_LINE = re.compile(r"^(?:\S+\s)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?)$")


@dataclass
class RunRecord:
    """One verl process of the rehearsal (``error``/``first_error``: the last and the first exception it printed;
    ``records``: its record folder; ``leftovers_removed``: the ``/dev/shm`` entries its processes left, removed
    after it ended, with their sizes)."""

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


def environment(metrics: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses num_gpus when it is set (even to "")
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != PLUGIN_MODULE]
    env.update({
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
    })
    return env


def kill_leftovers(marker: str) -> None:
    """Stop the run's processes still alive: the private Ray cluster's (their command lines name its temporary
    directory) and those the run's processes started (vLLM's engine processes; their environment names it)."""
    own = str(os.getpid())
    for pid_dir in Path("/proc").glob("[0-9]*"):
        if pid_dir.name == own:
            continue
        try:
            if any(marker in (pid_dir / part).read_bytes().decode(errors="replace") for part in ("cmdline", "environ")):
                os.kill(int(pid_dir.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


_NOT_A_MESSAGE = re.compile(r"^(Traceback|File |During handling|The above exception|Error executing|Set the environment"
                            r"|For further information|[\^~]+$)")


def errors(log: Path) -> tuple[str, str]:
    """The first and the last exception verl's run printed (Ray prefixes stripped), or the log's last line.

    The last is where the run stopped; the first is usually the cause when one process's failure brings down
    the others (an actor that died in its constructor, then every call to it). A message that goes on over the
    next lines (pydantic's validation errors name the field there) keeps up to three of them, joined by " / ".
    """
    lines = [re.sub(r"^\x1b\[\d+m\(.*?\)\x1b\[\d+m\s*", "", line).rstrip() for line in
             log.read_text(errors="replace").splitlines()]
    found = []
    for i, line in enumerate(lines):
        match = _ERROR_LINE.match(line.strip())
        if not match or match.group(1).startswith(("UserWarning", "FutureWarning", "DeprecationWarning")):
            continue
        message = [match.group(1)]
        for following in lines[i + 1:i + 4]:
            text = following.strip()
            if not text or _NOT_A_MESSAGE.match(text) or _ERROR_LINE.match(text):
                break
            message.append(text)
        found.append(" / ".join(message))
    if found:
        return found[0], found[-1]
    last = next((line for line in reversed(lines) if line.strip()), "(empty log)")
    return last, last


def launch(name: str, command: list[str], run_dir: Path, timeout_s: float, ray_dir: str, steps: int,
            echo: Callable[[str], None], on_step: Callable[[int], None] | None = None,
            on_start: Callable[[subprocess.Popen], None] | None = None,
            env: dict[str, str] | None = None) -> RunRecord:
    """Run one verl process to its end (or ``timeout_s``); ``on_step`` hears each step verl's console logged.

    The run's processes record into ``run_dir/engine`` (:mod:`dapo_verl.adapter.cpu_vllm`) and keep their sockets
    in ``ray_dir``; what they left in ``/dev/shm`` is removed once they have ended.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    log, metrics, records = run_dir / "log.txt", run_dir / "metrics.jsonl", run_dir / "engine"
    if records.exists():  # a second start of the same run (Ray missed its window) begins a fresh record
        shutil.rmtree(records)
    records.mkdir()
    env = {**(env or {}), cpu_vllm.RECORD_ENV: str(records), cpu_vllm.SOCKET_ENV: ray_dir}
    echo(f"[{name}] {' '.join(command[:4])} ... ({len(command) - 4} overrides); log: {log}")
    start = time.perf_counter()
    with open(log, "w") as sink:
        sink.write(" ".join(command) + "\n\n")
        sink.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=environment(metrics, env), start_new_session=True, bufsize=1)
        if on_start is not None:
            on_start(process)
        assert process.stdout is not None
        deadline = start + timeout_s
        try:
            for line in process.stdout:
                sink.write(line)
                step = _STEP_LINE.search(line)
                if step:
                    echo(f"[{name}] step {step.group(1)}/{steps} logged ({time.perf_counter() - start:.0f} s)")
                    if on_step is not None:
                        on_step(int(step.group(1)))
                if time.perf_counter() > deadline:
                    raise subprocess.TimeoutExpired(command, timeout_s)
            returncode = process.wait()
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = -signal.SIGKILL
            sink.write(f"\n[dapo-verl rehearse] stopped after {time.perf_counter() - start:.0f} s\n")
        finally:
            kill_leftovers(ray_dir)
    record = RunRecord(name, command, returncode, time.perf_counter() - start, log, metrics, records=records,
                       leftovers_removed=cpu_leftovers.remove_recorded(records))
    if returncode != 0:
        record.first_error, record.error = errors(log)
    echo(f"[{name}] {'finished' if returncode == 0 else 'FAILED'} in {record.wall_s:.0f} s")
    if record.leftovers_removed:
        size = sum(n for _, n in record.leftovers_removed) / 2**20
        echo(f"[{name}] removed {len(record.leftovers_removed)} shared-memory entries ({size:.0f} MiB) its "
             f"processes left in {cpu_leftovers.SHM_ROOT}")
    return record


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
        launch: Runs the resume process to its end (given ``on_start``, which records the process).
        checkpoints: The first run's checkpoint folder.
        step: The checkpointed step the resume starts from.
        barrier: The file whose existence lets the resume run load the checkpoint
            (:mod:`dapo_verl.adapter.resume_barrier`).
        timeout_s: How long to wait for verl's tracker file to name ``step`` once the step was logged.
    """

    def __init__(self, launch: Callable[..., RunRecord], checkpoints: Path, step: int, barrier: Path,
                 timeout_s: float) -> None:
        self._launch, self._checkpoints, self._step = launch, checkpoints, step
        self.barrier, self._timeout_s = barrier, timeout_s
        self._thread: threading.Thread | None = None
        self._record: RunRecord | None = None
        self._error: BaseException | None = None
        self._process: subprocess.Popen | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        """Start the resume run now; it starts up and then waits for :attr:`barrier`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rehearsal-resume", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._record = self._launch(on_start=self._started)
        except BaseException as err:  # re-raised by result() in the main thread
            self._error = err

    def _started(self, process: subprocess.Popen) -> None:
        self._process = process
        if self._stopped.is_set():
            os.killpg(process.pid, signal.SIGKILL)

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
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(0.5)  # short joins keep Ctrl-C responsive
        if self._error is not None:
            raise self._error
        return self._record

    def stop(self) -> None:
        """Stop the resume run, if it is running (the first run failed or the rehearsal was interrupted)."""
        self._stopped.set()
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
        if self._thread is not None:
            self._thread.join()


