"""The ablation driver's plan, argument checks and progress lines (no training here; see tests/e2e)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_verl.cli import _parser
from dapo_verl.local.ablate import DEFAULT_JOBS, DEFAULT_SEEDS, Progress, RunOutcome, plan_runs, run_ablation
from dapo_verl.local.arms import CLIP_HIGH, CLIP_STUDY, LADDER_STUDY


def test_plan_is_seed_by_seed_with_the_arm_seed_layout(tmp_path):
    plan = plan_runs(CLIP_STUDY, [3, 5], tmp_path, steps=7, extra_overrides=["local.task.name=summod"])
    assert [(p.arm.name, p.seed) for p in plan] == [("eps_high_0.2", 3), ("eps_high_0.28", 3),
                                                    ("eps_high_0.2", 5), ("eps_high_0.28", 5)]
    assert [p.run_dir for p in plan] == [tmp_path / f"{arm}/seed{seed}" for arm, seed in
                                         [("eps_high_0.2", 3), ("eps_high_0.28", 3), ("eps_high_0.2", 5),
                                          ("eps_high_0.28", 5)]]
    first = plan[0].overrides
    assert first[:2] == tuple(CLIP_STUDY.arms[0].overrides)
    assert first[2:] == ("trainer.total_training_steps=7", "local.task.name=summod", "data.seed=3")


def test_plan_without_steps_keeps_the_configs_run_length(tmp_path):
    plan = plan_runs(LADDER_STUDY, [0], tmp_path)
    assert len(plan) == len(LADDER_STUDY.arms)
    assert not any("total_training_steps" in o for p in plan for o in p.overrides)


@pytest.mark.parametrize(("override", "match"), [
    (f"{CLIP_HIGH}=0.3", r"varies between its arms .*eps_high_0\.2, eps_high_0\.28"),
    (f"+{CLIP_HIGH}=0.3", r"varies between its arms"),
    ("data.seed=4", r"use --seeds or --seed-list instead"),
    ("trainer.default_local_dir=x", r"use --out instead"),
    ("trainer.total_training_steps=9", r"use --steps instead"),
])
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
    return RunOutcome(arm=arm, seed=seed, run_dir=Path(arm) / f"seed{seed}", final_accuracy=acc, final_exact=None,
                      steps=200, wall_s=wall, reused=reused)


def test_progress_writes_one_line_per_run_with_the_time_left():
    lines, now = [], iter([100.0, 100.0, 160.0, 200.0])
    progress = Progress(lines.append, jobs=2, clock=lambda: next(now))
    progress(_outcome("eps_high_0.2", 0, reused=True, wall=31.0), 1, 5)
    progress(_outcome("eps_high_0.28", 0, acc=0.9, wall=58.0), 2, 5)
    progress(_outcome("eps_high_0.2", 1, acc=None, wall=62.0), 4, 5)
    assert lines[0] == "[1/5] eps_high_0.2 seed 0: held-out accuracy 0.50, answer+EOS n/a, reused (31 s earlier)"
    assert lines[1] == ("[2/5] eps_high_0.28 seed 0: held-out accuracy 0.90, answer+EOS n/a, 58 s; "
                        "elapsed 1:00, about 1:27 left")  # 3 runs of 58 s left, 2 at a time
    assert lines[2] == ("[4/5] eps_high_0.2 seed 1: held-out accuracy n/a, answer+EOS n/a, 62 s; "
                        "elapsed 1:40, about 1:00 left")  # the last run alone: the mean run time


def test_cli_help_states_the_driver_defaults():
    ablate = _parser()._subparsers._group_actions[0].choices["ablate"]  # type: ignore[union-attr]
    helps = {action.dest: action.help for action in ablate._actions}
    assert f"(default: {DEFAULT_SEEDS};" in helps["seeds"]
    assert f"(default: {DEFAULT_JOBS};" in helps["jobs"]


def test_cli_help_explains_both_settings_and_the_clip_acts_seed_count():
    from dapo_verl.local.arms import CLIP_ACTS_STUDY

    ablate = _parser()._subparsers._group_actions[0].choices["ablate"]  # type: ignore[union-attr]
    helps = {action.dest: action.help for action in ablate._actions}
    assert "'default' = the default local run" in helps["setting"] and "'clip-acts' = " in helps["setting"]
    assert "clip-acts" in ablate.description and "almost never binds" in ablate.description
    assert f"clip-acts: {CLIP_ACTS_STUDY.power.seeds}, from its power calculation" in helps["seeds"]


def test_cli_refuses_a_setting_with_the_ladder(tmp_path, capsys):
    from dapo_verl.cli import main

    assert main(["ablate", "--ladder", "--setting", "clip-acts", "--out", str(tmp_path)]) == 2
    assert "the ladder runs the default setting only" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
