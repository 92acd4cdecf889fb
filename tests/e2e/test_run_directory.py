"""A run directory has one writer, holds one configuration, says how each start began, and stops cleanly."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from dapo_verl.cli import main
from dapo_verl.local import train as train_module
from dapo_verl.local.checkpoint import STATE_FILE, checkpoint_dir
from dapo_verl.local.rundir import HISTORY_FILE, RunDirectoryBusy, run_directory_lock
from dapo_verl.local.train import RunInterrupted, run
from tools.reliability.guards import one_line_error
from tools.reliability.runs import tiny_overrides

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _tiny(cache, steps=4, seed=0):
    return tiny_overrides(steps=steps, seed=seed, cache_dir=cache)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache):
    """A finished 4-step run, copied fresh into each test that changes it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = run(_tiny(cache), out)
    return out, result


def _copy(finished, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    return out


def _one_line_error(capsys):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    return last


# -- the lock -------------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_and_told_who_holds_the_directory(tmp_path, cache, capsys):
    out = tmp_path / "run"
    with run_directory_lock(out):
        with pytest.raises(RunDirectoryBusy, match=rf"pid {os.getpid()} on .*another --out"):
            run(_tiny(cache), out)
        assert main(["train", "--out", str(out), *_tiny(cache)]) == 2
        assert "is being written by another run" in _one_line_error(capsys)
    assert not (out / "metrics.jsonl").exists()


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, cache, caplog):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text(
        json.dumps({"pid": 999999, "host": "elsewhere", "command": "dapo-verl train", "started": "2025-01-01 00:00:00"})
    )
    with caplog.at_level(logging.INFO, logger="dapo_verl"):
        result = run(_tiny(cache, steps=2), out)
    assert result.steps == 2
    assert any("pid 999999" in r.getMessage() and "killed" in r.getMessage() for r in caplog.records)
    assert (out / ".lock").read_text() == ""  # released cleanly


# -- the binding ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor_rollout_ref.actor.clip_ratio_high=0.2", "actor_rollout_ref.actor.clip_ratio_high"),
        ("data.seed=1", "data.seed"),
    ],
)
def test_a_rerun_with_a_changed_setting_is_refused_and_relabels_nothing(
    finished, tmp_path, cache, capsys, override, key
):
    out = _copy(finished, tmp_path)
    before = {name: (out / name).read_bytes() for name in ("config.yaml", "summary.json", "metrics.jsonl")}
    overrides = [o for o in _tiny(cache) if not o.startswith(key + "=")] + [override]
    assert main(["train", "--out", str(out), *overrides]) == 2
    line = _one_line_error(capsys)
    assert f"{key}=" in line and "there" in line and "now" in line
    assert "--out" in line and "--allow-config-change" in line
    assert {name: (out / name).read_bytes() for name in before} == before


def test_a_checkpoint_swapped_in_from_another_run_is_refused(finished, tmp_path, cache):
    other = run(_tiny(cache, seed=1), tmp_path / "other")
    out = _copy(finished, tmp_path)
    target = checkpoint_dir(out, 4) / STATE_FILE
    target.write_bytes((checkpoint_dir(other.run_dir, 4) / STATE_FILE).read_bytes())
    with pytest.raises(ValueError, match=r"checkpoint at step 4.*data\.seed=1 there, 0 now"):
        run([*_tiny(cache, steps=6)], out)


def test_an_allowed_change_continues_and_is_recorded_in_the_history(finished, tmp_path, cache):
    out = _copy(finished, tmp_path)
    overrides = [*_tiny(cache, steps=6), "actor_rollout_ref.actor.clip_ratio_high=0.2"]
    with pytest.raises(ValueError, match="--allow-config-change"):
        run(overrides, out)
    result = run(overrides, out, allow_config_change=True)
    assert result.resumed_from == 4 and result.steps == 6
    change = {"key": "actor_rollout_ref.actor.clip_ratio_high", "recorded": 0.28, "requested": 0.2, "step": 4}
    assert json.loads((out / "summary.json").read_text())["config_changes"] == [change]
    events = [json.loads(line) for line in (out / HISTORY_FILE).read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "finish", "start", "finish"]
    assert events[2]["resumed_from"] == 4 and events[2]["config_changes"][0]["key"] == change["key"]


