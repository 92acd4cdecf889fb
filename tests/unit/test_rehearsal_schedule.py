"""A rehearsal's two runs, stopped by a signal or by the first run's failure, each end with a state the report lists.

:func:`dapo_verl.rehearsal.schedule.run_both` is driven in a subprocess (so that it gets real signals) with a small
script standing in for verl's entry point: the first run logs its steps, the resume run (its overrides name
``resume_path``) logs the resumed step; each then waits or exits as the case needs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

_FAKE_RUN = textwrap.dedent("""
    import sys, time
    resumed = any("resume_mode=resume_path" in arg for arg in sys.argv)
    print("step:3 - resumed" if resumed else "step:1 - loss:0.5\\nstep:2 - loss:0.4", flush=True)
    if sys.argv[1] == "first-fails" and not resumed:
        sys.exit(1)
    if sys.argv[1] == "first-runs-out-of-memory" and not resumed:
        block = b"\\x01" * (64 * 2**20)
        time.sleep(1.5)  # seen by the memory sampler
        print("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.", flush=True)
        sys.exit(1)
    if sys.argv[1] == "first-finishes" and not resumed:
        sys.exit(0)
    time.sleep(120)
""")
_HARNESS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from types import SimpleNamespace
    from dapo_verl.lifetime import stop_signals
    from dapo_verl.rehearsal.schedule import Target, run_both

    out, case, overlap = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "overlap"
    ray_dirs = [str(out / "dvr-a"), str(out / "dvr-b")]
    for folder in ray_dirs:
        Path(folder).mkdir(parents=True)
    options = SimpleNamespace(steps=3, resume=True, overlap=overlap, timeout_s=60.0, overrides=())
    with stop_signals():
        target = Target([sys.executable, "-c", sys.argv[4], case], lambda run: out / run / "checkpoints")
        outcome = run_both(options, target, [], out, ray_dirs, lambda line: print(line, flush=True))
    runs = [[run.name, run.state, run.stopped_by, run.returncode, run.error] for run in outcome.runs]
    print("OUTCOME " + json.dumps({"runs": runs, "not_started": outcome.not_started,
                                   "interrupted_by": outcome.interrupted_by,
                                   "peak": outcome.memory.total.bytes, "run1_peak": outcome.memory.runs["run1"].bytes}))
""")


def _run(tmp_path, case: str, overlap: bool, signum: int | None = None, when: str = "") -> dict:
    console = tmp_path / "console.txt"
    with open(console, "w") as sink:
        harness = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _HARNESS,
                str(tmp_path / "out"),
                case,
                "overlap" if overlap else "sequential",
                _FAKE_RUN,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        if signum is not None:
            deadline = time.monotonic() + 60
            while when not in console.read_text():
                assert harness.poll() is None and time.monotonic() < deadline, console.read_text()
                time.sleep(0.1)
            time.sleep(1.5)  # the memory sampler's samples (every 0.5 s) see the runs' processes
            harness.send_signal(signum)
        assert harness.wait(60) == 0, console.read_text()
    finally:
        harness.kill()
    text = console.read_text()
    return {"console": text, **json.loads(text.split("OUTCOME ", 1)[1])}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_both_runs_are_up_interrupts_both_and_lists_both(tmp_path, signum):
    outcome = _run(tmp_path, "both-wait", overlap=True, signum=signum, when="[run1] step 2/3 logged")
    by = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert outcome["interrupted_by"] == by
    assert [run[:4] for run in outcome["runs"]] == [
        ["run1", "interrupted", by, -9],
        ["run2 (resume)", "interrupted", by, -9],
    ]
    assert outcome["not_started"] == {}
    assert f"[run1] interrupted by {by} after" in outcome["console"]
    assert f"stopped by {by} after" in (tmp_path / "out" / "run2" / "log.txt").read_text()
    assert outcome["run1_peak"] > 0 and outcome["peak"] > outcome["run1_peak"]  # the harness itself counts in total


def test_ctrl_c_during_the_first_run_leaves_the_resume_run_not_started(tmp_path):
    outcome = _run(tmp_path, "both-wait", overlap=False, signum=signal.SIGINT, when="[run1] step 2/3 logged")
    assert [run[:3] for run in outcome["runs"]] == [["run1", "interrupted", "Ctrl-C"]]
    assert outcome["not_started"] == {"run2 (resume)": "the rehearsal was interrupted by Ctrl-C before it started"}
    assert not (tmp_path / "out" / "run2").exists()


def test_ctrl_c_while_waiting_for_the_resume_run_interrupts_it_and_keeps_the_finished_first_run(tmp_path):
    # The main thread waits for the resume run's thread here, outside any launch: the signal reaches it there.
    outcome = _run(
        tmp_path, "first-finishes", overlap=False, signum=signal.SIGINT, when="[run2 (resume)] step 3/3 logged"
    )
    assert [run[:4] for run in outcome["runs"]] == [
        ["run1", "finished", "", 0],
        ["run2 (resume)", "interrupted", "Ctrl-C", -9],
    ]
    assert outcome["interrupted_by"] == "Ctrl-C" and outcome["not_started"] == {}


def test_an_overlapped_resume_run_is_stopped_when_the_first_run_fails(tmp_path):
    outcome = _run(tmp_path, "first-fails", overlap=True)
    assert outcome["interrupted_by"] == ""
    assert [run[:3] for run in outcome["runs"]] == [
        ["run1", "failed", ""],
        ["run2 (resume)", "stopped", "the first run did not finish"],
    ]
    assert outcome["runs"][1][4].startswith("stopped after ") and outcome["runs"][1][4].endswith(
        ": the first run did not finish"
    )


def test_a_sequential_resume_run_does_not_start_after_the_first_run_fails(tmp_path):
    outcome = _run(tmp_path, "first-fails", overlap=False)
    assert [run[:2] for run in outcome["runs"]] == [["run1", "failed"]]
    assert outcome["not_started"] == {"run2 (resume)": "the first run failed; the resume run needs its checkpoint"}


def test_a_run_that_rays_memory_monitor_killed_says_so_in_one_line_with_the_peak_and_the_fix(tmp_path):
    outcome = _run(tmp_path, "first-runs-out-of-memory", overlap=True)
    first, resume = outcome["runs"]
    assert first[:2] == ["run1", "failed"] and resume[:2] == ["run2 (resume)", "stopped"]
    line = first[4]
    assert line.startswith(
        "run1 was killed for lack of memory: Ray's memory monitor killed a worker "
        "('ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.')"
        "; the rehearsal's processes held up to "
    ), line
    assert "GiB (run1: " in line and "(run1: 0.0 GiB;" not in line and "\n" not in line
    assert line.endswith(
        "or rehearse without --overlap-resume: the resume run then starts after the first run "
        "ends, and one trainer, rollout engine and Ray cluster run at a time."
    )
    assert f"[run1] {line}" in outcome["console"]
