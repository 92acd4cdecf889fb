"""The paired test, its interval, the seed count for a power, the area under a curve, and the ratio metrics."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.report.derived import RATIO_METRICS, RATIO_PARTS, derive_ratios
from dapo_verl.report.stats import normalised_auc, paired_t_test, seeds_for_power, t_cdf, t_quantile

# Student's t quantiles from printed tables (4 decimals)
T_TABLE = [
    (0.975, 1, 12.7062),
    (0.975, 4, 2.7764),
    (0.975, 9, 2.2622),
    (0.975, 25, 2.0595),
    (0.8, 10, 0.8791),
    (0.995, 5, 4.0321),
    (0.9, 30, 1.3104),
]


@pytest.mark.parametrize(("q", "df", "expected"), T_TABLE)
def test_t_quantiles_match_the_printed_tables(q, df, expected):
    assert t_quantile(q, df) == pytest.approx(expected, abs=1e-4)
    assert t_cdf(expected, df) == pytest.approx(q, abs=3e-5)  # the table's rounding
    assert t_quantile(1 - q, df) == pytest.approx(-expected, abs=1e-4)  # symmetric


def test_t_cdf_closed_forms():
    assert t_cdf(0.0, 7) == pytest.approx(0.5)
    for t in (-3.0, -0.5, 0.7, 4.0):  # df = 1 is Cauchy, df = 2 has a closed form
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_cdf(3.0, 1e6) == pytest.approx(statistics.NormalDist().cdf(3.0), abs=1e-6)  # large df: the normal


@settings(max_examples=60, deadline=None)
@given(q=st.floats(0.001, 0.999), df=st.integers(1, 200))
def test_t_quantile_inverts_t_cdf(q, df):
    assert t_cdf(t_quantile(q, df), df) == pytest.approx(q, abs=1e-9)


def test_paired_t_test_by_hand():
    diffs = [0.1, 0.2, 0.0, 0.3]  # mean 0.15, sd 0.1291, se 0.06455, t 2.3238 with 3 df
    test = paired_t_test(diffs)
    assert (test.n, test.df, test.better, test.same, test.worse) == (4, 3, 3, 1, 0)
    assert test.mean == pytest.approx(0.15) and test.sd == pytest.approx(statistics.stdev(diffs))
    assert test.t == pytest.approx(0.15 / (statistics.stdev(diffs) / 2))
    half = 3.1824 * statistics.stdev(diffs) / 2  # t_{0.975, 3} = 3.1824
    assert (test.ci_low, test.ci_high) == (pytest.approx(0.15 - half, abs=1e-4), pytest.approx(0.15 + half, abs=1e-4))
    assert test.p_value == pytest.approx(0.1027, abs=1e-4)


def test_paired_t_test_interval_holds_zero_exactly_when_p_is_above_alpha():
    for diffs in ([0.1, -0.05, 0.2, 0.02, 0.07], [0.1, 0.12, 0.09, 0.11], [-0.3, -0.1, -0.2]):
        test = paired_t_test(diffs)
        assert (test.ci_low <= 0 <= test.ci_high) == (test.p_value >= 0.05)


def test_paired_t_test_degenerate_and_bad_input():
    assert paired_t_test([0.0, 0.0]).p_value == 1.0
    constant = paired_t_test([0.2, 0.2, 0.2])
    assert constant.p_value == 0.0 and math.isinf(constant.t) and constant.to_dict()["t"] == "inf"
    with pytest.raises(ValueError, match="at least 2 finite differences"):
        paired_t_test([0.1])
    with pytest.raises(ValueError, match="at least 2 finite differences"):
        paired_t_test([0.1, math.nan])


@pytest.mark.parametrize(
    ("effect", "sd", "expected"), [(0.5, 1.0, 34), (1.0, 1.0, 10), (0.8, 1.0, 15), (-0.5, 1.0, 34)]
)
def test_seeds_for_power_matches_the_paired_t_test_sample_sizes(effect, sd, expected):
    # G*Power's paired t-test (two-sided, alpha 0.05, power 0.8) gives 34, 10 and 15 pairs for d = 0.5, 1.0, 0.8
    assert seeds_for_power(effect, sd) == expected


def test_seeds_for_power_refuses_a_zero_effect_or_spread():
    with pytest.raises(ValueError, match="non-zero"):
        seeds_for_power(0.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        seeds_for_power(0.1, 0.0)


def test_normalised_auc_is_the_time_average_of_the_curve():
    assert normalised_auc([0, 10], [0.5, 0.5]) == 0.5
    assert normalised_auc([0, 5, 10, 40], [0.0, 1.0, 1.0, 1.0]) == pytest.approx((2.5 + 35) / 40)
    with pytest.raises(ValueError, match="at least two"):
        normalised_auc([0], [1.0])
    with pytest.raises(ValueError, match="must increase"):
        normalised_auc([0, 5, 5], [1.0, 1.0, 1.0])


def test_ratio_metrics_are_the_ratio_of_their_parts_and_undefined_without_a_count():
    parts = {
        "actor/dapo/clip_upper_old_prob_sum": 0.9,
        "actor/dapo/clip_upper_tokens": 3.0,
        "actor/dapo/positive_advantage_tokens": 12.0,
        "actor/dapo/clip_higher_kept_tokens": 0.0,
        "actor/dapo/clip_higher_kept_old_prob_sum": 0.0,
    }
    ratios = derive_ratios(parts)
    assert ratios["actor/dapo/clip_upper_old_prob_mean"] == pytest.approx(0.3)
    assert ratios["actor/dapo/clip_upper_positive_share"] == pytest.approx(0.25)
    assert math.isnan(ratios["actor/dapo/clip_higher_kept_old_prob_mean"])  # nothing kept: undefined, not 0
    assert derive_ratios({"actor/dapo/clip_upper_tokens": 3.0}) == {}  # a missing part: no ratio at all
    assert {part for pair in RATIO_METRICS.values() for part in pair} == RATIO_PARTS
