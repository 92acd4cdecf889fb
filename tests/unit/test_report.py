"""dapo_verl.report: the three log readers, arm grouping, the statistics on hand-computed numbers, and compare."""

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

from dapo_verl.cli import main
from dapo_verl.report import (
    LogFormat,
    NoMetricsLogError,
    UnknownMetricError,
    build_report,
    derive_label,
    find_log,
    group_runs,
    load_run,
    select_metrics,
)
from dapo_verl.report.readers import console_record
from dapo_verl.report.summary import Spread, run_value

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


def test_jsonl_merges_the_records_of_one_step_and_null_is_not_logged(tmp_path):
    # verl < 0.3 logged the final validation in a record of its own, at the last training step
    path = write_jsonl(
        tmp_path / "metrics.jsonl",
        [
            (0, {ACC: 0.1}),
            (1, {"actor/entropy": 0.5, "x": None}),
            (1, {"response_length/mean": 12, ACC: 0.2}),
            (1, {ACC: 0.3}),
        ],
    )
    run = load_run(tmp_path)
    assert run.format is LogFormat.JSONL and run.source == path and run.notes == ()
    assert list(run.table.index) == [0, 1]
    assert run.table.loc[1, "actor/entropy"] == 0.5 and run.table.loc[1, "response_length/mean"] == 12.0
    assert run.table.loc[1, ACC] == 0.3  # the separate final validation is the later record
    assert math.isnan(run.table.loc[0, "actor/entropy"])
    assert run.metrics == ["actor/entropy", "response_length/mean", ACC]  # "x" was only null


def test_a_jsonl_last_line_cut_short_is_left_out_and_reported_as_a_warning(tmp_path, capsys):
    path = write_jsonl(tmp_path / "run" / "metrics.jsonl", [(0, {ACC: 0.1}), (1, {"actor/entropy": 0.5})])
    with path.open("a") as handle:
        handle.write('{"step": 2, "data": {"actor/ent')  # the run was killed while writing this line
    run = load_run(path.parent)
    assert list(run.table.index) == [0, 1]
    assert run.notes == (
        "line 3 is cut short (the run stopped while writing it, or is still running), so its metrics are left out.",
    )
    assert main(["compare", str(path.parent), "--out", str(tmp_path / "o")]) == 0
    out, err = capsys.readouterr()
    assert out.count(f"{path.parent}: metrics.jsonl line 3 is cut short") == 1  # once, in the report
    assert err == 'dapo-verl compare: 1 warning(s), listed under "Warnings" in the report.\n'
    assert (
        "metrics.jsonl line 3 is cut short" in json.loads((tmp_path / "o" / "report.json").read_text())["warnings"][0]
    )


