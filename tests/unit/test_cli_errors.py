"""Every `dapo-verl` command ends a failure with one line on stderr and exit status 2, Ctrl-C included."""

from __future__ import annotations

import pytest

from dapo_verl.cli import main


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("command", "target"),
    [
        (["compare", "runs/x"], "dapo_verl.report.build_report"),
        (["prepare-data", "--aime", "x.parquet", "--out", "o"], "dapo_verl.data.prepare_data"),
        (["toy"], "dapo_verl.toy.run_toy"),
    ],
)
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


def test_toy_out_naming_a_file_is_one_line(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    assert main(["toy", "--out", str(file)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("dapo-verl toy: File exists") and "not a file" in err and file.read_text() == "mine"


@pytest.mark.parametrize("seed", ["99999999999999999999", "4294967296", "-1"])
def test_a_seed_the_run_cannot_use_is_one_line_naming_data_seed(capsys, seed):
    assert main(["train", f"data.seed={seed}", "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dapo-verl train: data.seed={seed} must lie in [0, 4294967295]")


def test_a_deletion_is_refused_naming_the_key_and_its_value(capsys):
    assert main(["train", "~data.train_batch_size", "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "dapo-verl train: ~data.train_batch_size (16 in the config) deletes the key, so the run would read "
        "an internal default in place of the config's value and its saved config would not say so. Set "
        "data.train_batch_size=VALUE instead (null where the key takes null)."
    )


@pytest.mark.parametrize("command", [["reliability"], ["config", "--check"], ["config", "--write"]])
def test_a_repository_tool_outside_a_source_checkout_says_where_to_run_it(tmp_path, monkeypatch, capsys, command):
    from dapo_verl import cli

    monkeypatch.setattr(cli, "REPOSITORY", tmp_path)  # as in an installed wheel: no tools/ beside the package
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "runs the repository's own tools" in err and "Run it in a source checkout" in err


def test_config_without_flags_prints_the_shipped_defaults_in_any_install(tmp_path, monkeypatch, capsys):
    from dapo_verl import cli

    monkeypatch.setattr(cli, "REPOSITORY", tmp_path)
    assert main(["config"]) == 0
    assert capsys.readouterr().out == cli.DEFAULTS_YAML.read_text()
