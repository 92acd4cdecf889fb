"""dapo_verl.report: the three log readers and arm grouping."""

from __future__ import annotations

import doctest
import importlib
import json
import math
import pprint
from pathlib import Path

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from dapo_verl.report import (
    LogFormat,
    NoMetricsLogError,
    derive_label,
    find_log,
    group_runs,
    load_run,
)
from dapo_verl.report.readers import console_record

ACC = "val-core/aime-2024/acc/mean@32"


def write_jsonl(path: Path, records: list[tuple[int, dict]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in records))
    return path


def write_events(directory: Path, records: list[tuple[int, dict]]) -> Path:
    writer = SummaryWriter(str(directory))
    for step, data in records:
        for key, value in data.items():
            writer.add_scalar(key, value, step)
    writer.close()
    return directory


def console_line(step: int, data: dict) -> str:
    """One line exactly as verl's console logger prints it (concat_dict_to_str: pprint.pformat of numbers)."""
    return " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in data.items())])


def training_run(entropy: list[float], *, acc: list[float], extra: dict[str, list[float]] | None = None) -> list:
    """Records of a run: validation at steps 0, 5, 10, ... and one training record per step from 1."""
    records: list[tuple[int, dict]] = [(5 * i, {ACC: a}) for i, a in enumerate(acc)]
    for step, value in enumerate(entropy, start=1):
        data = {"actor/entropy": value, **{k: v[step - 1] for k, v in (extra or {}).items()}}
        records.append((step, data))
    return sorted(records, key=lambda r: r[0])


# -- readers -------------------------------------------------------------------------------------------

def test_jsonl_merges_repeated_steps_later_value_wins_and_null_is_not_logged(tmp_path):
    path = write_jsonl(tmp_path / "metrics.jsonl", [(0, {ACC: 0.1}), (1, {"actor/entropy": 0.5, "x": None}),
                                                    (1, {"actor/entropy": 0.7, "response_length/mean": 12})])
    with path.open("a") as handle:
        handle.write('{"step": 2, "data": {"actor/ent')  # a line cut short by a crash
    run = load_run(tmp_path)
    assert run.format is LogFormat.JSONL and run.source == path
    assert list(run.table.index) == [0, 1]
    assert run.table.loc[1, "actor/entropy"] == 0.7 and run.table.loc[1, "response_length/mean"] == 12.0
    assert math.isnan(run.table.loc[0, "actor/entropy"])
    assert run.metrics == ["actor/entropy", "response_length/mean", ACC]  # "x" was only null


def test_tensorboard_events_are_found_below_the_run_directory(tmp_path):
    write_events(tmp_path / "run" / "tb" / "nested", [(1, {"actor/entropy": 0.25}), (2, {"actor/entropy": 0.5}),
                                                      (2, {ACC: 0.75})])
    run = load_run(tmp_path / "run")
    assert run.format is LogFormat.TENSORBOARD and run.source == tmp_path / "run" / "tb" / "nested"
    assert run.series("actor/entropy").to_dict() == {1: 0.25, 2: 0.5}
    assert run.series(ACC).to_dict() == {2: 0.75}


def test_console_log_lines_are_found_among_other_output(tmp_path):
    lines = [
        "INFO 12:00:01 starting TaskRunner",
        console_line(0, {ACC: 0.125}),
        "\x1b[36m(TaskRunner pid=4242)\x1b[0m " + console_line(1, {"actor/entropy": np.float64(0.5),
                                                                  "actor/pg_loss": -0.25, "response_length/mean": 37,
                                                                  "critic/score/mean": float("nan"),
                                                                  "dapo/sampler/partial": True}),
        "Training Progress:  10%|#  | 1/10 [00:03<00:27]\r" + console_line(2, {"actor/entropy": 1.5e-05}),
        "step:3",  # LocalLogger with no numeric metric
        "something unrelated: step:x - a:1",
    ]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    run = load_run(path)
    assert run.format is LogFormat.CONSOLE
    assert list(run.table.index) == [0, 1, 2]
    assert run.table.loc[1, "actor/entropy"] == 0.5 and run.table.loc[1, "actor/pg_loss"] == -0.25
    assert run.table.loc[1, "response_length/mean"] == 37.0 and run.table.loc[1, "dapo/sampler/partial"] == 1.0
    assert math.isnan(run.table.loc[1, "critic/score/mean"])
    assert run.table.loc[2, "actor/entropy"] == 1.5e-05 and run.table.loc[0, ACC] == 0.125


