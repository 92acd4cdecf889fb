"""Nothing a command starts outlives it: Ctrl-C, SIGTERM, SIGHUP and SIGKILL of a ``dapo-verl`` command.

The command here is the real CLI (``dapo_verl.cli.main``) with ``rehearse`` replaced by a stand-in that holds the
rehearsal's real folders (:mod:`dapo_verl.rehearsal.folders`: the ``--out`` lock, the private Ray folders and the
watchdog) and launches one run through the rehearsal's real :func:`~dapo_verl.rehearsal.processes.launch`. The run
is a plain Python process that starts sleepers the way verl's driver starts Ray's daemons and vLLM's engine: one in
its process group, one in a session of its own naming the run's Ray folder in its command line (with a child in its
group that names nothing and has an empty environment, as Ray's agents end up), one in a session of its own carrying
the folder only in its environment, and one in its session but a group of its own that names nothing; and it
creates a ``/dev/shm`` entry and records it as the rehearsal's processes do. Each test sends one signal to the
command and then looks for any of it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dapo_verl import lifetime
from dapo_verl.rehearsal import reaper
from dapo_verl.rehearsal.bridges.cpu_vllm import RECORD_ENV
from dapo_verl.rehearsal.folders import RehearsalError, own_out
from tests.process_helpers import running

_DAEMON = textwrap.dedent("""
    import subprocess, sys, time
    # Like Ray's dashboard agent: in the raylet's process group, with neither the folder nor the run's environment.
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env={})
    with open(sys.argv[1], "w") as sink:
        sink.write(str(agent.pid))
    time.sleep(300)
""")

_DRIVER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    marker, pids, daemon_code = sys.argv[1], sys.argv[2], sys.argv[3]
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    in_group = subprocess.Popen(sleep)
    # like Ray's raylet: a session of its own, the folder in its command line
    daemon = subprocess.Popen([sys.executable, "-c", daemon_code, pids + ".agent", marker], start_new_session=True)
    engine = subprocess.Popen(sleep, start_new_session=True)  # like vLLM's: the folder in its environment only
    # like Ray's workers after a retitle: in the run's session only, in a group of its own, naming nothing
    worker = subprocess.Popen(sleep, preexec_fn=os.setpgrp, env={})
    name = f"dapo-verl-test-{os.getpid()}"
    with open(f"/dev/shm/{name}", "wb") as segment:
        segment.write(bytes(4096))
    with open(os.path.join(os.environ["DAPO_REHEARSAL_RECORD_DIR"], f"dev-shm-{os.getpid()}.txt"), "a") as record:
        record.write(name + "\\n")
    with open(pids, "w") as sink:
        json.dump({"driver": os.getpid(), "children": [in_group.pid, daemon.pid, engine.pid, worker.pid],
                   "shm": name}, sink)
    print("step:1 - loss:0.5", flush=True)
    time.sleep(300)
""")

_COMMAND = textwrap.dedent("""
    import signal, sys, types
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, whatever started this test
    from dapo_verl import cli
    from dapo_verl.rehearsal import folders, processes, report, run

    def rehearse(options, echo=print):
        out = options.out_dir.resolve()
        with folders.own_out(out, options.overwrite), folders.private_folders(out) as (ray_dirs, site):
            echo("ray folders " + " ".join([*ray_dirs, str(site)]))
            record = processes.launch("run1", [sys.executable, "-c", sys.argv[2], ray_dirs[0], *sys.argv[3:]],
                                      out / "run1", 120, ray_dirs[0], 2, echo=echo)
        return types.SimpleNamespace(report={"ok": record.returncode == 0})

    run.rehearse = rehearse
    report.summary_lines = lambda report: [f"ok: {report['ok']}"]
    sys.exit(cli.main(["rehearse", "dapo_trainer", "--out", sys.argv[1]]))
""")


