"""Local checkpoints: atomic writes, fallback past damaged checkpoints, stale temporaries, cut metrics lines."""

from __future__ import annotations

import logging

import pytest
import torch

from dapo_verl.config import SamplerConfig
from dapo_verl.files import write_text_atomically
from dapo_verl.local.checkpoint import (
    LATEST,
    STATE_FILE,
    checkpoint_dir,
    find_resume_point,
    read_marker,
    save_checkpoint,
)
from dapo_verl.local.files import remove_stale_temporaries, replace_directory
from dapo_verl.local.tracking import MetricsLog, read_history
from dapo_verl.sampler import BatchReplenisher
from dapo_verl.sampler.simulation import SimulatedPolicy
from dapo_verl.state_io import CorruptStateError


def _save(run_dir, steps):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    sampler = BatchReplenisher(
        SamplerConfig(train_batch_size=2), 16, SimulatedPolicy(lambda prompt_id, step: 0.5, group_size=4)
    )
    for step in steps:
        sampler.next_batch()
        with torch.no_grad():
            model.weight.add_(1.0)
        save_checkpoint(run_dir, step, model=model, optimizer=optimizer, sampler=sampler, config={"step": step})


def _damage(run_dir, step, how):
    file = checkpoint_dir(run_dir, step) / STATE_FILE
    data = bytearray(file.read_bytes())
    if how == "truncate":
        file.write_bytes(bytes(data[: len(data) // 3]))
    elif how == "flip":
        data[-5] ^= 0x40
        file.write_bytes(bytes(data))
    else:
        file.unlink()


def test_the_marker_names_the_newest_checkpoint_and_no_temporary_files_remain(tmp_path):
    _save(tmp_path, [1, 2])
    point = find_resume_point(tmp_path)
    assert point is not None and point.step == 2 and point.skipped == ()
    assert point.state["config"] == {"step": 2}
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["global_step_1", "global_step_2", LATEST]
    assert [p.name for p in checkpoint_dir(tmp_path, 2).iterdir()] == [STATE_FILE]


@pytest.mark.parametrize("how", ["truncate", "flip", "delete"])
def test_a_damaged_latest_checkpoint_is_named_and_the_previous_good_one_is_used(tmp_path, caplog, how):
    _save(tmp_path, [1, 2, 3])
    _damage(tmp_path, 3, how)
    with caplog.at_level(logging.WARNING, logger="dapo_verl.local.checkpoint"):
        point = find_resume_point(tmp_path)
    assert point is not None and point.step == 2 and len(point.skipped) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(checkpoint_dir(tmp_path, 3) / STATE_FILE) in errors[0]
    assert any("previous good checkpoint" in r.getMessage() for r in caplog.records)
    assert read_marker(tmp_path) == 2  # the marker no longer points at the damaged checkpoint


def test_fallback_walks_down_past_several_damaged_checkpoints(tmp_path):
    _save(tmp_path, [2, 4, 6])
    _damage(tmp_path, 6, "truncate")
    _damage(tmp_path, 4, "flip")
    point = find_resume_point(tmp_path)
    assert point is not None and point.step == 2 and len(point.skipped) == 2


def test_checkpoints_newer_than_the_marker_are_ignored(tmp_path):
    _save(tmp_path, [1, 2, 3])
    write_text_atomically(tmp_path / "checkpoints" / LATEST, "2\n")  # 3: written, then the process died
    point = find_resume_point(tmp_path)
    assert point is not None and point.step == 2


def test_an_unreadable_marker_falls_back_to_the_newest_good_directory(tmp_path, caplog):
    _save(tmp_path, [1, 2])
    (tmp_path / "checkpoints" / LATEST).write_text("\x00garbage")
    with caplog.at_level(logging.WARNING, logger="dapo_verl.local.checkpoint"):
        point = find_resume_point(tmp_path)
    assert point is not None and point.step == 2
    assert "not a step number" in caplog.text


def test_without_any_checkpoint_there_is_nothing_to_resume(tmp_path):
    assert find_resume_point(tmp_path) is None


def test_when_every_checkpoint_is_damaged_resuming_refuses_with_the_fix(tmp_path):
    _save(tmp_path, [1, 2])
    _damage(tmp_path, 1, "flip")
    _damage(tmp_path, 2, "truncate")
    fix = r"all 2 are damaged or missing \(global_step_2, global_step_1; .* trainer.resume_mode=disable"
    with pytest.raises(CorruptStateError, match=fix):
        find_resume_point(tmp_path)


def test_stale_temporaries_and_empty_checkpoint_directories_are_removed(tmp_path):
    _save(tmp_path, [1])
    stale = [
        checkpoint_dir(tmp_path, 1) / ".state.safetensors.abc.tmp",
        tmp_path / "checkpoints" / ".x.tmp",
        tmp_path / ".config.yaml.q1.tmp",
    ]
    for path in stale:
        path.write_bytes(b"half")
    (tmp_path / ".model.z.tmp").mkdir()
    checkpoint_dir(tmp_path, 2).mkdir()
    removed = remove_stale_temporaries(tmp_path)
    assert set(removed) == {*stale, tmp_path / ".model.z.tmp", checkpoint_dir(tmp_path, 2)}
    assert (checkpoint_dir(tmp_path, 1) / STATE_FILE).exists()
    assert remove_stale_temporaries(tmp_path) == []


def test_replace_directory_swaps_in_the_new_contents(tmp_path):
    target = tmp_path / "model"
    replace_directory(target, lambda d: (d / "a").write_text("1"))
    replace_directory(target, lambda d: (d / "b").write_text("2"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert [p.name for p in target.iterdir()] == ["b"]


def test_a_metrics_line_cut_by_a_crash_is_dropped_on_resume(tmp_path, caplog):
    log = MetricsLog(tmp_path, resume_step=None)
    for step in range(3):
        log.log({"x": float(step)}, step=step)
    log.close()
    path = tmp_path / "metrics.jsonl"
    path.write_text(path.read_text() + '{"step": 3, "data": {"x": 3.')
    with caplog.at_level(logging.WARNING, logger="dapo_verl.local.tracking"):
        assert [r["step"] for r in read_history(path)] == [0, 1, 2]
    assert "line 4 is cut short" in caplog.text
    resumed = MetricsLog(tmp_path, resume_step=2)
    resumed.log({"x": 3.0}, step=3)
    resumed.close()
    assert [r["data"]["x"] for r in read_history(path)] == [0.0, 1.0, 2.0, 3.0]


def test_a_damaged_metrics_line_before_the_last_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "data": {}}\nnot json\n{"step": 1, "data": {}}\n')
    with pytest.raises(ValueError, match="line 2 is not a metrics record"):
        read_history(path)


def test_before_the_first_marker_a_complete_state_file_is_used(tmp_path):
    _save(tmp_path, [2])
    (tmp_path / "checkpoints" / LATEST).unlink()  # killed after the state file, before its marker
    point = find_resume_point(tmp_path)
    assert point is not None and point.step == 2