def test_another_model_size_cannot_continue_even_when_changes_are_allowed(finished, tmp_path, cache, capsys):
    out = _copy(finished, tmp_path)
    overrides = [*_tiny(cache, steps=6), "local.model.hidden_size=32"]
    assert main(["train", "--out", str(out), "--allow-config-change", *overrides]) == 2
    line = _one_line_error(capsys)
    assert "local.model.hidden_size=64 there, 32 now" in line and "new directory" in line


@pytest.mark.parametrize("key", ["data.seed", "local.task.heldout_size"])
def test_a_change_of_the_held_out_split_cannot_continue_even_when_changes_are_allowed(
    finished, tmp_path, cache, capsys, key
):
    out = _copy(finished, tmp_path)
    before = {name: (out / name).read_bytes() for name in ("config.yaml", "summary.json", "metrics.jsonl")}
    value = {"data.seed": "5", "local.task.heldout_size": "60"}[key]
    overrides = [o for o in _tiny(cache, steps=6) if not o.startswith(key + "=")] + [f"{key}={value}"]
    assert main(["train", "--out", str(out), "--allow-config-change", *overrides]) == 2
    line = _one_line_error(capsys)
    assert f"{key}=" in line and "held-out split" in line and "cannot accept it" in line
    assert {name: (out / name).read_bytes() for name in before} == before


def _snapshot(out):
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_finished_run_started_again_changes_nothing_it_recorded(finished, tmp_path, cache, capsys):
    out = _copy(finished, tmp_path)
    before = _snapshot(out)
    result = run(_tiny(cache), out)
    assert _snapshot(out) == before  # summary.json (wall time, resumed_from), history, model: byte for byte
    assert (result.steps, result.resumed_from, result.final_accuracy) == (
        4,
        finished[1].resumed_from,
        finished[1].final_accuracy,
    )
    assert main(["train", "--out", str(out), *_tiny(cache, steps=3)]) == 2  # a shorter run would relabel it
    line = _one_line_error(capsys)
    assert "trained for 4 steps, more than trainer.total_training_steps=3" in line
    assert _snapshot(out) == before


def test_a_gap_in_the_metrics_log_is_refused_at_resume(finished, tmp_path, cache, capsys):
    out = _copy(finished, tmp_path)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(lines[:2]))  # steps 0 and 1 of 4 left
    before = _snapshot(out)
    assert main(["train", "--out", str(out), *_tiny(cache, steps=6)]) == 2
    line = _one_line_error(capsys)
    assert "metrics.jsonl lacks step(s) 2, 3, 4 of the 4 its checkpoint at step 4 trained" in line
    assert _snapshot(out) == before


def test_a_full_disk_inside_the_checkpoint_writer_is_one_line_naming_the_file(tmp_path, cache, capsys, monkeypatch):
    from safetensors import SafetensorError

    from dapo_verl import state_io

    def full(*args, **kwargs):  # what safetensors raises when the disk fills while it writes
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    out = tmp_path / "run"
    monkeypatch.setattr(state_io, "save_file", full)
    assert main(["train", "--out", str(out), *_tiny(cache)]) == 2
    line = _one_line_error(capsys)
    assert "No space left on device" in line and "global_step_2/state.safetensors" in line
    assert not list((out / "checkpoints").rglob("*.tmp")) and not list((out / "checkpoints").rglob("state.*"))
    monkeypatch.undo()
    assert run(_tiny(cache), out).steps == 4


def test_every_start_says_whether_it_resumed_or_started_fresh(tmp_path, cache, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="dapo_verl.local.train"):
        run(_tiny(cache, steps=2), out)
        run(_tiny(cache, steps=4), out)
    starts = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("Starting fresh", "Resumed"))]
    assert len(starts) == 2
    assert starts[0].startswith(f"Starting fresh in {out}")
    assert starts[1].startswith("Resumed from step 2")


# -- one-line errors ------------------------------------------------------------------------------------


