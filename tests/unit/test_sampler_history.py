"""Prompt histories: signed streaks, measured rates per streak bucket, the skip rule, pool exhaustion."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_verl.config import SamplerConfig
from dapo_verl.core import DropReason
from dapo_verl.sampler import BatchReplenisher, PromptStream, SuccessPredictor
from dapo_verl.sampler.history import (
    PRIOR_GROUPS,
    STREAK_LEVELS,
    PromptHistory,
    generate_probability,
    next_streak,
    revisits_pay,
)
from dapo_verl.sampler.simulation import SimulatedPolicy

KEEP, CORRECT, WRONG, SPREAD = DropReason.KEEP, DropReason.ALL_CORRECT, DropReason.ALL_WRONG, DropReason.ZERO_SPREAD


def _history(num_prompts=10, **overrides):
    settings = {"smoothing_groups": 1e12, "max_skip_probability": 0.9, "exhausted_streak": 3, **overrides}
    return PromptHistory(num_prompts, **settings)


def test_streaks_count_uninformative_groups_in_a_row_with_their_kind():
    assert next_streak(0, CORRECT) == 1 and next_streak(2, CORRECT) == 3
    assert next_streak(0, WRONG) == -1 and next_streak(-2, SPREAD) == -3
    assert next_streak(3, WRONG) == -1 and next_streak(-3, CORRECT) == 1  # the kind changed: a new streak
    assert next_streak(5, KEEP) == next_streak(-5, KEEP) == 0


def test_long_streaks_share_the_end_buckets():
    assert PromptHistory.bucket(0) == STREAK_LEVELS
    assert PromptHistory.bucket(STREAK_LEVELS + 7) == PromptHistory.bucket(STREAK_LEVELS) == 2 * STREAK_LEVELS
    assert PromptHistory.bucket(-100) == 0


def test_generate_probability_follows_the_measured_rate_ratio_within_the_floor():
    assert generate_probability(0.05, 0.2, 0.9) == pytest.approx(0.25)
    assert generate_probability(0.0, 0.2, 0.9) == pytest.approx(0.1)  # floor: 1 - max_skip_probability
    assert generate_probability(0.3, 0.2, 0.9) == 1.0  # the history predicts more informative groups
    assert generate_probability(0.1, None, 0.9) == generate_probability(0.1, 0.0, 0.9) == 1.0  # nothing to compare
    assert generate_probability(0.0, 0.2, 0.0) == 1.0  # max_skip_probability=0 turns skipping off


def test_a_bucket_is_thinned_only_on_evidence():
    history = _history()
    for pid in range(4):
        history.record(pid, KEEP if pid % 2 else CORRECT)  # no-streak rate 1/2; prompts 0 and 2 now have +1
    assert history.rate(history.bucket(0)) == pytest.approx(0.5)
    assert history.rate(history.bucket(1)) == pytest.approx(0.5)  # no evidence yet: the prior, the no-streak rate
    assert history.generate_probability(0) == 1.0 and history.generate_probability(1) == 1.0
    history.record(0, CORRECT)  # one all-correct group from bucket +1
    expected = PRIOR_GROUPS * 0.5 / (1 + PRIOR_GROUPS)
    assert history.rate(history.bucket(1)) == pytest.approx(expected)
    assert history.generate_probability(2) == pytest.approx(expected / 0.5)


def test_measured_rates_forget_old_groups():
    history = _history(num_prompts=200, smoothing_groups=10.0)
    for pid in range(100):
        history.record(pid, KEEP)
    for pid in range(100, 200):
        history.record(pid, CORRECT)
    assert history.rate(history.bucket(0)) < 1e-3  # 100 new groups outweigh 100 old ones at a 10-group memory


def test_history_without_predictive_power_skips_nothing():
    history = _history(num_prompts=400, smoothing_groups=2000.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):  # every prompt is informative half the time whatever its past: streaks tell nothing
        for pid in range(400):
            draw = int(torch.randint(4, (), generator=gen))
            history.record(pid, (KEEP, KEEP, CORRECT, WRONG)[draw])
    probabilities = [history.generate_probability(pid) for pid in range(400)]
    assert min(probabilities) > 0.8


def test_pool_exhaustion_counts_prompts_solved_or_failed_k_times_in_a_row():
    history = _history(num_prompts=10, exhausted_streak=2)
    for _ in range(2):
        history.record(0, CORRECT)
        history.record(1, WRONG)
    history.record(2, CORRECT)
    assert history.solved_fraction == pytest.approx(0.1) and history.failed_fraction == pytest.approx(0.1)
    assert history.exhausted_fraction == pytest.approx(0.2)
    history.record(0, KEEP)  # solved no more
    history.record(1, CORRECT)  # a new streak of another kind
    assert history.exhausted_fraction == 0.0


def test_history_state_round_trip_restores_rates_streaks_and_exhaustion():
    history = _history(exhausted_streak=2)
    for pid, reason in [(0, CORRECT), (0, CORRECT), (1, WRONG), (2, KEEP), (1, WRONG), (3, SPREAD)]:
        history.record(pid, reason)
    restored = _history(exhausted_streak=2)
    restored.load_state_dict(history.state_dict())
    assert restored.state_dict() == history.state_dict()
    assert restored.exhausted_fraction == history.exhausted_fraction == pytest.approx(0.2)
    assert [restored.generate_probability(p) for p in range(4)] == [history.generate_probability(p) for p in range(4)]
    restored.load_state_dict({})
    assert restored.size == 0 and restored.exhausted_fraction == 0.0


def _run(skip, rates, steps=40, **overrides):
    settings = {"revisit_informative": False, "prompt_selection": "streak", **overrides}  # isolate streak skipping
    config = SamplerConfig(train_batch_size=8, seed=1, skip_uninformative=skip, max_num_gen_batches=20, **settings)
    sampler = BatchReplenisher(config, 200, SimulatedPolicy(lambda pid, step: rates[pid % len(rates)], group_size=4))
    for _ in range(steps):
        sampler.next_batch()
    return sampler


def test_measured_skipping_cuts_generation_where_history_predicts():
    rates = (1.0, 1.0, 0.0, 0.5)  # three prompts in four never give an informative group
    plain, skipping = _run(False, rates), _run(True, rates)

    def cost(sampler):
        return sampler.counters["responses_generated"] / sampler.counters["responses_trained"]

    assert cost(skipping) < 0.75 * cost(plain)
    assert skipping.conservation_gap() == 0


def test_measured_skipping_is_nearly_inert_where_history_predicts_nothing():
    sampler = _run(True, (0.5,), steps=30)  # every prompt alike: a streak says nothing about the next group
    skipped, consumed = sampler.stream.prompts_skipped, sampler.stream.prompts_consumed
    assert skipped < 0.1 * (skipped + consumed)


def test_pool_metrics_are_reported_every_step():
    sampler = _run(False, (1.0, 1.0, 0.0, 0.5), steps=60, exhausted_streak=2, exhausted_pool_fraction=0.5)
    metrics = sampler.next_batch().metrics
    assert metrics["dapo/sampler/pool_exhausted_fraction"] == pytest.approx(
        metrics["dapo/sampler/pool_solved_fraction"] + metrics["dapo/sampler/pool_failed_fraction"]
    )
    assert metrics["dapo/sampler/pool_solved_fraction"] > metrics["dapo/sampler/pool_failed_fraction"] > 0
    assert metrics["dapo/sampler/pool_exhausted"] == float(sampler.pool_exhausted) == 1.0  # 3 in 4 never inform
    assert 0 <= metrics["dapo/sampler/keep_rate_streak"] < metrics["dapo/sampler/keep_rate_no_streak"]


def test_revisits_pay_only_while_informative_groups_are_rare_and_revisits_do_better():
    assert revisits_pay(0.1, None, 0.25)  # rare, revisits not measured yet: try them
    assert revisits_pay(0.1, 0.3, 0.25)
    assert not revisits_pay(0.1, 0.05, 0.25)  # measured to be worse than fresh prompts
    assert not revisits_pay(0.3, 0.9, 0.25)  # groups are plentiful: keep the data broad
    assert not revisits_pay(None, None, 0.25)


def test_revisit_rate_needs_prior_groups_and_excludes_revisits_from_the_stream_rate():
    history = _history()
    for pid in range(10):
        history.record(pid, CORRECT)
    for pid in range(int(PRIOR_GROUPS) - 1):
        history.record(pid, KEEP, revisit=True)
    assert history.revisit_rate() is None and history.stream_rate() == 0.0
    history.record(9, KEEP, revisit=True)
    assert history.revisit_rate() == 1.0 and history.stream_rate() == 0.0


def test_revisit_queue_is_first_in_first_out_bounded_and_only_used_on_request():
    stream = PromptStream(50, seed=0, revisit_capacity=3)
    for pid in (7, 8, 9, 10):
        stream.record(pid, KEEP)
    assert stream.revisits_waiting == 3  # 7 left first
    ids, _ = stream.take(2)
    assert stream.revisits_waiting == 3 and stream.prompts_revisited == 0
    ids, _ = stream.take(4, revisit=True)
    assert ids[:3] == [8, 9, 10] and stream.revisits_waiting == 0 and stream.prompts_revisited == 3
    stream.record(8, KEEP)  # informative again: back in the queue; both count as revisits, not as stream groups
    stream.record(9, CORRECT)
    assert stream.history.stream_rate() == 1.0  # the four first groups, all informative
    assert stream.revisits_waiting == 1


def test_stream_state_round_trip_keeps_the_revisit_queue():
    stream = PromptStream(50, seed=0, revisit_capacity=4)
    for pid in (3, 4, 5):
        stream.record(pid, KEEP)
    stream.take(1, revisit=True)
    restored = PromptStream(50, seed=0, revisit_capacity=4)
    restored.load_state_dict(stream.state_dict())
    saved, again = stream.state_dict(), restored.state_dict()
    assert torch.equal(saved.pop("rng"), again.pop("rng")) and saved == again
    assert saved["revisit"] == [4, 5] and saved["handed_out"] == [3]
    assert restored.take(3, revisit=True) == stream.take(3, revisit=True)


def _rare(revisit, steps=30):
    rates = (0.5,) + (1.0,) * 15  # one prompt in 16 can be informative: about 4% of groups
    config = SamplerConfig(
        train_batch_size=4,
        seed=2,
        revisit_informative=revisit,
        skip_uninformative=False,
        max_num_gen_batches=4,
        on_shortfall="partial",
    )
    sampler = BatchReplenisher(config, 320, SimulatedPolicy(lambda pid, step: rates[pid % 16], group_size=4, seed=2))
    return sampler, [sampler.next_batch() for _ in range(steps)]


def test_revisits_raise_the_yield_when_informative_groups_are_rare():
    plain, _ = _rare(False)
    revisiting, batches = _rare(True)
    assert sum(b.metrics["dapo/sampler/prompts_revisited"] for b in batches) > 0
    assert revisiting.counters["groups_trained"] > 1.5 * plain.counters["groups_trained"]

    def cost(sampler):
        return sampler.counters["responses_generated"] / sampler.counters["responses_trained"]

    assert cost(revisiting) < 0.75 * cost(plain)
    assert revisiting.conservation_gap() == 0
    metrics = batches[-1].metrics
    assert metrics["dapo/sampler/keep_rate_revisit"] > metrics["dapo/sampler/keep_rate_stream"]


def test_no_revisits_while_informative_groups_are_plentiful():
    config = SamplerConfig(train_batch_size=8, seed=0, revisit_informative=True)
    sampler = BatchReplenisher(config, 200, SimulatedPolicy(lambda pid, step: 0.5, group_size=4))
    assert sum(sampler.next_batch().metrics["dapo/sampler/prompts_revisited"] for _ in range(10)) == 0


# -- argument and state checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"num_prompts": 10.5}, TypeError, r"num_prompts=10.5 \(float\) must be an integer >= 1"),
        ({"num_prompts": 0}, ValueError, r"num_prompts=0 must be an integer >= 1.*prompt source is empty"),
        ({"seed": -1}, ValueError, r"seed=-1 must be an integer in \[0, 4294967295\]"),
        ({"shuffle": "yes"}, TypeError, r"shuffle='yes' \(str\) must be True or False"),
        ({"max_skip_probability": 1.0}, ValueError, r"max_skip_probability=1.0 must be a finite number >= 0 and < 1"),
        ({"smoothing_groups": 0.5}, ValueError, r"smoothing_groups=0.5 must be a finite number >= 1"),
        ({"exhausted_streak": 0}, ValueError, r"exhausted_streak=0 must be an integer >= 1"),
        ({"revisit_capacity": -1}, ValueError, r"revisit_capacity=-1 must be an integer >= 0"),
        ({"selection_window": math.nan}, ValueError, r"selection_window=nan must be a finite number >= 1"),
        ({"explore_fraction": 1.5}, ValueError, r"explore_fraction=1.5 must be a finite number >= 0 and <= 1"),
    ],
)
def test_prompt_stream_settings_are_checked_with_their_name(kwargs, error, words):
    with pytest.raises(error, match=words):
        PromptStream(**{"num_prompts": 10, **kwargs})


def test_a_fractional_prompt_count_is_named_by_the_replenisher():
    with pytest.raises(TypeError, match=r"num_prompts=10.5 \(float\) must be an integer >= 1"):
        BatchReplenisher(SamplerConfig(train_batch_size=2), 10.5, lambda ids: [])


@pytest.mark.parametrize("config", ["x", None, {"train_batch_size": 2}])
def test_a_config_that_is_not_a_sampler_config_is_named_by_the_replenisher(config):
    with pytest.raises(TypeError, match=r"config=.* must be a SamplerConfig\. Use DapoConfig\.sampler\."):
        BatchReplenisher(config, 10, lambda ids: [])


def test_take_refuses_a_negative_count_and_takes_nothing_for_zero():
    stream = PromptStream(10, seed=1)
    with pytest.raises(ValueError, match=r"count=-1 must be an integer >= 0"):
        stream.take(-1)
    with pytest.raises(TypeError, match=r"count=2.0 \(float\)"):
        stream.take(2.0)
    assert stream.take(0) == ([], 0) and stream.prompts_consumed == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "words"),
    [
        ((10, KEEP), {}, ValueError, r"prompt_id=10 must be an integer in \[0, 9\]"),
        ((1, "keep"), {}, TypeError, r"reason='keep' must be a dapo_verl.core.DropReason"),
        ((1, KEEP), {"correct": 5, "group_size": 4}, ValueError, r"correct=5 must be an integer in \[0, 4\]"),
        ((1, KEEP), {"correct": 1, "group_size": 1}, ValueError, r"group_size=1 must be an integer >= 2"),
    ],
)
def test_a_record_that_does_not_fit_changes_neither_history_nor_scorer(args, kwargs, error, words):
    stream = PromptStream(
        10, skip_uninformative=True, scorer=SuccessPredictor(half_life_steps=10.0, smoothing_groups=8.0)
    )
    stream.record(2, CORRECT, correct=4, group_size=4)
    before = stream.state_dict()
    with pytest.raises(error, match=words):
        stream.record(*args, **kwargs)
    assert str(stream.state_dict()) == str(before)


def test_a_prompt_history_refuses_prompts_outside_its_pool():
    with pytest.raises(ValueError, match=r"prompt_id=-1 must be an integer in \[0, 9\]"):
        _history().record(-1, KEEP)


@pytest.mark.parametrize(
    ("state", "error", "words"),
    [
        ([], TypeError, "the PromptHistory state is list, not a mapping"),
        ({"bogus": 1}, ValueError, r"the PromptHistory state has unknown keys \['bogus'\]"),
        ({"streak": [[12, 1]]}, ValueError, r"'streak' is 12; expected an integer in \[0, 9\]"),
        ({"streak": [[1, 1.5]]}, ValueError, r"'streak' is 1.5; expected an integer"),
        ({"stream": [1.0, -2.0]}, ValueError, r"'stream\[1\]' is -2.0; expected a finite number >= 0"),
        ({"informative": [0.0] * 3}, ValueError, r"'informative' is .*expected a list of 10 finite non-negative"),
    ],
)
def test_a_damaged_history_state_is_refused_and_the_history_is_unchanged(state, error, words):
    history = _history()
    history.record(1, CORRECT)
    before = history.state_dict()
    with pytest.raises(error, match=words):
        history.load_state_dict(state)
    assert history.state_dict() == before


def test_a_stream_whose_scorer_refuses_its_state_is_left_as_it_was():
    def stream():
        return PromptStream(
            10, skip_uninformative=True, scorer=SuccessPredictor(half_life_steps=10.0, smoothing_groups=8.0)
        )

    source, target = stream(), stream()
    source.take(3)
    source.record(2, CORRECT, correct=4, group_size=4)
    state = {**source.state_dict(), "scorer": {"step": -1}}
    before = str(target.state_dict())
    with pytest.raises(ValueError, match=r"'step' is -1"):
        target.load_state_dict(state)
    assert str(target.state_dict()) == before and target.history_size == 0
