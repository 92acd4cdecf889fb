"""The ablation arms: the clip arms differ in eps_high only; each ladder rung adds exactly its technique."""

from __future__ import annotations

import itertools
import re

import pytest

from dapo_verl.config import LossAggregation
from dapo_verl.local.arms import (
    CLIP_HIGH,
    CLIP_STUDY,
    DYNAMIC_SAMPLING,
    LADDER_STUDY,
    LOSS_AGG,
    OVERLONG_FILTERING,
    OVERLONG_PENALTY,
    STUDIES,
)
from dapo_verl.local.compose import compose_run, flatten_keys
from dapo_verl.report import derive_label


def _composed(arm):
    return flatten_keys(compose_run(arm.overrides).cfg)


def _differences(a, b):
    return {key: (a.get(key), b.get(key)) for key in a.keys() | b.keys() if a.get(key) != b.get(key)}


def test_clip_arms_differ_only_in_clip_ratio_high_once_composed():
    low, high = (_composed(arm) for arm in CLIP_STUDY.arms)
    assert _differences(low, high) == {CLIP_HIGH: (0.2, 0.28)}
    assert CLIP_STUDY.varied_keys == [CLIP_HIGH]


def test_clip_arms_keep_the_default_run_apart_from_eps_high():
    default = flatten_keys(compose_run().cfg)
    assert _differences(default, _composed(CLIP_STUDY.arms[1])) == {}  # the default already clips 0.2/0.28
    assert _differences(default, _composed(CLIP_STUDY.arms[0])) == {CLIP_HIGH: (0.28, 0.2)}


def test_naive_grpo_is_read_by_the_local_backend_as_naive_grpo():
    spec = compose_run(LADDER_STUDY.arms[0].overrides)
    assert (spec.dapo.loss.clip_ratio_low, spec.dapo.loss.clip_ratio_high) == (0.2, 0.2)
    assert spec.dapo.loss.aggregation == LossAggregation.SEQ_MEAN_TOKEN_MEAN
    assert spec.dapo.overlong.overlong_reward_penalty is False
    assert spec.dapo.overlong.overlong_filtering is False
    assert spec.dapo.sampler.enable is False


def test_each_ladder_rung_adds_exactly_its_technique_in_the_papers_order():
    composed = [_composed(arm) for arm in LADDER_STUDY.arms]
    expected = [
        (OVERLONG_FILTERING, (False, True)),
        (CLIP_HIGH, (0.2, 0.28)),
        (OVERLONG_PENALTY, (False, True)),
        (LOSS_AGG, ("seq-mean-token-mean", "token-mean")),
        (DYNAMIC_SAMPLING, (False, True)),
    ]
    changes = [_differences(before, after) for before, after in itertools.pairwise(composed)]
    assert changes == [dict([item]) for item in expected]


def test_the_last_rung_is_the_default_run_with_overlong_filtering():
    full = flatten_keys(compose_run([f"{OVERLONG_FILTERING}=true"]).cfg)
    assert _differences(full, _composed(LADDER_STUDY.arms[-1])) == {}


@pytest.mark.parametrize("study", list(STUDIES.values()), ids=list(STUDIES))
def test_arm_names_are_unique_directory_names_that_compare_groups_back(study, tmp_path):
    names = [arm.name for arm in study.arms]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z0-9_.]+", name) for name in names)
    for arm in study.arms:
        run_dir = tmp_path / arm.name / "seed3"
        run_dir.mkdir(parents=True)
        assert derive_label(run_dir) == arm.name


def test_ladder_directories_sort_in_ladder_order():
    names = [arm.name for arm in LADDER_STUDY.arms]
    assert sorted(names) == names


def test_clip_acts_arms_differ_only_in_eps_high_and_take_16_gradient_steps_per_rollout():
    from dapo_verl.local.arms import CLIP_ACTS_STUDY

    low, high = (_composed(arm) for arm in CLIP_ACTS_STUDY.arms)
    assert _differences(low, high) == {CLIP_HIGH: (0.2, 0.28)}
    assert CLIP_ACTS_STUDY.varied_keys == [CLIP_HIGH]
    spec = compose_run(CLIP_ACTS_STUDY.arms[0].overrides)
    assert spec.dapo.sampler.train_batch_size // spec.run.actor.ppo_mini_batch_size == 16  # the paper's 512 / 32
    assert spec.run.local.warm_start.steps > 0 and spec.run.rollout.val_n == spec.run.rollout.n  # pass@1..G