@pytest.mark.parametrize(
    ("records", "match"),
    [
        (
            [
                (0, {ACC: 0.5}),
                (1, {ACC: 0.9, "actor/entropy": 0.4}),
                (0, {ACC: 0.2}),
                (1, {ACC: 0.01, "actor/entropy": 0.5}),
            ],
            r"line 3: step 0 follows step 1 \(line 2\); one run logs its steps in increasing order, so this file "
            r"holds two runs\. Give each run its own log file",
        ),  # appended
        (
            [
                (0, {ACC: 0.5}),
                (0, {ACC: 0.2}),
                (1, {ACC: 0.9, "actor/entropy": 0.4}),
                (1, {ACC: 0.01, "actor/entropy": 0.5}),
            ],
            r"line 4: step 1 logs actor/entropy again \(first at line 3\)",
        ),  # interleaved
    ],
)
def test_a_jsonl_holding_two_runs_is_refused_naming_the_file_line_and_step(tmp_path, capsys, records, match):
    log = write_jsonl(tmp_path / "two.jsonl", records)
    with pytest.raises(ValueError, match=rf"{log} {match}"):
        load_run(log)
    assert main(["compare", str(log), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "holds two runs" in err
    assert not (tmp_path / "o").exists()


def test_a_jsonl_line_that_is_not_a_record_names_the_file_and_line(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        '{"step": 0, "data": {"actor/entropy": 0.5}}\nGARBAGE\n{"step": 1, "data": {"actor/entropy": 0.4}}\n'
    )
    with pytest.raises(ValueError, match=rf"{log} line 2 is not a .*record \('GARBAGE'\).*Fix or delete that line"):
        load_run(log)
    log.write_text('{"step": 0, "data": {"actor/entropy": 0.5}}\n{"step": 1, "values": {}}\n')
    with pytest.raises(ValueError, match=rf"{log} line 2 is not a"):
        load_run(log)


@pytest.mark.parametrize("value", [7.5, -0.25, 1.0000001])
def test_an_accuracy_outside_0_1_is_refused_in_every_format(tmp_path, value):
    jsonl = write_jsonl(tmp_path / "a.jsonl", [(0, {ACC: 0.5}), (1, {ACC: value})])
    with pytest.raises(ValueError, match=rf"{jsonl} line 2: {ACC} = {value:g} is outside \[0, 1\]; an accuracy"):
        load_run(jsonl)
    console = tmp_path / "train.log"
    console.write_text(console_line(1, {"dapo/sampler/prefilter_acc": value}) + "\n")
    with pytest.raises(ValueError, match=rf"{console} line 1: dapo/sampler/prefilter_acc = {value:g} is outside"):
        load_run(console)
    events = write_events(tmp_path / "tb", [(3, {"val-aux/x/acc/best@4/mean": value})])
    with pytest.raises(ValueError, match=rf"{events} tag val-aux/x/acc/best@4/mean step 3: .* is outside \[0, 1\]"):
        load_run(events)


def test_tensorboard_events_are_found_below_the_run_directory(tmp_path):
    write_events(
        tmp_path / "run" / "tb" / "nested",
        [(1, {"actor/entropy": 0.25}), (2, {"actor/entropy": 0.5}), (2, {ACC: 0.75})],
    )
    run = load_run(tmp_path / "run")
    assert run.format is LogFormat.TENSORBOARD and run.source == tmp_path / "run" / "tb" / "nested"
    assert run.series("actor/entropy").to_dict() == {1: 0.25, 2: 0.5}
    assert run.series(ACC).to_dict() == {2: 0.75}


def test_console_log_lines_are_found_among_other_output(tmp_path):
    lines = [
        "INFO 12:00:01 starting TaskRunner",
        console_line(0, {ACC: 0.125}),
        "\x1b[36m(TaskRunner pid=4242)\x1b[0m "
        + console_line(
            1,
            {
                "actor/entropy": np.float64(0.5),
                "actor/pg_loss": -0.25,
                "response_length/mean": 37,
                "critic/score/mean": float("nan"),
                "dapo/sampler/partial": True,
            },
        ),
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
    assert console_record("step:7 - a:np.float32(0.5) - b:numpy.int64(3) - c:hello - d:inf") == (
        7,
        {"a": 0.5, "b": 3.0, "d": math.inf},
    )
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


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("runs/clip028/seed1", "clip028"),
        ("runs/clip028/seed_2/metrics.jsonl", "clip028"),
        ("runs/clip028/s3/tensorboard", "clip028"),
        ("logs/clip020_seed3.jsonl", "clip020"),
        ("logs/clip020-seed-4.log", "clip020"),
        ("runs/baseline", "baseline"),
        ("runs/baseline/metrics.jsonl", "baseline"),
        ("tensorboard_log/dapo/qwen7b-dapo", "qwen7b-dapo"),
    ],
)
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


# -- statistics ----------------------------------------------------------------------------------------


def test_final_value_is_the_tail_mean_for_training_and_the_last_value_for_validation(tmp_path):
    run = load_run(
        write_jsonl(tmp_path / "r.jsonl", training_run([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], acc=[0.1, 0.3, 0.2]))
    )
    entropy = run_value(run, "actor/entropy", last_frac=0.2)
    assert (entropy.final, entropy.run_mean, entropy.last_step, entropy.points) == (9.5, 5.5, 10, 10)
    assert run_value(run, "actor/entropy", last_frac=0.25).final == 9.0  # ceil(2.5) = 3 values: 8, 9, 10
    assert run_value(run, "actor/entropy", last_frac=1.0).final == 5.5
    acc = run_value(run, ACC, last_frac=0.2)
    assert acc.final == 0.2 and acc.run_mean == pytest.approx(0.2) and acc.last_step == 10
    assert run_value(run, "absent").final is None
    with pytest.raises(ValueError, match="must be in"):
        run_value(run, "actor/entropy", last_frac=0.0)


def test_arm_spread_is_mean_sample_std_min_max_over_seeds(tmp_path):
    base = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    paths = [
        write_jsonl(
            tmp_path / "clip028" / f"seed{i}" / "metrics.jsonl", training_run([v + shift for v in base], acc=[0.0, acc])
        )
        for i, (shift, acc) in enumerate([(0, 0.5), (1, 0.25), (3, 0.75)])
    ]
    report = build_report(group_runs(paths), last_frac=0.2)
    row = report.row("actor/entropy", "clip028")
    assert row.final.mean == pytest.approx((9.5 + 10.5 + 12.5) / 3)
    assert row.final.std == pytest.approx(math.sqrt((16 / 9 + 1 / 9 + 25 / 9) / 2))  # deviations -4/3, -1/3, 5/3
    assert (row.final.min, row.final.max, row.final.n, row.runs) == (9.5, 12.5, 3, 3)
    assert row.run_mean.mean == pytest.approx(5.5 + 4 / 3)
    acc = report.row(ACC, "clip028").final
    assert (acc.mean, acc.min, acc.max) == (0.5, 0.25, 0.75) and acc.std == pytest.approx(0.25)
    assert Spread.of([0.5]).std is None and Spread.of([None, None]).n == 0


def test_metrics_missing_in_some_runs_or_arms_show_as_na(tmp_path):
    kept = {"actor/dapo/clip_upper_fraction": [0.1] * 10}
    runs = {
        "dapo": [
            write_jsonl(tmp_path / "d1.jsonl", training_run(list(range(10)), acc=[0.1], extra=kept)),
            write_jsonl(tmp_path / "d2.jsonl", training_run(list(range(10)), acc=[0.2])),
        ],
        "grpo": [write_jsonl(tmp_path / "g1.jsonl", training_run(list(range(10)), acc=[0.3]))],
    }
    report = build_report(runs, tmp_path / "out")
    upper = report.row("actor/dapo/clip_upper_fraction", "dapo")
    assert (upper.final.n, upper.runs, upper.final.std) == (1, 2, None)
    absent = report.row("actor/dapo/clip_upper_fraction", "grpo")
    assert absent.final.n == 0 and absent.final.mean is None
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| `actor/dapo/clip_upper_fraction` | grpo | 0/1 | n/a | n/a | n/a | n/a |" in markdown
    assert "| `actor/dapo/clip_upper_fraction` | dapo | 1/2 | 0.1 | 0.1 – 0.1 |" in markdown
    assert "Not logged by any run:" in markdown and "`dapo/sampler/prefilter_acc`" in markdown
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["arms"]["grpo"]["metrics"]["actor/dapo/clip_upper_fraction"]["final"]["mean"] is None
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "report.md",
        "report.json",
        "accuracy.png",
        "entropy.png",
        "clip_fractions.png",
    }


