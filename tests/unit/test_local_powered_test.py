"""The declared primary metric per run, its paired test over seeds, and a reading that says what the interval says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dapo_verl.local.arms import CLIP_ACTS_STUDY, PowerPlan
from dapo_verl.local.powered_test import analyse_primary, primary_value
from dapo_verl.report import LogFormat, RunLog
from dapo_verl.report.readers import records_table

KEY = "val-core/copy3/acc/mean@1"
PLAN = PowerPlan(
    pilot_seeds=(100, 101),
    pilot_effect=0.01,
    pilot_sd=0.1,
    pilot_effect_seeds=787,
    effect=0.05,
    seeds=34,
    why="the pilot's effect is too small to power",
)


def _run(curve, name="run"):
    records = [(step, {KEY: value, "actor/entropy": 0.5}) for step, value in curve]
    return RunLog(path=Path(name), source=Path(name), format=LogFormat.JSONL, table=records_table(records))


def _runs(base_values, treat_values):
    """One run per seed and arm whose greedy accuracy is flat at the given value (so its AUC is that value)."""
    arms = {}
    for arm, values in (("eps_high_0.2", base_values), ("eps_high_0.28", treat_values)):
        arms[arm] = [(seed, _run([(0, v), (5, v), (10, v)])) for seed, v in enumerate(values)]
    return arms


def test_primary_value_is_the_normalised_area_under_the_evaluations():
    assert primary_value(_run([(0, 0.0), (5, 1.0), (40, 1.0)]), CLIP_ACTS_STUDY.primary) == pytest.approx(
        (2.5 + 35) / 40
    )
    assert primary_value(_run([(0, 0.2)]), CLIP_ACTS_STUDY.primary) is None  # one evaluation has no area


@pytest.mark.parametrize(
    ("treat", "start"),
    [
        ([0.62, 0.71, 0.58, 0.80], "The paper's direction"),
        ([0.38, 0.52, 0.41, 0.60], "The opposite of the paper's direction"),
        ([0.55, 0.66, 0.44, 0.72], "No detectable effect"),
    ],
)
def test_the_reading_follows_the_interval(treat, start):
    base = [0.50, 0.60, 0.48, 0.70]
    result = analyse_primary(CLIP_ACTS_STUDY, _runs(base, treat))
    assert result.reading.startswith(start), result.reading
    assert result.differences == pytest.approx({i: t - b for i, (t, b) in enumerate(zip(treat, base))})
    data = result.to_dict()
    assert data["test_name"] == "Student's paired t-test, two-sided"
    assert data["test"]["n"] == 4 and data["primary_metric"]["key"] == CLIP_ACTS_STUDY.primary.key
    assert data["power"]["seeds"] == CLIP_ACTS_STUDY.power.seeds
    assert "Underpowered: 4 of the" in result.reading  # fewer seeds than the power calculation asked for


def test_the_markdown_states_the_declaration_the_power_calculation_the_test_and_the_reading():
    from dataclasses import replace

    study = replace(CLIP_ACTS_STUDY, power=PLAN)
    text = "\n".join(analyse_primary(study, _runs([0.5, 0.6, 0.4], [0.55, 0.66, 0.45])).markdown())
    for part in (
        "Declared before the main run",
        "Seeds: 34, for 80% power",
        "an effect of ±0.0500",
        "would need 787 seeds",
        "the pilot's effect is too small to power",
        "| 3 | +0.0533 |",
        "**Reading.** The paper's direction",
    ):
        assert part in text, part


@pytest.mark.parametrize(("steps", "said"), [((0, 5, 10), "0, 5, 10"), (tuple(range(0, 41, 5)), "0, 5, ..., 40")])
def test_the_declaration_names_the_evaluation_steps_the_runs_logged(steps, said):
    runs = {
        arm: [(seed, _run([(s, 0.5 + 0.01 * seed) for s in steps])) for seed in range(2)]
        for arm in ("eps_high_0.2", "eps_high_0.28")
    }
    result = analyse_primary(CLIP_ACTS_STUDY, runs)
    assert result.evaluation_steps == steps and result.to_dict()["evaluation_steps"] == list(steps)
    text = "\n".join(result.markdown())
    assert f"The runs evaluated it at steps {said}." in text
    assert "40" not in CLIP_ACTS_STUDY.primary.title  # the declared metric does not promise a schedule


def test_seeds_missing_in_one_arm_are_left_out_and_one_pair_is_no_test():
    arms = _runs([0.5, 0.6], [0.7])
    result = analyse_primary(CLIP_ACTS_STUDY, arms)
    assert result.differences == pytest.approx({0: 0.2}) and result.test is None
    assert result.reading == "Fewer than two seeds ran in both arms: no test."


@pytest.mark.parametrize(
    ("treat", "start"),
    [
        ([0.49, 0.61, 0.47, 0.71], "It holds: streaming_carry minus rounds"),  # within the 0.05 margin
        ([0.30, 0.42, 0.31, 0.50], "It loses: streaming_carry minus rounds"),  # the interval below 0
        ([0.42, 0.66, 0.40, 0.74], "Undecided: streaming_carry minus rounds"),  # reaches below -0.05 and above 0
    ],
)
def test_a_guard_reads_its_interval_against_its_margin(treat, start):
    from dapo_verl.local.arms import STREAM_GUARD_STUDY

    base = [0.50, 0.60, 0.48, 0.70]
    runs = {
        arm: [(seed, _run([(0, v), (5, v), (10, v)])) for seed, v in enumerate(values)]
        for arm, values in (("rounds", base), ("streaming_carry", treat))
    }
    result = analyse_primary(STREAM_GUARD_STUDY, runs)
    assert result.reading.startswith(start), result.reading
    assert "clip-higher" not in result.reading and "paper's direction" not in result.reading
    text = "\n".join(result.markdown())
    assert "with a planning SD of 0.0864." in text and "the pilot's SD" not in text


def _development_report(folder, differences, primary=CLIP_ACTS_STUDY.primary):
    import dataclasses
    import json

    folder.mkdir(parents=True, exist_ok=True)
    analysis = {
        "primary": {
            "primary_metric": dataclasses.asdict(primary),
            "differences": {str(k): v for k, v in differences.items()},
        }
    }
    (folder / "report.json").write_text(json.dumps({"analysis": analysis}))
    return folder


def _replication(values_base, values_treat, first_seed=1000):
    from dapo_verl.local.arms import CLIP_ACTS_REPLICATION_STUDY

    runs = {
        arm: [(seed + first_seed, run) for seed, run in pairs]
        for arm, pairs in _runs(values_base, values_treat).items()
    }
    return analyse_primary(CLIP_ACTS_REPLICATION_STUDY, runs)


def test_a_replication_is_pooled_with_the_differences_its_development_run_recorded(tmp_path):
    from dapo_verl.local.powered_test import pool_with_development
    from dapo_verl.report.stats import paired_t_test

    development = {0: 0.05, 1: 0.01, 2: 0.04, 3: 0.03}
    result = _replication([0.50, 0.60, 0.48, 0.70], [0.49, 0.61, 0.48, 0.69])
    pooled = pool_with_development(result, _development_report(tmp_path / "dev", development), "clip-acts")
    assert pooled.development == paired_t_test(list(development.values()))
    assert pooled.replication == result.test and pooled.development_seeds == (0, 1, 2, 3)
    assert pooled.pooled == paired_t_test([*development.values(), *result.differences.values()])
    text = "\n".join(pooled.markdown())
    assert "development (clip-acts, seeds 0-3)" in text and "| pooled (both; not independent" in text
    assert "excludes the development estimate +0.0325" in text  # the replication's interval is near 0 and tight
    assert pooled.to_dict()["pooled"]["n"] == 8


@pytest.mark.parametrize(
    ("development", "message"),
    [
        (None, "no ablation report with a paired test there"),
        ({1000: 0.1, 1: 0.2}, "share seeds [1000]"),
        ({0: 0.1}, "holds 1 paired seed(s)"),
    ],
)
def test_pooling_refuses_a_development_report_it_cannot_pool(tmp_path, development, message):
    from dapo_verl.local.powered_test import pool_with_development

    folder = tmp_path / "dev" if development is None else _development_report(tmp_path / "dev", development)
    result = _replication([0.50, 0.60], [0.52, 0.61])
    with pytest.raises(ValueError, match=re.escape(message)):
        pool_with_development(result, folder, "clip-acts")


def test_pooling_refuses_the_report_of_another_metric_or_other_arms(tmp_path):
    import dataclasses

    from dapo_verl.local.powered_test import pool_with_development

    other = dataclasses.replace(CLIP_ACTS_STUDY.primary, baseline="rounds")
    folder = _development_report(tmp_path / "dev", {0: 0.1, 1: 0.2}, primary=other)
    with pytest.raises(ValueError, match="only the same metric and arms pool"):
        pool_with_development(_replication([0.5, 0.6], [0.5, 0.6]), folder, "clip-acts")