def _wait_until(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _start_command(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    out, console, pids = tmp_path / "rehearsal", tmp_path / "console.txt", tmp_path / "pids.json"
    with open(console, "w") as sink:
        command = subprocess.Popen(
            [sys.executable, "-c", _COMMAND, str(out), _DRIVER, str(pids), _DAEMON],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    assert _wait_until(lambda: "[run1] step 1/2 logged" in console.read_text() or command.poll() is not None, 60), (
        console.read_text()
    )
    assert command.poll() is None, console.read_text()
    return command, out, console


@pytest.fixture
def left_behind():
    """Whatever a failing test leaves (pids, /dev/shm names, folders), removed after it."""
    found: dict[str, list] = {"pids": [], "shm": [], "folders": []}
    yield found
    for pid, started in found["pids"]:
        if running(pid) and reaper.start_time(pid) == started:  # not a pid reused meanwhile
            os.kill(pid, signal.SIGKILL)
    for name in found["shm"]:
        (reaper.SHM_ROOT / name).unlink(missing_ok=True)
    for folder in found["folders"]:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(
    ("signum", "status"),
    [
        (signal.SIGTERM, 128 + signal.SIGTERM),
        (signal.SIGHUP, 128 + signal.SIGHUP),
        (signal.SIGINT, 1),  # the report's FAILED, as before
        (signal.SIGKILL, -signal.SIGKILL),
    ],
)
def test_a_stopped_command_leaves_no_process_folder_or_shared_memory_of_its_run(tmp_path, signum, status, left_behind):
    command, out, console = _start_command(tmp_path)
    left_behind["pids"].append((command.pid, reaper.start_time(command.pid)))
    started = json.loads((tmp_path / "pids.json").read_text())
    ray_folders = next(line for line in console.read_text().splitlines() if line.startswith("ray folders ")).split()[2:]
    left_behind["shm"].append(started["shm"])
    left_behind["folders"] += ray_folders
    agent = tmp_path / "pids.json.agent"
    assert _wait_until(lambda: agent.exists() and agent.read_text(), 10)
    mine = [started["driver"], *started["children"], int(agent.read_text())]
    watchdog = [pid for pid, line in reaper.processes_naming(str(out)) if "reaper.py" in line]
    left_behind["pids"] += [(pid, reaper.start_time(pid)) for pid in [*mine, *watchdog]]
    assert all(running(pid) for pid in mine) and all(Path(folder).is_dir() for folder in ray_folders)
    assert len(watchdog) == 1

    command.send_signal(signum)
    assert command.wait(30) == status, console.read_text()

    def gone() -> bool:
        return (
            not any(running(pid) for pid in [*mine, *watchdog])
            and not reaper.processes_naming(str(out))
            and not any(reaper.processes_naming(folder) for folder in ray_folders)
        )

    assert _wait_until(gone, 15), (reaper.processes_naming(str(out)), [p for p in mine if running(p)])
    assert not (reaper.SHM_ROOT / started["shm"]).exists()
    assert not any(Path(folder).exists() for folder in ray_folders)
    if signum != signal.SIGKILL:
        assert f"stopped by {lifetime.signal_name(signum)} after" in (out / "run1" / "log.txt").read_text()
    with own_out(out, overwrite=True):  # the same --out is free for the next rehearsal
        assert sorted(p.name for p in out.iterdir()) == [".lock", ".rehearsal"]


def test_the_watchdog_leaves_everything_alone_once_the_command_cleaned_up(tmp_path):
    folder = tmp_path / "private"
    folder.mkdir()
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", str(folder)], start_new_session=True
    )
    try:
        with reaper.Watchdog("test") as watchdog:
            watchdog.kill(str(folder))
            watchdog.remove(folder)
        assert watchdog._process.returncode == 0
        assert running(sleeper.pid) and folder.is_dir()  # "done": a re-run may already use the same names
        with pytest.raises(RuntimeError), reaper.Watchdog("test") as watchdog:
            watchdog.kill(str(folder))
            watchdog.remove(folder)
            raise RuntimeError("the command failed before it cleaned up")
        assert _wait_until(lambda: not running(sleeper.pid), 5) and not folder.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_child_started_through_the_wrapper_dies_when_its_parent_is_killed(tmp_path):
    script = textwrap.dedent("""
        import subprocess, sys, time
        from dapo_verl.lifetime import dying_with_this_process
        child = subprocess.Popen(dying_with_this_process([sys.executable, "-c", "import time; time.sleep(300)"]))
        print(child.pid, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert _wait_until(
            lambda: (
                Path(f"/proc/{child}/cmdline").read_bytes().startswith(sys.executable.encode() + b"\0-c\0import time")
            ),
            10,
        )  # the wrapper exec'd the command in place
        parent.kill()
        parent.wait()
        assert _wait_until(lambda: not running(child), 5)
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)


def _in_a_process(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_a_second_stop_signal_does_not_interrupt_the_cleanup_of_the_first():
    done = _in_a_process("""
        import os, signal, sys
        from dapo_verl.lifetime import Stopped, stop_signals
        with stop_signals() as stop:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            except Stopped as first:
                os.kill(os.getpid(), signal.SIGHUP)  # arrives while the first one's cleanup runs
                print("cleaned up after", first.signum, flush=True)
        sys.exit(stop.exit_status(0))
    """)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stdout.strip() == f"cleaned up after {int(signal.SIGTERM)}"


def test_a_stop_signal_ignored_at_start_stays_ignored():
    done = _in_a_process("""
        import os, signal
        from dapo_verl.lifetime import stop_signals
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        with stop_signals() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
        print(stop.signum, signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)
    """)
    assert done.returncode == 0 and done.stdout.strip() == "None True", done.stderr


def test_sigterm_calls_the_commands_own_ctrl_c_handler():
    done = _in_a_process("""
        import os, signal
        from dapo_verl.lifetime import stop_signals
        heard = []
        signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))  # a training run's stop request
        with stop_signals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
        print(heard, stop.exit_status(2))
    """)
    assert done.returncode == 0 and done.stdout.strip() == f"[{int(signal.SIGTERM)}] 143", done.stderr


def test_a_folder_whose_earlier_rehearsals_processes_still_live_is_refused_naming_them(tmp_path):
    out = tmp_path / "rehearsal"
    (out / "run1" / "engine").mkdir(parents=True)
    (out / "changes.json").write_text("[]")
    # A process of that rehearsal outlived its command; one that only has out as its working folder is not one.
    left = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        start_new_session=True,
        env={**os.environ, RECORD_ENV: str(out / "run1" / "engine")},
    )
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        cwd=out,
        env={**os.environ, "PWD": str(out), "OUT": str(out)},
    )
    try:
        assert _wait_until(lambda: reaper.processes_with(out, RECORD_ENV), 10)
        refused = (
            rf"--out {out} is still in use by 1 process\(es\) of an earlier rehearsal that outlived its "
            rf"command: pid {left.pid} \(.*python.*\); .*neither a second rehearsal nor --overwrite may start"
            rf".*kill -9 {left.pid}\)"
        )
        for overwrite in (False, True):
            with pytest.raises(RehearsalError, match=refused), own_out(out, overwrite):
                pass
        assert (out / "changes.json").exists() and (out / "run1" / "engine").is_dir()  # nothing was removed
        left.kill()
        left.wait()
        with own_out(out, overwrite=True):
            assert not (out / "run1").exists()
    finally:
        for process in (left, bystander):
            process.kill()
            process.wait()


def test_a_rehearsal_killed_before_its_changes_were_written_can_be_overwritten(tmp_path):
    out = tmp_path / "rehearsal"
    with own_out(out, overwrite=False):
        (out / "model").mkdir()  # killed while building the stand-in: no changes.json yet
    with own_out(out, overwrite=True):
        assert not (out / "model").exists()