def test_clip_acts_seed_count_is_its_power_calculation():
    from dapo_verl.local.arms import CLIP_ACTS_STUDY
    from dapo_verl.report.stats import seeds_for_power

    plan = CLIP_ACTS_STUDY.power
    assert plan.seeds == seeds_for_power(plan.effect, plan.pilot_sd, alpha=plan.alpha, power=plan.power)
    assert plan.pilot_effect_seeds == seeds_for_power(plan.pilot_effect, plan.pilot_sd)
    assert not set(plan.pilot_seeds) & set(range(plan.seeds))  # the main run reuses no pilot seed
    assert {CLIP_ACTS_STUDY.primary.baseline, CLIP_ACTS_STUDY.primary.treatment} == {
        arm.name for arm in CLIP_ACTS_STUDY.arms
    }


def test_the_clip_acts_replication_is_the_clip_acts_study_on_fresh_seeds_from_its_power_calculation():
    from dapo_verl.local.arms import CLIP_ACTS_REPLICATION_STUDY, CLIP_ACTS_STUDY, STUDIES
    from dapo_verl.report.stats import seeds_for_power

    replication = CLIP_ACTS_REPLICATION_STUDY
    assert replication.arms == CLIP_ACTS_STUDY.arms and replication.primary == CLIP_ACTS_STUDY.primary
    assert replication.replicates == CLIP_ACTS_STUDY.name
    plan = replication.power
    # the development run's effect, sized with the larger measured SD of the paired differences
    assert plan.pilot_effect == plan.effect == 0.025 and plan.sizing_sd == max(plan.pilot_sd, 0.056)
    assert plan.seeds == seeds_for_power(plan.effect, plan.sizing_sd) == 42
    assert plan.pilot_effect_seeds == seeds_for_power(plan.pilot_effect, plan.pilot_sd)
    used = set(CLIP_ACTS_STUDY.power.main_seeds) | set(CLIP_ACTS_STUDY.power.pilot_seeds)
    for study in STUDIES.values():  # fresh: no other study's seeds, pilots included
        if study.power is not None and study is not replication:
            used |= set(study.power.main_seeds) | set(study.power.pilot_seeds)
    assert not used & set(plan.main_seeds) and plan.main_seeds == list(range(1000, 1042))


def test_the_stream_guard_differs_only_in_streaming_and_its_seeds_are_its_power_calculation():
    from dapo_verl.local.arms import CLIP_ACTS_STUDY, STREAM_GUARD_STUDY
    from dapo_verl.report.stats import seeds_for_power

    assert STREAM_GUARD_STUDY.varied_keys == [
        "algorithm.filter_groups.streaming",
        "algorithm.filter_groups.surplus",
        "algorithm.filter_groups.stream_oversample",
    ]
    plan = STREAM_GUARD_STUDY.power
    assert plan.pilot_effect_seeds == seeds_for_power(plan.pilot_effect, plan.pilot_sd)
    # The planning SD is the clip-acts pilot's: two pilot seeds give no usable estimate.
    assert plan.seeds == seeds_for_power(plan.effect, plan.sizing_sd) == 26
    assert plan.sizing_sd == CLIP_ACTS_STUDY.power.pilot_sd
    assert plan.main_seeds == list(range(100, 126)) and not set(plan.main_seeds) & set(plan.pilot_seeds)
    primary = STREAM_GUARD_STUDY.primary
    assert (primary.baseline, primary.treatment) == ("rounds", "streaming_carry")


def test_a_local_run_that_streams_and_carries_is_warned_of_its_measured_accuracy_loss(caplog):
    import logging

    from dapo_verl.local.arms import STREAM_GUARD_STUDY
    from dapo_verl.local.compose import STREAMING_CARRY_WARNING, check_run

    rounds, carry = (compose_run(arm.overrides) for arm in STREAM_GUARD_STUDY.arms)
    discard = compose_run([*STREAM_GUARD_STUDY.arms[1].overrides, "algorithm.filter_groups.surplus=discard"])
    trained = compose_run([o for o in STREAM_GUARD_STUDY.arms[1].overrides if "stale_prefix" not in o])  # default
    for spec, warned in ((rounds, False), (carry, True), (discard, False), (trained, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dapo_verl.local.compose"):
            check_run(spec)
        assert (STREAMING_CARRY_WARNING in caplog.text) is warned
