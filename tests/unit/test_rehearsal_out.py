"""A rehearsal's --out has one writer: a running rehearsal's folder is never replaced, --overwrite included, and
--overwrite empties only an earlier rehearsal's folder."""

from __future__ import annotations

import pytest

from dapo_verl.local.rundir import run_directory_lock
from dapo_verl.rehearsal.folders import RehearsalError, own_out
from dapo_verl.rehearsal.run import RehearsalOptions, rehearse


def _earlier_rehearsal(out):
    (out / "run1").mkdir(parents=True)
    (out / "run1" / "metrics.jsonl").write_text("{}\n")
    (out / "changes.json").write_text("[]")


def test_a_folder_whose_rehearsal_still_runs_is_refused_even_with_overwrite(tmp_path):
    out = tmp_path / "rehearsal"
    _earlier_rehearsal(out)
    with run_directory_lock(out):  # the running rehearsal holds its folder
        for overwrite in (False, True):
            options = RehearsalOptions(config_name="dapo_trainer", out_dir=out, overwrite=overwrite)
            with pytest.raises(
                RehearsalError,
                match=r"belongs to a rehearsal that is still running, and neither a "
                r"second rehearsal nor --overwrite may replace it: .*pid",
            ):
                rehearse(options, echo=lambda line: None)
    assert (out / "run1" / "metrics.jsonl").read_text() == "{}\n"  # nothing of it was touched


def test_overwrite_empties_only_an_earlier_rehearsals_folder(tmp_path):
    out = tmp_path / "rehearsal"
    _earlier_rehearsal(out)
    with own_out(out, overwrite=True):
        assert sorted(p.name for p in out.iterdir()) == [".lock", ".rehearsal"]  # held: a second writer is refused
        with pytest.raises(RehearsalError, match="still running"), own_out(out, overwrite=True):
            pass
    with own_out(out, overwrite=True):  # released at the end: a finished rehearsal's folder can be replaced
        pass


def test_overwrite_never_empties_a_folder_that_is_not_a_rehearsals(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(
        RehearsalError,
        match=r"is not a rehearsal folder \(it has no changes.json\); --overwrite "
        r"replaces only an earlier rehearsal's folder",
    ):
        rehearse(RehearsalOptions(config_name="dapo_trainer", out_dir=mine, overwrite=True), echo=lambda line: None)
    assert (mine / "notes.txt").read_text() == "keep me" and not (mine / ".lock").exists()


def test_an_earlier_rehearsal_needs_overwrite_and_a_file_is_refused(tmp_path):
    out = tmp_path / "rehearsal"
    _earlier_rehearsal(out)
    with pytest.raises(RehearsalError, match="holds an earlier rehearsal; pass --overwrite"), own_out(out, False):
        pass
    assert (out / "changes.json").exists()
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(RehearsalError, match=r"--out .*file is a file; give a folder"), own_out(file, True):
        pass
