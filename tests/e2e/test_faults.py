"""Crash and resume: injected faults and a SIGKILLed `dapo-verl train` end exactly where an uninterrupted run does."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from dapo_verl.local.checkpoint import LATEST, checkpoint_dir, read_checkpoint
from dapo_verl.local.tracking import read_history
from dapo_verl.local.train import run
from dapo_verl.sampler import BatchReplenisher
from tools.reliability.faults import FAULT_KINDS, run_fault_injection
from tools.reliability.runs import history_differences, state_differences, tiny_overrides

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    return run_fault_injection(seed=0, trials=len(FAULT_KINDS), steps=6, work_dir=tmp_path_factory.mktemp("faults"))


def test_every_fault_kind_fired_and_was_survived(faults):
    assert faults.failures == []
    assert faults.injected == dict.fromkeys(FAULT_KINDS, 1)
    assert faults.survived == faults.injected
    assert faults.invariant_checks >= 15 * len(FAULT_KINDS)
    assert faults.metric_values_compared > 1000


def test_no_group_is_lost_or_trained_twice(faults):
    assert faults.lost_groups == 0 and faults.duplicated_groups == 0


def test_a_damaged_checkpoint_is_named_in_the_log_and_the_previous_one_is_used(faults):
    (trial,) = [t for t in faults.trials if t.kind == "corrupt_checkpoint"]
    assert faults.corruptions_detected == 1
    assert trial.resumed_from == trial.expected_resume == 2  # global_step_4 was damaged
    assert "global_step_4/state.safetensors is unusable" in trial.detected[0]


def test_the_check_fails_when_resuming_forgets_the_sampler(tmp_path, monkeypatch):
    monkeypatch.setattr(BatchReplenisher, "load_state_dict", lambda self, state: None)
    result = run_fault_injection(seed=0, trials=1, steps=6, work_dir=tmp_path)
    assert result.trials[0].crashed and not result.trials[0].survived
    assert result.lost_groups + result.duplicated_groups > 0
    assert any("metrics differ" in f for f in result.failures)


# The default fault injection (12 faults) is the reliability report's (`dapo-verl reliability`), not the suite's: the
# tests above take the same path with one fault of each kind.


def _train_command(out, overrides):
    return [sys.executable, "-m", "dapo_verl.cli", "train", "--out", str(out), *overrides]


def _marker_state(out):
    marker = out / "checkpoints" / LATEST
    return (marker.read_text(), marker.stat().st_mtime_ns) if marker.exists() else None


def _kill_after_a_checkpoint(command, out, delay_s, log):
    """Start `dapo-verl train`, SIGKILL it ``delay_s`` after it wrote a checkpoint; False if it had finished."""
    before = _marker_state(out)
    with log.open("ab") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 300
    while _marker_state(out) == before and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay_s)
    alive = process.poll() is None
    if alive:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=300)
    return alive and process.returncode == -signal.SIGKILL


def _assert_same_run(reference_dir, out, steps):
    assert not history_differences(read_history(reference_dir / "metrics.jsonl"), read_history(out / "metrics.jsonl"))
    _, diffs = state_differences(
        read_checkpoint(checkpoint_dir(reference_dir, steps)), read_checkpoint(checkpoint_dir(out, steps))
    )
    assert diffs == []
    _, diffs = state_differences(
        load_file(str(reference_dir / "model" / "model.safetensors")),
        load_file(str(out / "model" / "model.safetensors")),
    )
    assert diffs == []


def _killed_and_resumed(tmp_path, kills, seed):
    steps = 60
    overrides = tiny_overrides(steps=steps, seed=0, cache_dir=tmp_path / "cache")
    run(overrides, tmp_path / "reference")
    out, log = tmp_path / "killed", tmp_path / "stderr.log"
    command = _train_command(out, overrides)
    rng = random.Random(seed)
    killed = [_kill_after_a_checkpoint(command, out, rng.uniform(0.0, 1.0), log) for _ in range(kills)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert all(killed), f"a run finished before it could be killed: {killed}"
    assert "Resumed from" in finished.stderr
    _assert_same_run(tmp_path / "reference", out, steps)


def test_a_sigkilled_train_process_resumes_to_the_uninterrupted_result(tmp_path):
    _killed_and_resumed(tmp_path, kills=1, seed=0)


@pytest.mark.slow
def test_a_train_process_killed_three_times_still_ends_like_the_uninterrupted_run(tmp_path):
    _killed_and_resumed(tmp_path, kills=3, seed=1)
