"""The ablation's worker pool: runs side by side, and a stop that starts no queued run (fake runs, real processes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from dapo_verl.local.run_pool import AblationInterrupted, train_runs


class Planned(NamedTuple):
    overrides: tuple[str, ...]
    run_dir: Path


def fake_train(overrides, run_dir):
    """A run of 0.05 s steps: the first SIGINT stops it at its next step boundary, a second at once (as
    dapo_verl.local.session.stop_requests does for a real run)."""
    run, options, interrupts = Path(run_dir), dict(o.split("=", 1) for o in overrides), []

    def handler(signum, frame):
        if interrupts:
            raise KeyboardInterrupt
        interrupts.append(signum)

    run.mkdir(parents=True, exist_ok=True)
    (run / "started").touch()
    previous = signal.signal(signal.SIGINT, handler)
    try:
        if options.get("interrupt_driver"):  # as if Ctrl-C reached the driver while this run trains
            os.kill(os.getppid(), signal.SIGINT)
        if options.get("side_by_side"):  # wait, as long as a loaded machine may take to start a worker, for others
            deadline = time.monotonic() + 60
            while len(list(run.parent.glob("*/started"))) < int(options["side_by_side"]):
                assert time.monotonic() < deadline, "the runs did not train side by side"
                time.sleep(0.01)
        for step in range(1, int(options["steps"]) + 1):
            time.sleep(0.05)
            if interrupts:
                (run / "stopped").write_text(str(step))
                raise KeyboardInterrupt  # what a run raises here does not matter to the pool once it was stopped
    finally:
        signal.signal(signal.SIGINT, previous)
    return {"steps": int(options["steps"]), "pid": os.getpid()}


def _plan(tmp_path, count, steps, first=()):
    return [Planned((f"steps={steps}", *(first if k == 0 else ())), tmp_path / f"run{k}") for k in range(count)]


def test_runs_train_side_by_side_and_each_is_yielded_once(tmp_path):
    # Each run waits until two have started: on a loaded machine one worker could otherwise finish all three runs
    # of 0.1 s before the other had imported.
    plan = [Planned(("steps=2", "side_by_side=2"), tmp_path / f"run{k}") for k in range(3)]
    done = list(train_runs(plan, 2, {}, train=fake_train))
    assert sorted(p.run_dir.name for p, _ in done) == ["run0", "run1", "run2"]
    assert len({fields["pid"] for _, fields in done}) == 2 and all(f["steps"] == 2 for _, f in done)


def test_ctrl_c_starts_no_queued_run_and_stops_the_running_ones_at_a_step_boundary(tmp_path):
    plan = _plan(tmp_path, 6, 2000, first=("interrupt_driver=1",))  # 100 s a run, unless stopped
    started = time.monotonic()
    with pytest.raises(
        AblationInterrupted,
        match=r"stopped by Ctrl-C: \d run\(s\) in training stopped at a step "
        r"boundary with a checkpoint and 4 queued run\(s\) were not started",
    ):
        list(train_runs(plan, 2, {}, train=fake_train))
    assert time.monotonic() - started < 60
    assert (tmp_path / "run0" / "stopped").is_file()  # it saw the stop once: a boundary, not an immediate end
    assert not any((tmp_path / f"run{k}").exists() for k in range(2, 6))
    assert (tmp_path / "run1" / "stopped").is_file() or not (tmp_path / "run1").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the driver's handler is gone
