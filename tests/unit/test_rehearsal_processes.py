"""A rehearsal run's time limit fires on a timer, whether or not the run prints, and stops every process it started.

:func:`dapo_verl.rehearsal.processes.launch` is driven here with real child processes standing in for verl's
entry point (no verl): one that goes silent with two grandchildren (one in its process group, one in a session of
its own, as Ray's daemons are), one that keeps printing, one that closes its output and stays, and one that ends.
"""

from __future__ import annotations

import re
import signal
import sys
import textwrap
import time
from pathlib import Path

from dapo_verl.rehearsal.processes import Overrun, launch
from tests.process_helpers import running

_SILENT = textwrap.dedent("""
    import subprocess, sys, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    in_group = subprocess.Popen(sleeper)
    own_session = subprocess.Popen(sleeper, start_new_session=True)
    print("children", in_group.pid, own_session.pid, flush=True)
    time.sleep(120)
""")
_CHATTY = "import time\nwhile True:\n    print('working', flush=True)\n    time.sleep(0.1)"
_CLOSES_OUTPUT = "import os, time\nprint('closing', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(120)"
_ENDS = textwrap.dedent("""
    import sys
    print("step:1 - loss:0.5", flush=True)
    print("step:2 - loss:0.4", flush=True)
    print("ValueError: the rollout engine refused the batch", flush=True)
    sys.exit(3)
""")


def _still_running(pids: list[int], within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s  # SIGKILL is delivered asynchronously
    while (alive := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _launch(tmp_path: Path, script: str, limit_s: float, **hooks):
    echoed: list[str] = []
    started = time.monotonic()
    record = launch(
        "run1",
        [sys.executable, "-c", script],
        tmp_path / "run1",
        limit_s,
        str(tmp_path / "dvr-marker"),
        steps=2,
        echo=echoed.append,
        **hooks,
    )
    return record, time.monotonic() - started, echoed


def test_a_silent_run_is_stopped_at_its_limit_with_every_process_it_started(tmp_path):
    processes = []
    record, elapsed, echoed = _launch(tmp_path, _SILENT, 3.0, on_start=processes.append)
    log = record.log.read_text()
    children = [int(pid) for pid in re.search(r"^children (\d+) (\d+)$", log, re.M).groups()]
    assert elapsed < 3.0 + 5.0
    assert record.returncode == -signal.SIGKILL
    assert re.fullmatch(
        r"run1 reached its time limit of 3 s and was stopped with every process it started; it had "
        r"been silent for the last [0-9] s, since its line at [0-9] s: 'children \d+ \d+'\. .*",
        record.error,
    ), record.error
    assert record.error in log and f"[run1] {record.error}" in echoed
    assert _still_running([processes[0].pid, *children]) == []


def test_a_run_that_keeps_printing_is_stopped_at_its_limit_too(tmp_path):
    record, elapsed, _ = _launch(tmp_path, _CHATTY, 1.5)
    assert elapsed < 1.5 + 5.0 and record.returncode == -signal.SIGKILL
    assert "silent for the last 0 s" in record.error and "'working'" in record.error
    assert record.log.read_text().count("working") >= 2


def test_a_run_whose_output_ends_but_which_does_not_exit_is_stopped_at_its_limit(tmp_path):
    processes = []
    record, elapsed, _ = _launch(tmp_path, _CLOSES_OUTPUT, 1.5, on_start=processes.append)
    assert elapsed < 1.5 + 5.0 and record.returncode == -signal.SIGKILL
    assert "'closing'; its output had ended but its process had not exited" in record.error
    assert _still_running([processes[0].pid]) == []


def test_a_run_that_ends_within_its_limit_is_followed_to_its_end(tmp_path):
    steps: list[int] = []
    record, elapsed, echoed = _launch(tmp_path, _ENDS, 60.0, on_step=steps.append)
    assert elapsed < 30.0 and steps == [1, 2] and record.returncode == 3
    assert record.error == record.first_error == "ValueError: the rollout engine refused the batch"
    assert "[run1] step 2/2 logged" in echoed[2]


def test_the_overrun_of_a_run_that_printed_nothing_says_so():
    message = Overrun(limit_s=600.0, silent_s=600.0).describe("run2 (resume)")
    assert message.startswith(
        "run2 (resume) reached its time limit of 600 s and was stopped with every process it "
        "started; it had been silent since it started (it printed nothing)."
    )
    assert "raise RehearsalOptions.timeout_s" in message


def test_the_overrun_shortens_a_long_last_line():
    message = Overrun(600.0, 565.0, "x" * 500, 35.0).describe("run1")
    assert "silent for the last 565 s, since its line at 35 s: '" + "x" * 197 + "...'" in message
