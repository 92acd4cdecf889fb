"""Adaptive round sizing: size-weighted keep-rate estimate, calibrated single-round probability, bounded requests."""

from __future__ import annotations

import math

import pytest

from dapo_verl.config import SamplerConfig
from dapo_verl.sampler import (
    BatchReplenisher,
    budget_can_fill,
    estimate_sample_size,
    max_request_size,
    predicted_request,
    request_size,
    round_request,
    step_prompt_budget,
    update_keep_rate,
)
from dapo_verl.sampler.simulation import SimulatedPolicy
from dapo_verl.sampler.sizing import inflight_target, yield_stops

KEEP_RATES = (0.25, 0.3, 0.4, 0.5, 0.7, 0.9, 0.99)
MISSING = (1, 2, 3, 5, 10, 30, 128)


def _at_least(n: int, p: float, m: int) -> float:
    """P(Binomial(n, p) >= m), exactly."""
    return 1.0 - sum(math.comb(n, k) * p**k * (1.0 - p) ** (n - k) for k in range(m))


def test_a_full_round_weighs_smoothing_and_a_top_up_round_barely_moves_the_estimate():
    assert update_keep_rate(0.5, 128, 128, 0.3, round_size=128) == pytest.approx(0.65)
    assert update_keep_rate(0.5, 384, 384, 0.3, round_size=128) == pytest.approx(0.5 + 0.5 * (1 - 0.7**3))
    top_up = update_keep_rate(0.5, 3, 3, 0.3, round_size=128)  # 3 of 3 kept: a per-round average would say 0.65
    assert 0.5 < top_up < 0.51


def test_without_round_size_every_round_weighs_smoothing():
    assert update_keep_rate(0.5, 3, 3, 0.3) == pytest.approx(0.65)
    assert update_keep_rate(None, 1, 4, 0.3, round_size=128) == 0.25
    assert update_keep_rate(0.4, 0, 0, 0.3, round_size=128) == 0.4


def test_a_request_for_a_known_keep_rate_fills_the_batch_in_one_round_with_the_target_probability():
    config = SamplerConfig(train_batch_size=128, single_round_probability=0.9)
    for p in KEEP_RATES:
        for m in MISSING:
            n = request_size(config, m, p)
            assert _at_least(n, p, m) >= 0.9, (p, m, n)
            assert _at_least(n, p, m) <= 0.999 or m < 5 or p > 0.95, (p, m, n)  # not wildly oversized


def test_one_missing_group_gets_enough_prompts_to_be_found_in_one_round():
    config = SamplerConfig(train_batch_size=128)
    n = request_size(config, 1, 0.3)
    assert n > config.max_oversample_factor * 1  # a hard 4x cap would ask for 4 prompts: 76% success
    assert _at_least(n, 0.3, 1) >= 0.9


def test_requests_are_monotone_and_never_exceed_what_the_floor_keep_rate_needs():
    config = SamplerConfig(train_batch_size=128, max_oversample_factor=4.0)
    for m in MISSING:
        sizes = [request_size(config, m, p) for p in (1.0, *reversed(KEEP_RATES), 0.2, 0.05, 0.0)]
        assert sizes == sorted(sizes) and sizes[0] == m
        assert sizes[-1] == sizes[-2] == sizes[-3] <= max_request_size(config, m)  # at and below 1/4
        assert sizes[-1] <= 4.0 * m + 12 * math.sqrt(m)  # 4x plus a binomial margin
    assert [request_size(config, m, 0.4) for m in MISSING] == sorted(request_size(config, m, 0.4) for m in MISSING)


def test_max_request_size_bounds_every_mode():
    for overrides in ({"refill": "barrier", "gen_batch_size": 300}, {"enable": False}, {"gen_batch_size": 500}, {}):
        config = SamplerConfig(train_batch_size=128, **overrides)
        for m in MISSING:
            for p in (None, 0.0, 0.1, 0.5, 1.0):
                assert request_size(config, m, p) <= max_request_size(config, m)


def test_a_noisier_estimate_gets_a_bigger_request():
    steady = SamplerConfig(train_batch_size=128, keep_rate_smoothing=0.05)
    jumpy = SamplerConfig(train_batch_size=128, keep_rate_smoothing=1.0)
    assert estimate_sample_size(jumpy) == 128 and estimate_sample_size(steady) == pytest.approx(128 * 39)
    assert request_size(jumpy, 128, 0.4) > request_size(steady, 128, 0.4)


def test_a_probability_below_one_half_asks_for_less_than_the_expected_need():
    config = SamplerConfig(train_batch_size=128, single_round_probability=0.2)
    assert 128 <= request_size(config, 128, 0.5) < 256


