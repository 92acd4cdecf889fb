"""The rehearsal's resume run starts with the first run and loads the checkpoint only once it is on disk.

:class:`dapo_verl.rehearsal.schedule.Resume` is driven here with a stand-in launch (no verl process): its release
rules alone. :mod:`dapo_verl.rehearsal.bridges.resume_barrier` is driven on stand-in classes; its import hook on verl's
own trainer classes is in tests/integration/test_rehearsal_isolation.py, and the real runs in
tests/e2e/test_rehearse_*.py.
"""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pytest

from dapo_verl.rehearsal.bridges import resume_barrier
from dapo_verl.rehearsal.processes import RunRecord
from dapo_verl.rehearsal.schedule import Resume, checkpointed_step


def _record(tmp_path: Path) -> RunRecord:
    return RunRecord("run2 (resume)", ["python"], 0, 1.0, tmp_path / "log.txt", tmp_path / "metrics.jsonl")


def _resume(tmp_path: Path, launch) -> Resume:
    return Resume(launch, tmp_path / "checkpoints", step=2, barrier=tmp_path / "ready", timeout_s=30)


def test_the_resume_starts_at_once_and_is_released_when_verls_tracker_names_thecheckpointed_step(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    released = threading.Event()

    def launch(on_start, stopped):  # the resume process: starts up, then waits at the barrier as verl's load would
        resume_barrier.wait_for(tmp_path / "ready", timeout_s=10, poll_s=0.01)
        released.set()
        return _record(tmp_path)

    resume = _resume(tmp_path, launch)
    resume.start()
    resume.on_step(1)  # an earlier step: no release
    resume.on_step(2)  # the checkpointed step was logged, but the tracker file does not name it yet
    assert not released.wait(0.5)
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    assert released.wait(5.0)
    assert resume.result() == _record(tmp_path)


def test_asking_for_the_result_releases_the_resume(tmp_path):
    # A recipe without verl's console logger prints no step lines: the first run's end releases the resume.
    resume = _resume(
        tmp_path, lambda on_start, stopped: resume_barrier.wait_for(tmp_path / "ready", 5, 0.01) or _record(tmp_path)
    )
    resume.start()
    assert resume.result() == _record(tmp_path)


def test_stopping_kills_a_waiting_resume_releases_nothing_and_tells_its_launch_why(tmp_path):
    started, told = threading.Event(), []

    def launch(on_start, stopped):
        assert stopped() is None  # nothing stopped it yet
        started.set()
        time.sleep(0.2)
        told.append(stopped())  # asked by the launch once its process has ended
        return _record(tmp_path)

    resume = _resume(tmp_path, launch)
    resume.start()
    assert started.wait(5)
    resume.stop("Ctrl-C", interrupted=True)
    resume.stop("the first run did not finish")  # the first reason stays
    assert resume.join() == _record(tmp_path)
    assert told == [("Ctrl-C", True)]
    assert not (tmp_path / "ready").exists()


def test_a_resume_stopped_before_it_started_has_no_record(tmp_path):
    resume = _resume(tmp_path, lambda on_start, stopped: _record(tmp_path))
    resume.stop("the first run did not finish")
    assert resume.join() is None


def test_an_error_in_the_resume_thread_reaches_the_caller(tmp_path):
    def launch(on_start, stopped):
        raise OSError("no space left on device")

    resume = _resume(tmp_path, launch)
    resume.start()
    with pytest.raises(OSError, match="no space left on device"):
        resume.result()


def test_the_tracker_file_reads_zero_until_verl_writes_a_number(tmp_path):
    assert checkpointed_step(tmp_path) == 0
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("")
    assert checkpointed_step(tmp_path) == 0
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2\n")
    assert checkpointed_step(tmp_path) == 2


def test_the_barrier_makes_load_checkpoint_wait_for_the_file_then_runs_verls_code(tmp_path):
    calls = []

    class RayPPOTrainer:
        def _load_checkpoint(self, *args):
            calls.append(args)
            return "loaded"

    module = types.ModuleType("verl.trainer.ppo.ray_trainer")
    module.RayPPOTrainer = RayPPOTrainer
    barrier = tmp_path / "ready"
    resume_barrier._patch(module, barrier, timeout_s=10)
    resume_barrier._patch(module, barrier, timeout_s=10)  # idempotent: one wrapper
    threading.Timer(0.3, barrier.touch).start()
    started = time.monotonic()
    assert RayPPOTrainer()._load_checkpoint(1) == "loaded"
    assert time.monotonic() - started >= 0.2 and calls == [(1,)]


def test_a_barrier_never_released_times_out_naming_the_file(tmp_path):
    with pytest.raises(TimeoutError, match="ready was never created"):
        resume_barrier.wait_for(tmp_path / "ready", timeout_s=0.3, poll_s=0.05)


def test_without_the_variable_nothing_is_installed(monkeypatch):
    monkeypatch.delenv(resume_barrier.ENV, raising=False)
    assert resume_barrier.install() is False


def test_the_resume_check_skips_only_what_verls_checkpoint_does_not_hold():
    from dapo_verl.rehearsal.resume_check import resume_check

    first = {
        3: {
            "separate_async/switch/threshold_ratio": 1.0,
            "separate_async/decision/remaining": 0.0,
            "separate_async/decision/sampleable_count": 4.0,
            "dapo/sampler/groups_trained": 4.0,
        }
    }
    resumed = {
        3: {
            "separate_async/switch/threshold_ratio": 0.4,
            "separate_async/decision/remaining": 2.0,
            "separate_async/decision/sampleable_count": 4.0,
            "dapo/sampler/groups_trained": 4.0,
        }
    }
    assert resume_check(first, resumed, 3)["identical"]  # verl's adaptive threshold restarts from the config
    resumed[3]["separate_async/decision/sampleable_count"] = 2.0  # the buffer's own answer must still agree
    check = resume_check(first, resumed, 3)
    assert not check["identical"] and check["differences"] == ["separate_async/decision/sampleable_count: 4.0 vs 2.0"]
