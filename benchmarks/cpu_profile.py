"""Where the CPUs go during a rehearsal: every process's CPU time, sampled from /proc, summed by role.

On these 2-core machines vLLM's engine shares the CPUs with verl's agent loop, reward workers, load balancer,
TransferQueue and trainer, so how fast requests reach the engine depends on what else runs. :class:`CpuSampler`
records every process's user + system CPU time twice a second in a child process (its own CPU is a role of its
own, ``sampler``), and :func:`cpu_by_role` sums each process's growth between two instants by the role its command
line names (:data:`ROLES`: a Ray actor's name as Ray sets its process title, vLLM's engine core and model worker
by the titles vLLM gives them).

``python -m benchmarks.bench_stream_engine --cpu-profile`` samples each run into
``<work>/<strategy>-seed<k>.cpu.jsonl`` and reports the roles' CPU seconds over the measured steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import TracebackType

__all__ = ["ROLES", "CpuSampler", "cpu_by_role", "role_of", "sample_forever"]

ROLES: tuple[tuple[str, str], ...] = (
    ("VLLM::Worker", "vllm_worker"),
    ("VLLM::EngineCore", "vllm_engine_core"),
    ("from multiprocessing.spawn", "vllm_engine_core"),  # before vLLM names the spawned process
    ("AgentLoopWorker", "agent_loop"),
    ("vLLMHttpServer", "vllm_server"),
    ("RewardLoopWorker", "reward"),
    ("GlobalRequestLoadBalancer", "load_balancer"),
    ("TransferQueue", "transfer_queue"),
    ("SimpleStorageUnit", "transfer_queue"),
    ("TaskRunner", "trainer_driver"),
    ("WorkerDict", "fsdp_workers"),
    ("benchmarks.cpu_profile", "sampler"),
    ("verl.trainer.main_ppo", "verl_driver"),
    ("dapo_verl.main", "verl_driver"),
    ("bench_stream_engine", "rehearsal_driver"),
    ("dapo-verl rehearse", "rehearsal_driver"),
    ("raylet", "ray"),
    ("gcs_server", "ray"),
    ("ray::", "ray"),
)
"""(a substring of the command line, the role), first match wins; anything else is ``other``."""


def role_of(command: str) -> str:
    """The role of a process whose command line (NULs as spaces) is ``command``."""
    return next((role for pattern, role in ROLES if pattern in command), "other")


def _snapshot() -> dict[str, list]:
    ticks = os.sysconf("SC_CLK_TCK")
    snap: dict[str, list] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended between the listing and the read
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
        snap[pid] = [(int(fields[11]) + int(fields[12])) / ticks, command.strip()[:200]]
    return snap


def sample_forever(path: Path, interval: float, parent: int) -> None:
    """Append ``{"t": unix time, "p": {pid: [cpu seconds, command]}}`` to ``path`` every ``interval`` s until killed
    or orphaned (its parent gone without stopping it: a SIGKILLed benchmark leaves no sampler behind).

    ``parent`` is the pid of the process that started this one, given by that process: read here with
    ``os.getppid()``, a parent killed while this interpreter still imported would already be the reaper's pid."""
    with path.open("a") as out:
        while os.getppid() == parent:
            out.write(json.dumps({"t": time.time(), "p": _snapshot()}) + "\n")
            out.flush()
            time.sleep(interval)


class CpuSampler:
    """Samples every process's CPU time into ``path`` from a child process while the ``with`` block runs."""

    def __init__(self, path: Path, interval: float = 0.5) -> None:
        if interval <= 0:
            raise ValueError(f"interval={interval}: the seconds between samples must be positive")
        self.path, self.interval = Path(path), interval
        self._child: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> CpuSampler:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self._child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.cpu_profile", str(self.path), str(self.interval), str(os.getpid())]
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._child is not None:
            self._child.terminate()
            self._child.wait(timeout=10)
            self._child = None


def cpu_by_role(path: Path, start: float = float("-inf"), end: float = float("inf")) -> dict[str, float]:
    """CPU seconds each role used between the first and the last sample inside ``[start, end]`` (unix times).

    A process's role is read from the last non-empty command line it showed (a Ray worker takes its actor's name
    once the actor starts); a process that started or ended in the window counts from its first sample to its last.
    """
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    command: dict[str, str] = {}
    with Path(path).open() as lines:
        for line in lines:
            sample = json.loads(line)
            if not start <= sample["t"] <= end:
                continue
            for pid, (cpu, cmd) in sample["p"].items():
                first.setdefault(pid, cpu)
                last[pid] = cpu
                if cmd and not cmd.startswith("ray::IDLE"):
                    command[pid] = cmd
    if not last:
        raise ValueError(f"{path} has no sample between {start} and {end}; was the sampler running then?")
    used: Counter[str] = Counter()
    for pid, cpu in last.items():
        used[role_of(command.get(pid, ""))] += cpu - first[pid]
    return dict(used.most_common())


if __name__ == "__main__":
    sample_forever(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