@pytest.mark.parametrize("bad", [None, "NaN", "Infinity"])
def test_a_final_value_that_went_non_finite_is_missing_and_flagged_never_the_last_finite_one(tmp_path, capsys, bad):
    records = training_run([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], acc=[0.1, 0.3, 0.5])
    records.append((10, {ACC: bad}))  # verl's orjson writes NaN as null; the local backend as well
    assert records[-2] == (10, {"actor/entropy": 10})
    records[-2] = (10, {"actor/entropy": bad})
    path = tmp_path / "nan" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(
        "".join(
            json.dumps({"step": s, "data": d}).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity") + "\n"
            for s, d in records
        )
    )
    run = load_run(path)
    acc, entropy = run_value(run, ACC), run_value(run, "actor/entropy", last_frac=0.2)
    assert (acc.final, acc.nonfinite_step, acc.last_step) == (None, 10, 5)  # not 0.3, step 5's value
    assert (entropy.final, entropy.nonfinite_step) == (None, 10)
    assert run_value(run, "actor/entropy", last_frac=0.2).run_mean == pytest.approx(5.0)  # steps 1-9
    assert (
        main(
            [
                "compare",
                str(path.parent),
                str(write_jsonl(tmp_path / "ok" / "metrics.jsonl", training_run([1.0] * 10, acc=[0.1, 0.2, 0.4]))),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert f"| `{ACC}` | nan | 0/1 | n/a |" in out
    assert "## Warnings" in out and f"{ACC} is NaN, inf or null at step 10, so it has no final value" in out
    assert out.count(f"{ACC} is NaN, inf or null at step 10") == 1 and 'listed under "Warnings"' in err
    assert "is NaN" not in err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any("is NaN, inf or null at step 10" in w for w in report["warnings"])


def test_a_run_missing_a_metric_others_logged_is_flagged(tmp_path):
    runs = {
        "a": [write_jsonl(tmp_path / "a.jsonl", training_run([1.0] * 4, acc=[0.1]))],
        "b": [write_jsonl(tmp_path / "b.jsonl", [(s, {ACC: 0.2}) for s in (0, 5)])],
    }
    report = build_report(runs)
    assert any(
        w.endswith("never logged actor/entropy, which another run of the report logged (its log holds steps 0–5 (2)).")
        for w in report.warnings
    )
    assert not any("a.jsonl" in w for w in report.warnings)


def test_default_metrics_pick_the_largest_n_accuracy_of_each_source_and_requests_may_be_globs():
    available = [
        "val-core/aime/acc/mean@32",
        "val-core/aime/acc/mean@4",
        "val-core/math/acc/mean@1",
        "val-core/math/acc/maj@1/mean",
        "val-aux/aime/score/mean@32",
        "actor/entropy",
        "actor/pg_clipfrac",
    ]
    assert select_metrics(available) == [
        "val-core/aime/acc/mean@32",
        "val-core/math/acc/mean@1",
        "actor/entropy",
        "actor/pg_clipfrac",
    ]
    assert select_metrics(["val-core/gsm/reward/mean@8", "actor/entropy"]) == [
        "val-core/gsm/reward/mean@8",
        "actor/entropy",
    ]
    assert select_metrics(available, ["actor/entropy", "val-core/*/acc/mean@*"]) == [
        "actor/entropy",
        "val-core/aime/acc/mean@32",
        "val-core/aime/acc/mean@4",
        "val-core/math/acc/mean@1",
    ]
    with pytest.raises(UnknownMetricError, match="'actor/entropi'; close matches: actor/entropy"):
        select_metrics(available, ["actor/entropy", "actor/entropi"])
    with pytest.raises(UnknownMetricError, match="'val-core/\\*/acc/best@\\*'"):
        select_metrics(available, ["val-core/*/acc/best@*"])


def test_a_verl_log_gets_the_clipped_token_probability_from_its_sums_and_counts(tmp_path):
    # verl logs the parts (each averaged over micro-batches alike); the means are their ratios, step by step
    parts = [
        (
            1,
            {
                "actor/dapo/clip_upper_old_prob_sum": 0.6,
                "actor/dapo/clip_upper_tokens": 2.0,
                "actor/dapo/positive_advantage_tokens": 8.0,
                "actor/dapo/clip_upper_old_prob_max": 0.4,
            },
        ),
        (
            2,
            {
                "actor/dapo/clip_upper_old_prob_sum": 0.0,
                "actor/dapo/clip_upper_tokens": 0.0,
                "actor/dapo/positive_advantage_tokens": 4.0,
                "actor/dapo/clip_upper_old_prob_max": 0.0,
            },
        ),
        (
            3,
            {
                "actor/dapo/clip_upper_old_prob_sum": 0.5,
                "actor/dapo/clip_upper_tokens": 5.0,
                "actor/dapo/positive_advantage_tokens": 10.0,
                "actor/dapo/clip_upper_old_prob_max": 0.2,
            },
        ),
    ]
    run = load_run(write_jsonl(tmp_path / "verl.jsonl", [(s, {ACC: 0.5, **d}) for s, d in parts]))
    mean = run.series("actor/dapo/clip_upper_old_prob_mean")
    assert mean.to_dict() == pytest.approx({1: 0.3, 3: 0.1})  # step 2 clipped nothing: undefined, not 0
    assert run.series("actor/dapo/clip_upper_positive_share").to_dict() == pytest.approx({1: 0.25, 2: 0.0, 3: 0.5})
    assert "actor/dapo/clip_higher_kept_old_prob_mean" not in run.metrics  # its parts were not logged
    report = build_report({"verl": [run]})
    assert report.row("actor/dapo/clip_upper_old_prob_mean", "verl").run_mean.mean == pytest.approx(0.2)
    assert "actor/dapo/clip_upper_old_prob_max" in report.metrics


def test_pass_at_k_keys_are_reported_after_the_accuracy_and_plotted(tmp_path):
    records = [
        (
            s,
            {
                ACC: 0.1 * s,
                "val-aux/aime-2024/acc/best@2/mean": 0.2 * s,
                "val-core/aime-2024/acc/best@4/mean": 0.25 * s,
                "val-aux/aime-2024/acc/best@2/std": 0.1,
                "actor/entropy": 1.0,
            },
        )
        for s in (0, 1, 2)
    ]
    report = build_report({"a": [write_jsonl(tmp_path / "a" / "metrics.jsonl", records)]}, tmp_path / "out")
    assert list(report.metrics[:3]) == [ACC, "val-aux/aime-2024/acc/best@2/mean", "val-core/aime-2024/acc/best@4/mean"]
    assert report.files["pass_at_k"].exists() and "clipped_probability" not in report.files


# -- the CLI -------------------------------------------------------------------------------------------


def test_compare_cli_reads_all_three_formats_writes_the_report_and_prints_the_table(tmp_path, capsys):
    clip = {"actor/dapo/clip_upper_fraction": [0.01] * 10, "actor/dapo/clip_lower_fraction": [0.02] * 10}
    write_jsonl(
        tmp_path / "runs" / "clip028" / "seed1" / "metrics.jsonl",
        training_run([0.9] * 10, acc=[0.0, 0.4, 0.5], extra=clip),
    )
    write_events(
        tmp_path / "runs" / "clip028" / "seed2" / "tensorboard",
        training_run([0.7] * 10, acc=[0.0, 0.2, 0.25], extra=clip),
    )
    console = training_run([0.1] * 10, acc=[0.0, 0.1, 0.125])
    (tmp_path / "clip020.log").write_text("".join(console_line(s, d) + "\n" for s, d in console))
    out = tmp_path / "report"
    args = [
        "compare",
        str(tmp_path / "runs" / "clip028" / "seed1"),
        str(tmp_path / "runs" / "clip028" / "seed2"),
        str(tmp_path / "clip020.log"),
        "--out",
        str(out),
        "--last-frac",
        "0.5",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| metric | arm | n | final |" in printed
    assert f"| `{ACC}` | clip028 | 2/2 | 0.375 ± 0.1768 | 0.25 – 0.5 |" in printed
    assert f"| `{ACC}` | clip020 | 1/1 | 0.125 | 0.125 – 0.125 |" in printed
    assert "| `actor/entropy` | clip028 | 2/2 | 0.8 ± 0.1414 | 0.7 – 0.9 |" in printed
    assert {"jsonl", "tensorboard", "console"} <= set(printed.replace("|", " ").split())
    assert (out / "report.md").read_text() in printed
    assert {p.name for p in out.iterdir()} == {
        "report.md",
        "report.json",
        "accuracy.png",
        "entropy.png",
        "clip_fractions.png",
    }
    assert json.loads((out / "report.json").read_text())["last_frac"] == 0.5


def test_compare_cli_labels_and_errors(tmp_path, capsys):
    run = write_jsonl(tmp_path / "a" / "metrics.jsonl", training_run([0.5] * 4, acc=[0.1]))
    assert (
        main(
            [
                "compare",
                str(run.parent),
                "--label",
                "eps 0.2|0.28",
                "--out",
                str(tmp_path / "o"),
                "--metrics",
                "actor/entropy",
            ]
        )
        == 0
    )
    assert "| `actor/entropy` | eps 0.2\\|0.28 | 1/1 | 0.5 |" in capsys.readouterr().out  # "|" escaped in a cell
    assert main(["compare", str(run.parent), "--metrics", "actor/entropi", "--out", str(tmp_path / "o")]) == 2
    assert "close matches: actor/entropy" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["compare", str(run.parent), "--last-frac", "1.5", "--out", str(tmp_path / "o")]) == 2
    assert "--last-frac must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name",
    [
        "dapo_verl.report.grouping",
        "dapo_verl.report.summary",
        "dapo_verl.report.build",
        "dapo_verl.report.runlog",
        "dapo_verl.report.plots",
    ],
)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# -- hostile logs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["NaN", "Infinity", "-Infinity", "1e300", "100000000000000000000", "2.5", "-3"])
def test_a_step_that_is_not_a_whole_number_names_the_file_and_line(tmp_path, capsys, step):
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text(
        f'{{"step": 1, "data": {{"actor/entropy": 0.5}}}}\n{{"step": {step}, "data": {{"actor/entropy": 0.4}}}}\n'
    )
    assert main(["compare", str(log.parent), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{log} line 2" in err and "step" in err


def test_a_deeply_nested_json_file_is_a_one_line_error(tmp_path, capsys):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert main(["compare", str(deep), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "is not a metrics log" in err


def test_a_console_step_beyond_int64_names_the_file_and_line(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step:1 - actor/entropy:0.5\nstep:99999999999999999999999 - actor/entropy:0.4\n")
    with pytest.raises(ValueError, match=rf"{log} line 2: step 99999999999999999999999"):
        load_run(log)


def _big_jsonl(path: Path, lines: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    values = rng.random((lines, 8))
    with path.open("w") as handle:
        for step in range(lines):
            data = {f"extra/metric_{i}": float(values[step, i]) for i in range(6)}
            data["actor/entropy"] = float(values[step, 6])
            if step % 1000 == 0:
                data[ACC] = float(values[step, 7])
            handle.write(json.dumps({"step": step, "data": data}) + "\n")
    return path


def test_a_long_jsonl_is_read_in_bounded_memory_keeping_only_the_reported_metrics(tmp_path):
    import tracemalloc

    log = _big_jsonl(tmp_path / "run" / "metrics.jsonl", 100_000)
    tracemalloc.start()
    try:
        report = build_report({"long": [log.parent]}, tmp_path / "out")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    run = report.arms["long"][0]
    assert set(run.table.columns) == {ACC, "actor/entropy"}  # the six unreported metrics are not kept
    assert len(run.metrics) == 8  # but they count as logged
    assert report.row("actor/entropy", "long").final.n == 1
    assert peak < 40 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_plots_of_a_long_run_are_drawn_from_at_most_a_few_thousand_points(tmp_path):
    from dapo_verl.report.plots import MAX_PLOT_POINTS, plot_arms

    log = _big_jsonl(tmp_path / "run" / "metrics.jsonl", 20_000)
    arms = {"long": [load_run(log)]}
    drawn = []
    from matplotlib.axes import Axes

    original = Axes.plot

    def counting(self, *args, **kwargs):
        drawn.append(len(args[0]))
        return original(self, *args, **kwargs)

    Axes.plot = counting
    try:
        plot_arms(arms, ["actor/entropy"], tmp_path / "entropy.png", title="long")
    finally:
        Axes.plot = original
    assert drawn and max(drawn) <= MAX_PLOT_POINTS


@pytest.mark.slow
def test_compare_on_a_million_line_jsonl_stays_within_a_few_hundred_megabytes(tmp_path):
    import resource
    import subprocess
    import sys

    log = _big_jsonl(tmp_path / "run" / "metrics.jsonl", 1_000_000)
    small = write_jsonl(tmp_path / "small" / "metrics.jsonl", training_run([0.5] * 4, acc=[0.1]))

    def peak_rss_mib(run_dir):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        done = subprocess.run(
            [sys.executable, "-m", "dapo_verl.cli", "compare", str(run_dir), "--out", str(tmp_path / run_dir.name)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024

    baseline = peak_rss_mib(small.parent)
    assert peak_rss_mib(log.parent) - baseline < 300


def test_a_ratio_whose_count_is_always_zero_is_reported_as_undefined_not_as_missing(tmp_path):
    records = [
        (s, {ACC: 0.5, "actor/dapo/clip_upper_old_prob_sum": 0.0, "actor/dapo/clip_upper_tokens": 0.0}) for s in (1, 2)
    ]
    report = build_report({"a": [write_jsonl(tmp_path / "a.jsonl", records)]})
    lines = report.to_markdown().splitlines()
    undefined = next(line for line in lines if line.startswith("Undefined in every run"))
    assert "`actor/dapo/clip_upper_old_prob_mean`: `actor/dapo/clip_upper_tokens`" in undefined
    missing = next(line for line in lines if line.startswith("Not logged by any run"))
    assert "clip_upper_old_prob_mean" not in missing and "clip_higher_kept_old_prob_mean" in missing


def test_the_heading_names_what_was_compared(tmp_path):
    one = write_jsonl(tmp_path / "a" / "metrics.jsonl", [(s, {ACC: 0.5}) for s in (1, 2)])
    two = write_jsonl(tmp_path / "b" / "metrics.jsonl", [(s, {ACC: 0.6}) for s in (1, 2)])
    assert build_report({"x": [one]}).title == f"# Run report: `{one}`"
    assert build_report({"x": [one, two]}).title == "# Report: arm `x`, 2 runs"
    assert build_report({"0.2": [one], "0.28": [two]}).title == "# Comparison: `0.2` vs `0.28` (1 / 1 runs)"
    assert build_report({"0.2": [one]}).to_markdown().startswith("# Run report: ")
