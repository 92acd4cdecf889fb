"""A read-only or full disk under any command's output: one line naming the file that failed and the option that
chose its place (``--out``, or ``local.cache_dir`` for the model cache), and no half-written file left behind.

The failures are injected where the real ones arise, as a real full disk raises them (found by probing each command
on a full and on a read-only tmpfs): a write that fails on a full disk raises ``OSError`` without a file name (at
``write`` or at ``close``), pyarrow raises one with its own text and no file name, and creating a folder on a
read-only disk raises one naming the folder.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dapo_verl.cli import main
from dapo_verl.cli_errors import os_error
from tests.data_prep_samples import write_aime_bytedtsinghua


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a full disk fails a write: no file name


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_toy_and_compare_on_a_full_disk_name_the_file_and_leave_none_half_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Path, "write_text", _full)
    assert main(["toy", "--out", str(tmp_path / "toy")]) == 2
    line = _error_line(capsys)
    assert f"No space left on device ({tmp_path / 'toy' / 'toy.json'})" in line
    assert line.endswith("Free disk space and run the same command again.")  # no checkpoint to continue from
    assert not [p for p in (tmp_path / "toy").iterdir()]
    monkeypatch.undo()
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "data": {"actor/entropy": 0.5}}\n{"step": 2, "data": {"actor/entropy": 0.4}}\n'
    )
    monkeypatch.setattr(Path, "write_text", _full)
    assert main(["compare", str(run), "--out", str(tmp_path / "cmp")]) == 2
    assert f"No space left on device ({tmp_path / 'cmp' / 'report.md'})" in _error_line(capsys)
    assert not [p for p in (tmp_path / "cmp").iterdir()]


def test_prepare_data_on_a_full_disk_names_the_output_file(tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    def full(table, where, **kwargs):  # pyarrow's own wording, with the errno and no file name
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    aime = write_aime_bytedtsinghua(tmp_path / "aime-2024.parquet")
    monkeypatch.setattr(pq, "write_table", full)
    assert main(["prepare-data", "--aime", str(aime), "--out", str(tmp_path / "out")]) == 2
    line = _error_line(capsys)
    assert f"No space left on device ({tmp_path / 'out' / 'aime-2024.parquet'})" in line
    assert not [p for p in (tmp_path / "out").iterdir()]


def test_a_read_only_model_cache_names_local_cache_dir_not_out(tmp_path, monkeypatch, capsys):
    from dapo_verl.local import model

    cache = tmp_path / "cache"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(cache))

    monkeypatch.setattr(model, "_save_atomically", read_only)
    assert (
        main(["train", "--out", str(tmp_path / "run"), "trainer.total_training_steps=1", f"local.cache_dir={cache}"])
        == 2
    )
    assert _error_line(capsys).endswith(f"Read-only file system ({cache}). Point local.cache_dir at a writable disk.")


def test_a_full_disk_at_the_run_directory_lock_names_the_lock_file(tmp_path, monkeypatch, capsys):
    from dapo_verl.local import rundir

    monkeypatch.setattr(rundir.os, "pwrite", _full)
    assert (
        main(
            [
                "train",
                "--out",
                str(tmp_path / "run"),
                "trainer.total_training_steps=1",
                f"local.cache_dir={tmp_path / 'cache'}",
            ]
        )
        == 2
    )
    line = _error_line(capsys)
    assert f"No space left on device ({tmp_path / 'run' / '.lock'})" in line
    assert line.endswith("(a run continues from its last checkpoint).")


@pytest.mark.parametrize(
    ("code", "option", "resumable", "fix"),
    [
        (
            errno.ENOSPC,
            None,
            True,
            "Free disk space and run the same command again (a run continues from its last checkpoint).",
        ),
        (errno.ENOSPC, None, False, "Free disk space and run the same command again."),
        (errno.EROFS, None, False, "Point --out at a writable disk."),
        (
            errno.EACCES,
            "local.cache_dir",
            False,
            "Point local.cache_dir at a folder you may write to, or fix its permissions.",
        ),
    ],
)
def test_the_fix_names_the_option_that_chose_the_place_and_a_resume_only_where_there_is_one(
    code, option, resumable, fix
):
    err = OSError(code, os.strerror(code), "/some/file")
    if option is not None:
        err.option = option  # as the model cache's ModelCacheError carries it
    assert os_error(err, resumable=resumable) == f"{os.strerror(code)} (/some/file). {fix}"
