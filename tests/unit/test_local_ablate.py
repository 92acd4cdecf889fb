"""The ablation driver's plan, argument checks and progress lines (no training here; see tests/e2e)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_verl.cli import _parser, main
from dapo_verl.local.ablate import (
    DEFAULT_JOBS,
    DEFAULT_SEEDS,
    Progress,
    RunOutcome,
    plan_runs,
    run_ablation,
    seed_list,
)
from dapo_verl.local.ablation_report import summary_markdown
from dapo_verl.local.arms import CLIP_ACTS_STUDY, CLIP_HIGH, CLIP_STUDY, LADDER_STUDY, STEPS_KEY
from dapo_verl.report import build_report


def test_plan_is_seed_by_seed_with_the_arm_seed_layout(tmp_path):
    plan = plan_runs(CLIP_STUDY, [3, 5], tmp_path, steps=7, extra_overrides=["local.task.name=summod"])
    assert [(p.arm.name, p.seed) for p in plan] == [
        ("eps_high_0.2", 3),
        ("eps_high_0.28", 3),
        ("eps_high_0.2", 5),
        ("eps_high_0.28", 5),
    ]
    assert [p.run_dir for p in plan] == [
        tmp_path / f"{arm}/seed{seed}"
        for arm, seed in [("eps_high_0.2", 3), ("eps_high_0.28", 3), ("eps_high_0.2", 5), ("eps_high_0.28", 5)]
    ]
    first = plan[0].overrides
    assert first[:2] == tuple(CLIP_STUDY.arms[0].overrides)
    assert first[2:] == ("trainer.total_training_steps=7", "local.task.name=summod", "data.seed=3")


def test_plan_without_steps_keeps_the_configs_run_length(tmp_path):
    plan = plan_runs(LADDER_STUDY, [0], tmp_path)
    assert len(plan) == len(LADDER_STUDY.arms)
    assert not any("total_training_steps" in o for p in plan for o in p.overrides)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (f"{CLIP_HIGH}=0.3", r"varies between its arms .*eps_high_0\.2, eps_high_0\.28"),
        (f"+{CLIP_HIGH}=0.3", r"varies between its arms"),
        ("data.seed=4", r"use --seeds or --seed-list instead"),
        ("trainer.default_local_dir=x", r"use --out instead"),
        ("trainer.total_training_steps=9", r"use --steps instead"),
    ],
)
def test_plan_refuses_overrides_that_would_break_the_ablation(tmp_path, override, match):
    with pytest.raises(ValueError, match=match):
        plan_runs(CLIP_STUDY, [0], tmp_path, extra_overrides=[override])


def test_plan_refuses_a_key_only_the_ladder_varies_in_the_ladder(tmp_path):
    plan_runs(CLIP_STUDY, [0], tmp_path, extra_overrides=["algorithm.filter_groups.enable=false"])
    with pytest.raises(ValueError, match="ladder study varies"):
        plan_runs(LADDER_STUDY, [0], tmp_path, extra_overrides=["algorithm.filter_groups.enable=false"])


@pytest.mark.parametrize(("seeds", "match"), [([], "no seed given"), ([1, 2, 1], "repeat a seed")])
def test_plan_refuses_empty_or_repeated_seeds(tmp_path, seeds, match):
    with pytest.raises(ValueError, match=match):
        plan_runs(CLIP_STUDY, seeds, tmp_path)


def test_steps_replace_the_run_length_a_setting_declares_so_the_listed_overrides_are_what_runs(tmp_path):
    plan = plan_runs(CLIP_ACTS_STUDY, [0], tmp_path, steps=10)
    for planned in plan:
        lengths = [o for o in planned.overrides if o.startswith(f"{STEPS_KEY}=")]
        assert lengths == [f"{STEPS_KEY}=10"]  # once, not 40 and then 10
        assert planned.arm.settings[STEPS_KEY] == "10"
    study = CLIP_ACTS_STUDY.with_steps(10)
    assert CLIP_ACTS_STUDY.arms[0].settings[STEPS_KEY] == "40" and CLIP_ACTS_STUDY.with_steps(None) is CLIP_ACTS_STUDY
    log = tmp_path / "m.jsonl"
    log.write_text('{"step": 1, "data": {"actor/entropy": 0.5}}\n')
    outcomes = [
        RunOutcome(
            arm=a.name,
            seed=0,
            run_dir=tmp_path,
            final_accuracy=0.5,
            final_exact=None,
            steps=10,
            wall_s=1.0,
            reused=False,
        )
        for a in study.arms
    ]
    text = summary_markdown(study, outcomes, build_report({a.name: [log] for a in study.arms}))
    assert f"{STEPS_KEY}=10" in text and f"{STEPS_KEY}=40" not in text


@pytest.mark.parametrize("count", [0, -3])
def test_a_seed_count_below_one_names_the_value(tmp_path, capsys, count):
    with pytest.raises(ValueError, match=rf"--seeds {count} is not a number of seeds; it must be at least 1"):
        seed_list(count, None, 10)
    assert main(["ablate", "--seeds", str(count), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"dapo-verl ablate: --seeds {count} is not a number of seeds; it must be at least 1 "
        "(--seeds N trains seeds 0..N-1 in every arm). Pass e.g. --seeds 2, or --seed-list K "
        "[K ...]."
    ]
    assert seed_list(None, None, 3) == [0, 1, 2] and seed_list(2, None, 10) == [0, 1]
    assert seed_list(None, [5, 3], 10) == [5, 3]


@pytest.mark.parametrize("inside", [False, True])
def test_an_out_that_is_a_file_is_refused_before_any_run_is_composed(tmp_path, monkeypatch, capsys, inside):
    import dapo_verl.local.ablate as ablate

    afile = tmp_path / "afile"
    afile.write_text("notes\n")
    out = afile / "x" if inside else afile

    def no_compose(*args, **kwargs):
        raise AssertionError("composed a run before refusing --out")

    monkeypatch.setattr(ablate, "compose_run", no_compose)
    assert main(["ablate", "--seeds", "1", "--steps", "1", "--out", str(out)]) == 2
    where = f"lies in {afile}, which is a file" if inside else "is a file"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"dapo-verl ablate: --out {out} {where}; an ablation writes a directory of runs (<out>/<arm>/seed<k>) and "
        "its report. Pass a directory: a new one, or an earlier ablation's to continue it."
    )
    assert afile.read_text() == "notes\n"


@pytest.mark.parametrize("marker", ["ablation.md", "analysis"])
def test_compare_refuses_to_overwrite_an_ablations_report(tmp_path, capsys, marker):
    out = tmp_path / "ablation"
    out.mkdir()
    report = {"metrics": [], "analysis": {"primary": {"test": {"n": 26}}}} if marker == "analysis" else {"metrics": []}
    (out / "report.json").write_text(json.dumps(report))
    if marker == "ablation.md":
        (out / "ablation.md").write_text("# the ablation\n")
    run = tmp_path / "run" / "metrics.jsonl"
    run.parent.mkdir()
    run.write_text('{"step": 1, "data": {"actor/entropy": 0.5}}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["compare", str(run.parent), "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"dapo-verl compare: --out {out} holds an ablation's report (ablation.md beside it); this comparison would "
        f"overwrite {out / 'report.json'}, and with it any paired test and power analysis of the ablation, its "
        f"report.md and plots. Choose another --out, e.g. --out {out / 'compare'}."
    ]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["compare", str(run.parent), "--out", str(out / "compare")]) == 0  # the fix it names works


def test_compare_replaces_its_own_earlier_report(tmp_path):
    run = tmp_path / "run" / "metrics.jsonl"
    run.parent.mkdir()
    run.write_text('{"step": 1, "data": {"actor/entropy": 0.5}}\n')
    assert main(["compare", str(run.parent), "--out", str(tmp_path / "o")]) == 0
    assert main(["compare", str(run.parent), "--out", str(tmp_path / "o")]) == 0


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True])
def test_run_ablation_refuses_a_bad_job_count_before_anything_runs(tmp_path, jobs):
    with pytest.raises(ValueError, match="jobs=.* must be a positive integer"):
        run_ablation(CLIP_STUDY, [0], tmp_path, jobs=jobs)
    assert not list(tmp_path.iterdir())


def test_run_ablation_checks_every_config_before_training(tmp_path):
    with pytest.raises(ValueError, match="local.model.hidden"):
        run_ablation(CLIP_STUDY, [0], tmp_path, extra_overrides=["local.model.hidden=3"])
    assert not list(tmp_path.iterdir())


def _outcome(arm, seed, *, reused=False, acc=0.5, wall=10.0):
    return RunOutcome(
        arm=arm,
        seed=seed,
        run_dir=Path(arm) / f"seed{seed}",
        final_accuracy=acc,
        final_exact=None,
        steps=200,
        wall_s=wall,
        reused=reused,
    )


def test_progress_writes_one_line_per_run_with_the_time_left():
    lines, now = [], iter([100.0, 100.0, 160.0, 200.0])
    progress = Progress(lines.append, jobs=2, clock=lambda: next(now))
    progress(_outcome("eps_high_0.2", 0, reused=True, wall=31.0), 1, 5)
    progress(_outcome("eps_high_0.28", 0, acc=0.9, wall=58.0), 2, 5)
    progress(_outcome("eps_high_0.2", 1, acc=None, wall=62.0), 4, 5)
    assert lines[0] == "[1/5] eps_high_0.2 seed 0: held-out accuracy 0.50, answer+EOS n/a, reused (31 s earlier)"
    assert lines[1] == (
        "[2/5] eps_high_0.28 seed 0: held-out accuracy 0.90, answer+EOS n/a, 58 s; elapsed 1:00, about 1:27 left"
    )  # 3 runs of 58 s left, 2 at a time
    assert lines[2] == (
        "[4/5] eps_high_0.2 seed 1: held-out accuracy n/a, answer+EOS n/a, 62 s; elapsed 1:40, about 1:00 left"
    )  # the last run alone: the mean run time


def test_cli_help_states_the_driver_defaults():
    ablate = _parser()._subparsers._group_actions[0].choices["ablate"]  # type: ignore[union-attr]
    helps = {action.dest: action.help for action in ablate._actions}
    assert f"(default: {DEFAULT_SEEDS}," in helps["seeds"]
    assert f"(default: {DEFAULT_JOBS};" in helps["jobs"]


def test_cli_lists_every_setting_from_the_studies_with_what_each_runs():
    from dapo_verl.local.arms import SETTINGS

    ablate = _parser()._subparsers._group_actions[0].choices["ablate"]  # type: ignore[union-attr]
    actions = {action.dest: action for action in ablate._actions}
    assert list(actions["setting"].choices) == list(SETTINGS)
    assert "'default' = the clip ablation on the default local run" in actions["setting"].help
    for name, study in SETTINGS.items():
        assert study.summary and f"'{name}' = {study.summary}" in actions["setting"].help
    assert "clip-acts" in ablate.description and "almost never binds" in ablate.description
    assert "the setting's seeds from its power calculation" in actions["seeds"].help


def test_pool_with_is_refused_for_a_study_that_replicates_none_before_anything_runs(tmp_path, capsys):
    assert main(["ablate", "--setting", "clip-acts", "--pool-with", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "replicates no other, so there is nothing to pool" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # a replication pointed at a folder without the replicated study's report: refused before any run
    assert (
        main(
            ["ablate", "--setting", "clip-acts-replication", "--pool-with", str(tmp_path), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    assert "no ablation report with a paired test there" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_setting_with_the_ladder(tmp_path, capsys):
    assert main(["ablate", "--ladder", "--setting", "clip-acts", "--out", str(tmp_path)]) == 2
    assert "the ladder runs the default setting only" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
