"""The rehearsal's report lists every run that was to start with how it ended, and the memory its processes held.

:func:`dapo_verl.rehearsal.report.build_report` is driven with a hand-made result (no verl): an interrupted
rehearsal whose resume run was stopped too, one whose resume run never started, and one whose run was killed for lack
of memory; and ``dapo-verl rehearse`` turns an interruption into one line and exit status 2, as ``train`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_verl import cli
from dapo_verl.rehearsal import run as run_module
from dapo_verl.rehearsal.data import RehearsalData
from dapo_verl.rehearsal.engine import Engine, EngineChoice
from dapo_verl.rehearsal.memory import MemoryPeaks, Peak
from dapo_verl.rehearsal.processes import RunRecord
from dapo_verl.rehearsal.report import build_report, summary_lines, write_report
from dapo_verl.rehearsal.run import RehearsalInterrupted, RehearsalOptions, RehearsalResult

GIB = 2**30
_LENDS = {"trainer.v1.separate_async.hybrid_rollout.enable_switch": True}


def _record(out: Path, folder: str, name: str, returncode: int, **fields) -> RunRecord:
    (out / folder).mkdir(parents=True, exist_ok=True)
    metrics = out / folder / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "data": {"training/global_step": 1, "timing_s/step": 2.0}}) + "\n")
    return RunRecord(name, ["python"], returncode, 42.4, out / folder / "log.txt", metrics, **fields)


def _result(out: Path, runs: list[RunRecord], **fields) -> RehearsalResult:
    data = RehearsalData(out / "train.parquet", out / "val.parquet", 0, 0, 96, ())
    peaks = MemoryPeaks(
        Peak(int(9.5 * GIB), 31, 80.0),
        {"run1": Peak(5 * GIB, 20, 60.0), "run2": Peak(4 * GIB, 18, 80.0)},
        int(11 * GIB),
        samples=300,
        pss=Peak(int(6.5 * GIB), 31, 78.0),
        pss_reads=40,
        runs_pss={"run1": Peak(int(3.5 * GIB), 20, 58.0), "run2": Peak(3 * GIB, 18, 82.0)},
    )
    return RehearsalResult(
        RehearsalOptions("dapo_trainer", out_dir=out),
        "-m dapo_verl.main",
        "dapo_verl.main",
        [],
        data,
        "model",
        True,
        EngineChoice(Engine.STAND_IN, None, "chosen"),
        runs=runs,
        memory=peaks,
        **fields,
    )


def test_an_interrupted_rehearsal_lists_both_runs_it_stopped_with_their_state_and_memory(tmp_path):
    runs = [
        _record(tmp_path, "run1", "run1", -9, stopped_by="Ctrl-C", interrupted=True, error="stopped by Ctrl-C"),
        _record(tmp_path, "run2", "run2 (resume)", -9, stopped_by="Ctrl-C", interrupted=True),
    ]
    report = build_report(_result(tmp_path, runs, interrupted_by="Ctrl-C"))
    assert report["state"] == "interrupted" and report["interrupted_by"] == "Ctrl-C" and report["ok"] is False
    assert [(r["name"], r["state"]) for r in report["runs"]] == [
        ("run1", "interrupted"),
        ("run2 (resume)", "interrupted"),
    ]
    assert report["peak_rss_bytes"] == int(9.5 * GIB) and report["memory"]["peak_processes"] == 31
    assert [r["peak_rss_bytes"] for r in report["runs"]] == [5 * GIB, 4 * GIB]
    assert report["peak_pss_bytes"] == int(6.5 * GIB)
    assert [r["peak_pss_bytes"] for r in report["runs"]] == [int(3.5 * GIB), 3 * GIB]
    assert report["memory"]["available_min_bytes"] == 11 * GIB and report["memory"]["overlap_resume"] is False
    lines = summary_lines(report)
    assert lines[0].startswith("run1: steps [1], 42.4 s, 2.0 s per step, held up to 3.5 GiB -- interrupted: ")
    assert (
        "memory: the rehearsal's processes held up to 6.5 GiB (sum of their proportional set sizes, read 40 times; "
        "run1 3.5 GiB, run2 3.0 GiB; resume run after the first run); the sum of their RSS, counting shared pages "
        "once per process, peaked at 9.5 GiB over 31 processes; this machine had 11.0 GiB available at the "
        "least"
    ) in lines
    assert lines[-1] == f"INTERRUPTED BY CTRL-C; report: {tmp_path / 'report.md'}"


def test_a_resume_run_that_never_started_is_listed_as_not_started_with_why(tmp_path):
    runs = [_record(tmp_path, "run1", "run1", -9, stopped_by="SIGTERM", interrupted=True)]
    result = _result(
        tmp_path,
        runs,
        interrupted_by="SIGTERM",
        not_started={"run2 (resume)": "the rehearsal was interrupted by SIGTERM before it started"},
    )
    report = write_report(result)
    assert report["runs"][1] == {
        "name": "run2 (resume)",
        "state": "not started",
        "returncode": None,
        "wall_s": 0.0,
        "log": None,
        "metrics": None,
        "steps_logged": [],
        "error": "",
        "first_error": "",
        "time_per_step_s": None,
        "peak_pss_bytes": None,
        "peak_rss_bytes": None,
        "why": "the rehearsal was interrupted by SIGTERM before it started",
    }
    assert json.loads((tmp_path / "report.json").read_text())["runs"][1]["state"] == "not started"
    markdown = (tmp_path / "report.md").read_text()
    assert "Result: **interrupted by SIGTERM**." in markdown
    assert "| run2 (resume) | not started | None | 0.0 s | [] | - | - / - |" in markdown
    assert "**run2 (resume) did not start:** the rehearsal was interrupted by SIGTERM before it started." in markdown
    assert "not started: the rehearsal was interrupted by SIGTERM" in summary_lines(report)[1]


def test_a_finished_rehearsal_is_not_ok_while_a_planned_run_did_not_start(tmp_path):
    report = build_report(
        _result(
            tmp_path,
            [_record(tmp_path, "run1", "run1", 1, error="ValueError: bad")],
            not_started={"run2 (resume)": "the first run failed"},
        )
    )
    assert report["state"] == "failed" and [r["state"] for r in report["runs"]] == ["failed", "not started"]
    assert summary_lines(report)[0].endswith("-- FAILED: ValueError: bad")


def test_the_interruption_is_one_line_naming_each_run_and_the_report(tmp_path):
    runs = [
        _record(tmp_path, "run1", "run1", 0),
        _record(tmp_path, "run2", "run2 (resume)", -9, stopped_by="Ctrl-C", interrupted=True),
    ]
    message = str(RehearsalInterrupted(_result(tmp_path, runs, interrupted_by="Ctrl-C")))
    assert message == (
        f"interrupted by Ctrl-C: run1 finished after 42 s, run2 (resume) interrupted after 42 s; every "
        f"process the rehearsal started was stopped. What ran is in {tmp_path / 'report.md'}; run the "
        f"same command with --overwrite to rehearse again."
    )


def test_dapo_verl_rehearse_says_interrupted_in_one_line_and_exits_2_as_train_does(tmp_path, monkeypatch, capsys):
    result = _result(
        tmp_path,
        [_record(tmp_path, "run1", "run1", -9, stopped_by="Ctrl-C", interrupted=True)],
        interrupted_by="Ctrl-C",
        not_started={"run2 (resume)": "interrupted before it started"},
    )

    def rehearse(options):
        assert options.overlap is False  # the default: the resume run after the first
        raise RehearsalInterrupted(result)

    monkeypatch.setattr(run_module, "rehearse", rehearse)
    assert cli.main(["rehearse", "dapo_trainer", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(
        "dapo-verl rehearse: interrupted by Ctrl-C: run1 interrupted after 42 s, "
        "run2 (resume) not started; every process the rehearsal started was stopped."
    )


@pytest.mark.parametrize(
    ("flags", "overlap"),
    [([], False), (["--overlap-resume"], True), (["--no-overlap-resume"], False), (["--sequential"], False)],
)
def test_the_resume_run_overlaps_the_first_only_when_asked(tmp_path, monkeypatch, flags, overlap):
    seen = []

    def rehearse(options):
        seen.append(options.overlap)
        raise run_module.RehearsalError("stop here")

    monkeypatch.setattr(run_module, "rehearse", rehearse)
    assert cli.main(["rehearse", "dapo_trainer", "--out", str(tmp_path), *flags]) == 2
    assert seen == [overlap]


@pytest.mark.parametrize(
    ("recipe", "gpus", "why"),
    [
        ({}, 1, ""),  # one replica regenerates the same groups: the resumed step must match
        ({"algorithm.filter_groups.streaming": True}, 1, "streaming"),
        ({}, 2, "replicas"),
        ({"trainer.v1.trainer_mode": "separate_async", **_LENDS}, 1, "replicas"),
    ],
)
def test_a_resumed_step_must_match_unless_timing_picks_its_groups(tmp_path, recipe, gpus, why):
    from dataclasses import replace

    from dapo_verl.rehearsal.resume_check import REPLICAS_ROUTE, STREAMING_TIMES

    runs = [_record(tmp_path, "run1", "run1", 0), _record(tmp_path, "run2", "run2 (resume)", 0)]
    result = _result(tmp_path, runs, recipe=recipe)
    result.options = replace(result.options, gpus=gpus)
    resume = build_report(result)["resume"]
    assert resume["required"] is (why == "")
    assert resume["why_not_required"] == {"": "", "streaming": STREAMING_TIMES, "replicas": REPLICAS_ROUTE}[why]