def test_console_record_reads_numpy_reprs_and_skips_items_that_are_not_numbers():
    assert console_record("step:7 - a:np.float32(0.5) - b:numpy.int64(3) - c:hello - d:inf") == (7, {"a": 0.5,
                                                                                                      "b": 3.0,
                                                                                                      "d": math.inf})
    assert console_record("no step here") is None


def test_a_directory_prefers_jsonl_then_tensorboard_then_console(tmp_path):
    write_events(tmp_path / "tensorboard", [(1, {"actor/entropy": 9.0})])
    (tmp_path / "stdout.log").write_text(console_line(1, {"actor/entropy": 8.0}) + "\n")
    assert find_log(tmp_path) == (tmp_path / "tensorboard", LogFormat.TENSORBOARD)
    (tmp_path / "rollouts.jsonl").write_text('{"prompt": "1+1", "response": "2"}\n')  # not a metrics log
    write_jsonl(tmp_path / "metrics.jsonl", [(1, {"actor/entropy": 7.0})])
    assert find_log(tmp_path) == (tmp_path / "metrics.jsonl", LogFormat.JSONL)
    write_jsonl(tmp_path / "other.jsonl", [(1, {"actor/entropy": 6.0})])
    assert find_log(tmp_path) == (tmp_path / "metrics.jsonl", LogFormat.JSONL)
    console_only = tmp_path / "console"
    console_only.mkdir()
    (console_only / "stdout.log").write_text(console_line(1, {"actor/entropy": 8.0}) + "\n")
    assert load_run(console_only).series("actor/entropy").to_dict() == {1: 8.0}


def test_missing_path_and_unrecognised_logs_say_what_was_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("nothing to see\n")
    with pytest.raises(NoMetricsLogError, match="no metrics log found.*JSONL.*TensorBoard.*console"):
        load_run(tmp_path)
    with pytest.raises(NoMetricsLogError, match="not a metrics log; looked for"):
        load_run(tmp_path / "notes.txt")
    write_jsonl(tmp_path / "a.jsonl", [(1, {"x": 1.0})])
    write_jsonl(tmp_path / "b.jsonl", [(1, {"x": 2.0})])
    with pytest.raises(NoMetricsLogError, match="several metrics logs .*a.jsonl, b.jsonl.*one file per run"):
        load_run(tmp_path)


# -- grouping ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "label"), [
    ("runs/clip028/seed1", "clip028"),
    ("runs/clip028/seed_2/metrics.jsonl", "clip028"),
    ("runs/clip028/s3/tensorboard", "clip028"),
    ("logs/clip020_seed3.jsonl", "clip020"),
    ("logs/clip020-seed-4.log", "clip020"),
    ("runs/baseline", "baseline"),
    ("runs/baseline/metrics.jsonl", "baseline"),
    ("tensorboard_log/dapo/qwen7b-dapo", "qwen7b-dapo"),
])
def test_label_is_derived_from_the_directory_layout(path, label):
    assert derive_label(path) == label


def test_group_runs_keeps_arm_order_and_rejects_bad_labels(tmp_path):
    arms = group_runs(["r/b/seed1", "r/a/seed1", "r/b/seed2"])
    assert list(arms) == ["b", "a"] and arms["b"] == [Path("r/b/seed1"), Path("r/b/seed2")]
    assert group_runs(["x", "y", "z"], ["A", "B", "A"]) == {"A": [Path("x"), Path("z")], "B": [Path("y")]}
    with pytest.raises(ValueError, match="1 --label value.* for 2 run"):
        group_runs(["x", "y"], ["A"])
    with pytest.raises(ValueError, match="more than once"):
        group_runs(["x", "x"])


@pytest.mark.parametrize("name", ["dapo_verl.report.grouping"])
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
