"""A ``dapo-verl rehearse`` stopped halfway leaves nothing behind, on verl's real trainer (stand-in rollout engine).

Each test starts the command as a user does (``--overlap-resume``, so that both runs are up), waits until the first
run logged its first training step -- its private Ray cluster, verl's trainer and workers, TransferQueue and the
rollout replica are all up, and the resume run, started with it, waits at its checkpoint barrier in a Ray cluster
of its own -- and sends one signal: SIGTERM (``timeout``, Slurm, CI cancellation), SIGINT (Ctrl-C) or SIGKILL
(``kill -9``, the OOM killer). SIGINT and SIGTERM end the command with one line saying it was interrupted, exit
status 2 after Ctrl-C (as ``dapo-verl train``) and 143 after SIGTERM, and a report that lists both runs as
interrupted, with the memory their processes held. Within 45 s no
process may name the rehearsal's folder or either Ray folder (command line or environment), none of the processes
that descended from the command at the signal may live, the Ray folders must be gone, and so must every
``/dev/shm`` entry recorded in the runs' record folders -- one planted there by the test, as vLLM's message
queues are recorded, so that the stand-in's runs, which create none, still check the removal. The same ``--out``
must then be free for the next rehearsal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from dapo_verl import lifetime
from dapo_verl.rehearsal import reaper
from dapo_verl.rehearsal.folders import own_out

pytestmark = [pytest.mark.slow, pytest.mark.verl, pytest.mark.e2e]

STARTUP_S = 900  # Ray, verl and the replica start on 2 cores shared with other work
STOPPED_WITHIN_S = 45


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None when gone or a zombie), which tells a pid reused from it apart."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root`` now, with its start time."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found and (started := _start_time(pid)) is not None:
                found[pid] = started
                frontier.append(pid)
    return found


def _wait_for_line(console: Path, command: subprocess.Popen, text: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while text not in console.read_text():
        assert command.poll() is None, f"the rehearsal ended before {text!r}:\n{console.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {within_s} s:\n{console.read_text()[-3000:]}"
        time.sleep(1)


def _plant_segment(records: Path) -> str:
    """A ``/dev/shm`` entry recorded as a process of the run records the segments it creates."""
    name = f"dapo-verl-test-{uuid.uuid4().hex[:12]}"
    (reaper.SHM_ROOT / name).write_bytes(bytes(4096))
    with open(records / f"{reaper.SHM_RECORD_PREFIX}999999999.txt", "a") as record:
        record.write(name + "\n")
    return name


def _leftovers(out: Path, ray_folders: list[str], tree: dict[int, str], planted: str) -> list[str]:
    """Everything of the rehearsal still there, one line each."""
    found = [
        f"pid {pid} names {marker}: {line[:150]}"
        for marker in (str(out), *ray_folders)
        for pid, line in reaper.processes_naming(marker)
    ]
    found += [
        f"pid {pid} (a descendant at the signal) lives" for pid, started in tree.items() if _start_time(pid) == started
    ]
    found += [f"{folder} exists" for folder in ray_folders if Path(folder).exists()]
    recorded = {planted, *(name for run in ("run1", "run2") for name in reaper.recorded_names(out / run / "engine"))}
    found += [f"/dev/shm/{name} exists" for name in sorted(recorded) if (reaper.SHM_ROOT / name).exists()]
    return found


def _stop_what_the_test_started(
    command: subprocess.Popen, tree: dict[int, str], out: Path, folders: list[str], planted: str
) -> None:
    """On a failure, kill the command, the descendants it had at the signal and whatever names its folders, and
    remove the folders and the planted segment."""
    if command.poll() is None:
        command.kill()
    for pid, started in tree.items():
        if _start_time(pid) == started:
            os.kill(pid, signal.SIGKILL)
    for marker in (str(out), *folders):
        reaper.kill_marked(marker)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    if planted:
        (reaper.SHM_ROOT / planted).unlink(missing_ok=True)


def _start_rehearsal(tmp_path: Path, *options: str) -> tuple[Path, Path, subprocess.Popen]:
    """``dapo-verl rehearse dapo_trainer --engine stand-in OPTIONS`` in a session of its own, its console to a file."""
    out, console = tmp_path / "rehearsal", tmp_path / "console.txt"
    cli = Path(sys.executable).with_name("dapo-verl")
    with open(console, "w") as sink:
        command = subprocess.Popen(
            [
                "nice",
                "-n",
                "10",
                str(cli),
                "rehearse",
                "dapo_trainer",
                "--engine",
                "stand-in",
                *options,
                "--out",
                str(out),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    return out, console, command


def _assert_interrupted(console: str, report: dict, by: str, processes: int) -> None:
    """One line says the rehearsal was interrupted; the report lists both runs as interrupted, with a plausible
    memory peak that covers many processes."""
    said = [line for line in console.splitlines() if line.startswith("dapo-verl rehearse: ")]
    assert len(said) == 1, said
    assert said[0].startswith(f"dapo-verl rehearse: interrupted by {by}: run1 interrupted after "), said
    assert "PASSED" not in console and "FAILED" not in console
    assert report["state"] == "interrupted" and report["interrupted_by"] == by and not report["ok"]
    assert [(run["name"], run["state"]) for run in report["runs"]] == [
        ("run1", "interrupted"),
        ("run2 (resume)", "interrupted"),
    ]
    memory = report["memory"]
    assert 2**30 < report["peak_rss_bytes"] < 24 * 2**30, memory  # verl, Ray and torch in a dozen processes or more
    assert 0 < report["peak_pss_bytes"] < report["peak_rss_bytes"], memory  # shared pages count once in PSS
    assert memory["peak_processes"] >= min(processes, 10), (memory, processes)
    assert all(run["peak_rss_bytes"] > 0 and run["peak_processes"] > 1 for run in report["runs"]), report["runs"]


# SIGINT takes SIGTERM's path through stop_signals; it is tested with stand-in processes (tests/unit/test_lifetime.py,
# tests/unit/test_rehearsal_schedule.py). SIGKILL, which runs no code in the command, leaves the cleanup to the
# watchdog: the two-node test below kills a whole rehearsal that way; the watchdog's one-node duties are tested with
# stand-in processes in tests/unit/test_lifetime.py.
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 128 + signal.SIGTERM)])
def test_a_rehearsal_stopped_with_its_runs_up_leaves_no_process_folder_or_shared_memory(tmp_path, signum, status):
    out, console, command = _start_rehearsal(tmp_path, "--overlap-resume")
    tree: dict[int, str] = {}
    ray_folders: list[str] = []
    planted = ""
    try:
        _wait_for_line(console, command, "[run1] step 1/3 logged", STARTUP_S)
        ray_folders = sorted(
            set(
                re.findall(
                    rf"{re.escape(tempfile.gettempdir())}/dvr-[A-Za-z0-9_]+",
                    console.read_text() + (out / "run2" / "log.txt").read_text(),
                )
            )
        )
        assert len(ray_folders) == 2, ray_folders  # the private Ray folder of each run
        planted = _plant_segment(out / "run1" / "engine")
        tree = _descendants(command.pid)
        commands = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid in tree)
        assert "raylet" in commands and "reaper.py" in commands, commands  # Ray is up; so is the watchdog

        command.send_signal(signum)
        sent = time.monotonic()
        assert command.wait(STOPPED_WITHIN_S) == status, console.read_text()[-3000:]
        while (left := _leftovers(out, ray_folders, tree, planted)) and time.monotonic() - sent < STOPPED_WITHIN_S:
            time.sleep(0.5)
        print(
            f"{signal.Signals(signum).name}: {len(tree)} processes, the last gone {time.monotonic() - sent:.1f} s "
            f"after the signal"
        )
        assert not left, left
        by = lifetime.signal_name(signum)
        assert f"stopped by {by} after" in (out / "run1" / "log.txt").read_text()
        _assert_interrupted(console.read_text(), json.loads((out / "report.json").read_text()), by, len(tree))
        with own_out(out, overwrite=True):  # a rehearsal started again into the same --out may begin
            pass
    finally:  # on a failure, stop what this test started
        _stop_what_the_test_started(command, tree, out, ray_folders, planted)


def test_a_two_node_rehearsal_killed_with_its_job_up_leaves_no_ray_node_process_or_shared_memory(tmp_path):
    # SIGKILL: the CLI runs no code, so the watchdog stops the nodes' sessions and every process naming the
    # cluster's folder or a run's; SIGTERM and Ctrl-C take the path of the one-node runs above (the launch stops its
    # job, then the cluster stops with its block).
    out, console, command = _start_rehearsal(tmp_path, "--nodes", "2")
    tree: dict[int, str] = {}
    folders: list[str] = []
    planted = ""
    try:
        _wait_for_line(console, command, "[run1] step 1/3 logged", STARTUP_S)
        pattern = rf"{re.escape(tempfile.gettempdir())}/dvr-[A-Za-z0-9_]+"
        folders = sorted(set(re.findall(pattern, console.read_text() + (out / "run1" / "log.txt").read_text())))
        assert len(folders) == 2, folders  # the cluster's folder (console) and run 1's (sent with its job)
        planted = _plant_segment(out / "run1" / "engine")
        tree = _descendants(command.pid)
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid in tree]
        assert sum("raylet" in c for c in commands) == 2, commands  # a raylet per node, and the job's workers up

        command.send_signal(signal.SIGKILL)
        sent = time.monotonic()
        command.wait(STOPPED_WITHIN_S)
        while (left := _leftovers(out, folders, tree, planted)) and time.monotonic() - sent < STOPPED_WITHIN_S:
            time.sleep(0.5)
        print(f"SIGKILL, 2 nodes: {len(tree)} processes, the last gone {time.monotonic() - sent:.1f} s after it")
        assert not left, left
    finally:
        _stop_what_the_test_started(command, tree, out, folders, planted)
