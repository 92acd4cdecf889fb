"""Every `dapo-verl` command ends a failure with one line on stderr and exit status 2, Ctrl-C included."""

from __future__ import annotations

import pytest

from dapo_verl.cli import main


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(("command", "target"), [
    (["compare", "runs/x"], "dapo_verl.report.build_report"),
    (["prepare-data", "--aime", "x.parquet", "--out", "o"], "dapo_verl.data.prepare_data"),
    (["toy"], "dapo_verl.toy.run_toy"),
])
def test_ctrl_c_in_any_command_is_one_line_with_exit_2(monkeypatch, capsys, command, target):
    monkeypatch.setattr(target, _interrupt)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"dapo-verl {command[0]}: interrupted by Ctrl-C."


def test_ctrl_c_while_train_sets_up_says_the_run_continues(monkeypatch, capsys):
    monkeypatch.setattr("dapo_verl.local.train.run_spec", _interrupt)
    assert main(["train", "trainer.total_training_steps=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("dapo-verl train: interrupted by Ctrl-C.") and "last checkpoint" in err