def test_out_naming_a_file_is_a_one_line_error(tmp_path, cache, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    assert main(["train", "--out", str(file), *_tiny(cache)]) == 2
    assert "is a file, not a run directory" in _one_line_error(capsys)
    assert file.read_text() == "mine"


def test_a_missing_resume_path_is_a_one_line_error(tmp_path, cache, capsys):
    missing = tmp_path / "nowhere" / "global_step_3"
    code = main(
        [
            "train",
            "--out",
            str(tmp_path / "run"),
            *_tiny(cache),
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={missing}",
        ]
    )
    assert code == 2
    assert f"No checkpoint at {missing}" in _one_line_error(capsys)


@pytest.mark.parametrize(
    ("code", "words"), [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system")]
)
def test_a_failed_write_is_a_one_line_error_and_the_run_resumes_after_it(
    tmp_path, cache, capsys, monkeypatch, code, words
):
    out = tmp_path / "run"
    real = train_module.save_checkpoint

    def failing(run_dir, step, **kwargs):
        if step == 4:
            raise OSError(code, os.strerror(code), str(checkpoint_dir(run_dir, step) / STATE_FILE))
        return real(run_dir, step, **kwargs)

    monkeypatch.setattr(train_module, "save_checkpoint", failing)
    assert main(["train", "--out", str(out), *_tiny(cache)]) == 2
    line = _one_line_error(capsys)
    assert words in line and "global_step_4" in line
    monkeypatch.undo()
    assert run(_tiny(cache), out).resumed_from == 2


def test_an_unwritable_out_is_a_one_line_error(tmp_path, cache, capsys, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "run"))

    monkeypatch.setattr("pathlib.Path.mkdir", read_only)
    assert main(["train", "--out", str(tmp_path / "run"), *_tiny(cache)]) == 2
    line = _one_line_error(capsys)
    assert "Read-only file system" in line and "--out" in line


# -- Ctrl-C ---------------------------------------------------------------------------------------------


def test_ctrl_c_stops_at_a_step_boundary_after_writing_a_checkpoint(tmp_path, cache, capsys, monkeypatch):
    out = tmp_path / "run"
    real = train_module._Trainer._train_step

    def step_then_interrupt(self, step):
        metrics = real(self, step)
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(train_module._Trainer, "_train_step", step_then_interrupt)
    assert main(["train", "--out", str(out), *_tiny(cache, steps=8)]) == 2
    line = _one_line_error(capsys)
    assert "Ctrl-C" in line and "step 3" in line and "same command" in line
    assert load_file(str(checkpoint_dir(out, 3) / STATE_FILE))  # save_freq=2, yet step 3 was saved
    monkeypatch.undo()
    result = run(_tiny(cache, steps=8), out)
    assert result.resumed_from == 3 and result.steps == 8
    reference = run(_tiny(cache, steps=8), tmp_path / "reference")
    strip = [{k: v for k, v in r["data"].items() if not k.startswith("timing_s/")} for r in result.history]
    assert strip == [{k: v for k, v in r["data"].items() if not k.startswith("timing_s/")} for r in reference.history]


_STOP_SIGNAL_AT_STEP_3 = """
import os, signal, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, whatever started the test
from dapo_verl.cli import main
from dapo_verl.local import train
real = train._Trainer._train_step
def step_then_signal(self, step):
    metrics = real(self, step)
    if step == 3:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    return metrics
train._Trainer._train_step = step_then_signal
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_like_ctrl_c_and_exit_128_plus_the_signal(tmp_path, cache, name):
    # In a process of its own: without the CLI's handler the signal would end the test's process.
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", _STOP_SIGNAL_AT_STEP_3, name, "train", "--out", str(out), *_tiny(cache, steps=8)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 128 + getattr(signal, name), done.stderr[-2000:]
    line = one_line_error(done.stderr)
    assert line is not None and line.startswith(f"dapo-verl train: stopped by {name} after step 3,"), done.stderr
    assert "same command" in line
    assert load_file(str(checkpoint_dir(out, 3) / STATE_FILE))  # save_freq=2, yet step 3 was saved


def test_run_outputs_are_readable_by_group_and_others(finished):
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in finished[0].rglob("*")}
    private = sorted(str(p) for p, mode in modes.items() if not mode & 0o044)
    assert private == []


def test_ctrl_c_raises_run_interrupted_from_python(tmp_path, cache, monkeypatch):
    real = train_module._Trainer._train_step

    def step_then_interrupt(self, step):
        metrics = real(self, step)
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(train_module._Trainer, "_train_step", step_then_interrupt)
    with pytest.raises(RunInterrupted) as info:
        run(_tiny(cache), tmp_path / "run")
    assert info.value.step == 1
