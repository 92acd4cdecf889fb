"""dapo-verl compare reads what verl's own loggers write: FileLogger JSONL, TensorBoard and the console."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.verl

from verl.utils.logger.aggregate_logger import LocalLogger  # noqa: E402
from verl.utils.tracking import FileLogger, _TensorboardAdapter  # noqa: E402

from dapo_verl.report import LogFormat, load_run  # noqa: E402

STEPS = [
    (0, {"val-core/aime-2024/acc/mean@32": np.float64(0.125), "val-aux/num_turns/mean": np.int64(1)}),
    (
        1,
        {
            "actor/entropy": np.float32(0.5),
            "actor/pg_loss": -0.25,
            "response_length/mean": 321.5,
            "dapo/sampler/gen_rounds": 2,
            "critic/score/mean": 0.0,
        },
    ),
    (
        2,
        {
            "actor/entropy": 0.375,
            "actor/pg_clipfrac": np.float64(0.0625),
            "response_length/mean": np.int64(300),
            "val-core/aime-2024/acc/mean@32": 0.25,
        },
    ),
]


def test_the_three_verl_loggers_read_back_to_the_same_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "file" / "exp.jsonl"))
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb" / "project" / "exp"))
    (tmp_path / "file").mkdir()
    file_logger, tensorboard = FileLogger("project", "exp"), _TensorboardAdapter("project", "exp")
    console = LocalLogger()
    capsys.readouterr()
    for step, data in STEPS:
        for writer in (file_logger, tensorboard, console):
            writer.log(data=data, step=step)
    file_logger.finish()
    tensorboard.finish()
    (tmp_path / "stdout.log").write_text(capsys.readouterr().out)

    runs = {
        fmt: load_run(path)
        for fmt, path in [
            (LogFormat.JSONL, tmp_path / "file"),
            (LogFormat.TENSORBOARD, tmp_path / "tb"),
            (LogFormat.CONSOLE, tmp_path / "stdout.log"),
        ]
    }
    expected = {key for _, data in STEPS for key in data}
    for fmt, run in runs.items():
        assert run.format is fmt and set(run.metrics) == expected, fmt
        assert list(run.table.index) == [0, 1, 2]
        for step, data in STEPS:
            for key, value in data.items():
                assert run.table.loc[step, key] == pytest.approx(float(value), rel=1e-6), (fmt, step, key)
