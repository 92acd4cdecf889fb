"""Randomised invariants of the batch replenisher over configurations and pass rates (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.config import SamplerConfig
from dapo_verl.core import dynamic_group_mask
from dapo_verl.sampler import (
    BatchReplenisher,
    ShortfallError,
    SuccessPredictor,
    informative_probability,
    max_request_size,
    predicted_request,
    step_prompt_budget,
)
from dapo_verl.sampler.simulation import SimulatedPolicy

configs = st.fixed_dictionaries(
    {
        "train_batch_size": st.integers(1, 12),
        "gen_batch_size": st.one_of(st.none(), st.integers(1, 24)),
        "max_num_gen_batches": st.integers(1, 6),
        "refill": st.sampled_from(["barrier", "adaptive"]),
        "surplus": st.sampled_from(["discard", "carry"]),
        "max_staleness_steps": st.integers(1, 3),
        "on_shortfall": st.sampled_from(["error", "partial"]),
        "skip_uninformative": st.booleans(),
        "revisit_informative": st.booleans(),
        "max_oversample_factor": st.sampled_from([1.0, 2.0, 4.0]),
        "enable": st.booleans(),
        "seed": st.integers(0, 1000),
    }
)


@settings(max_examples=80, deadline=None)
@given(
    overrides=configs,
    rates=st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), min_size=1, max_size=6),
    group_size=st.integers(2, 6),
    num_prompts=st.integers(1, 40),
    steps=st.integers(1, 8),
)
def test_batches_are_informative_full_or_flagged_and_conserved(overrides, rates, group_size, num_prompts, steps):
    config = SamplerConfig(**overrides)
    policy = SimulatedPolicy(lambda pid, step: rates[pid % len(rates)], group_size=group_size, seed=config.seed)
    sampler = BatchReplenisher(config, num_prompts, policy)
    for _ in range(steps):
        calls_before = policy.calls
        try:
            batch = sampler.next_batch()
        except ShortfallError:
            assert config.on_shortfall == "error"
            assert sampler.conservation_gap() == 0
            return
        assert policy.calls - calls_before <= config.max_num_gen_batches
        assert batch.metrics["dapo/sampler/prompts_requested"] <= step_prompt_budget(config)
        assert 0 <= batch.metrics["dapo/sampler/pool_exhausted_fraction"] <= 1
        assert sampler.conservation_gap() == 0
        assert len(batch.groups) <= config.train_batch_size
        assert batch.is_partial == (len(batch.groups) < config.train_batch_size)
        if batch.is_partial:
            assert config.on_shortfall == "partial"
        if config.enable and batch.groups:
            assert bool(dynamic_group_mask(batch.stacked_metric()).all())
        staleness = batch.metrics["dapo/sampler/carried_staleness_max"]
        assert staleness <= config.max_staleness_steps
        largest_round = max_request_size(config, config.train_batch_size)
        assert len(sampler.carried) <= config.max_staleness_steps * config.max_num_gen_batches * largest_round
        assert sampler.stream.history_size <= num_prompts
        assert sampler.stream.revisits_waiting <= config.train_batch_size


# -- the numeric validators of the prediction and sizing API ------------------------------------------------

_BAD_REALS = st.one_of(
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False), st.sampled_from([math.nan, math.inf, -math.inf])
)


@settings(max_examples=200, deadline=None)
@given(alpha=st.floats(0.0, 1e6), beta=st.floats(0.0, 1e6), group_size=st.integers(2, 64))
def test_informative_probability_is_a_probability_for_every_belief(alpha, beta, group_size):
    if alpha == 0.0 and beta == 0.0:
        with pytest.raises(ValueError, match=r"alpha=0.0 and beta=0.0"):
            informative_probability(alpha, beta, group_size)
        return
    assert 0.0 <= informative_probability(alpha, beta, group_size) <= 1.0


@settings(max_examples=100, deadline=None)
@given(
    bad=_BAD_REALS,
    position=st.sampled_from(["alpha", "beta"]),
    fraction=st.floats(2.0, 64.0).filter(lambda g: not g.is_integer()),
)
def test_informative_probability_names_a_bad_parameter_or_group_size(bad, position, fraction):
    args = {"alpha": 1.0, "beta": 1.0, position: bad}
    with pytest.raises(ValueError, match=rf"^{position}="):
        informative_probability(args["alpha"], args["beta"], 8)
    with pytest.raises(TypeError, match=r"^group_size=.* must be an integer >= 2"):
        informative_probability(1.0, 1.0, fraction)


@settings(max_examples=150, deadline=None)
@given(
    predictions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
    missing=st.integers(1, 20),
    bad=st.one_of(_BAD_REALS, st.floats(min_value=1.0 + 1e-9, allow_nan=False)),
    data=st.data(),
)
def test_predicted_request_sizes_valid_predictions_and_names_the_first_bad_one(predictions, missing, bad, data):
    config = SamplerConfig(train_batch_size=8)
    count, _ = predicted_request(config, missing, predictions, None)
    assert 1 <= count <= len(predictions)
    index = data.draw(st.integers(0, len(predictions)))
    with pytest.raises(ValueError, match=rf"^predictions\[{index}\]="):
        predicted_request(config, missing, [*predictions[:index], bad, *predictions[index:]], None)


@settings(max_examples=150, deadline=None)
@given(group_size=st.integers(-3, 12), correct=st.integers(-3, 15))
def test_a_predictor_records_exactly_the_groups_that_can_exist(group_size, correct):
    predictor = SuccessPredictor(half_life_steps=10.0, smoothing_groups=8.0)
    if group_size >= 2 and 0 <= correct <= group_size:
        predictor.record(0, correct, group_size)
        assert predictor.size == 1 and 0.0 <= predictor.informative(0) <= 1.0
        return
    with pytest.raises(ValueError, match=r"^(group_size|correct)="):
        predictor.record(0, correct, group_size)
    assert predictor.state_dict() == SuccessPredictor(half_life_steps=10.0, smoothing_groups=8.0).state_dict()