def test_at_the_lowest_trusted_keep_rate_one_round_still_fills_the_batch_nine_times_in_ten():
    # A quarter of the prompts mixed (pass rate 0.5, G = 8), the rest never: keep rate ~1/4 = 1/max_oversample_factor.
    # A request capped at 4x the missing groups fills the batch only about half the time here (mean ~1.8 rounds).
    # The keep-rate sizing at its floor: prompts chosen by the streak rule (prediction sizes rounds by its own yield).
    config = SamplerConfig(
        train_batch_size=32, single_round_probability=0.9, max_oversample_factor=4.0, seed=5, prompt_selection="streak"
    )
    policy = SimulatedPolicy(lambda pid, step: (0.5, 0.0, 0.0, 0.0)[pid % 4], group_size=8, seed=5)
    sampler = BatchReplenisher(config, 1000, policy)
    rounds = [sampler.next_batch().metrics["dapo/sampler/gen_rounds"] for _ in range(200)][1:]  # step 1: no estimate
    assert 0.03 <= sum(r > 1 for r in rounds) / len(rounds) <= 0.16
    assert sum(rounds) / len(rounds) <= 1.2 and max(rounds) <= 3


# -- argument checks ----------------------------------------------------------------------------------------

CONFIG = SamplerConfig(train_batch_size=4)


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((CONFIG, -1, [0.5, 0.5], None), ValueError, r"missing=-1 must be an integer >= 1"),
        ((CONFIG, 2.5, [0.5, 0.5], None), TypeError, r"missing=2.5 \(float\) must be an integer >= 1"),
        ((CONFIG, 2, [0.5, math.nan], None), ValueError, r"predictions\[1\]=nan must be a finite number >= 0 and <= 1"),
        ((CONFIG, 2, [-0.5, 0.5], None), ValueError, r"predictions\[0\]=-0.5 must be a finite number >= 0 and <= 1"),
        ((CONFIG, 2, [0.5, 1.5], None), ValueError, r"predictions\[1\]=1.5"),
        ((CONFIG, 2, [0.5, "x"], None), TypeError, r"predictions\[1\]='x' \(str\) must be a finite number"),
        ((CONFIG, 2, "0.5", None), TypeError, "predictions is a str; it must be a list of probabilities"),
        ((CONFIG, 2, [0.5, 0.5], math.nan), ValueError, r"calibration=nan must be a finite number >= 0"),
        ((CONFIG, 2, [0.5, 0.5], -1.0), ValueError, r"calibration=-1.0 must be a finite number >= 0"),
        (({"train_batch_size": 4}, 2, [0.5], None), TypeError, "config is a dict; it must be a dapo_verl.config"),
    ],
)
def test_predicted_request_refuses_what_is_no_prediction(args, error, words):
    with pytest.raises(error, match=words):
        predicted_request(*args)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: request_size(CONFIG, 0, 0.5), ValueError, r"missing=0 must be an integer >= 1"),
        (lambda: request_size(CONFIG, 4, math.nan), ValueError, r"keep_rate=nan must be a finite number >= 0 and <= 1"),
        (lambda: request_size(CONFIG, 4, 1.5), ValueError, r"keep_rate=1.5"),
        (lambda: max_request_size(CONFIG, -2), ValueError, r"missing=-2"),
        (lambda: round_request(CONFIG, 4, 0.5, 0), ValueError, r"budget_left=0 must be an integer >= 1"),
        (lambda: budget_can_fill(CONFIG, 4, 0.5, -1), ValueError, r"budget_left=-1 must be an integer >= 0"),
        (lambda: inflight_target(CONFIG, 4, 0.5, 8, streaming=1), TypeError, r"streaming=1 \(int\) must be True"),
        (lambda: yield_stops(CONFIG, 4, 0.5, 8, math.nan), ValueError, r"groups_seen=nan"),
        (lambda: update_keep_rate(0.5, 5, 4, 0.3), ValueError, r"kept=5 must be an integer in \[0, 4\]"),
        (lambda: update_keep_rate(0.5, 1, -4, 0.3), ValueError, r"generated=-4 must be an integer >= 0"),
        (lambda: update_keep_rate(0.5, 1, 4, 0.0), ValueError, r"smoothing=0.0 must be a finite number > 0 and <= 1"),
        (lambda: update_keep_rate(1.5, 1, 4, 0.3), ValueError, r"estimate=1.5 must be a finite number >= 0 and <= 1"),
        (lambda: update_keep_rate(0.5, 1, 4, 0.3, round_size=0), ValueError, r"round_size=0 must be an integer >= 1"),
        (lambda: step_prompt_budget(None), TypeError, "config is a NoneType"),
    ],
)
def test_sizing_functions_name_the_argument_that_does_not_fit(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_an_empty_round_and_no_budget_left_are_valid_inputs():
    assert update_keep_rate(0.4, 0, 0, 0.3) == 0.4
    assert not budget_can_fill(CONFIG, 4, 0.5, 0)
    assert predicted_request(CONFIG, 2, [], None) == (1, False)
