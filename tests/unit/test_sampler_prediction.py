"""The success predictor: its exact informative probability, the fitted prior, forgetting, ranked selection,
sizing from the predicted yield, calibration, and an exact resume."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.config import SamplerConfig
from dapo_verl.core import DropReason
from dapo_verl.sampler import BatchReplenisher, PromptStream
from dapo_verl.sampler.prediction import (
    CALIBRATION_PRIOR_GROUPS,
    MAX_CONCENTRATION,
    MIN_CONCENTRATION,
    SuccessPredictor,
    beta_prior_from_moments,
    informative_probability,
    successes,
)
from dapo_verl.sampler.simulation import SimulatedPolicy, drifting_pass_rates
from dapo_verl.sampler.sizing import predicted_request


def _integrated(alpha: float, beta: float, size: int) -> float:
    """1 - E[p^G] - E[(1-p)^G] under Beta(alpha, beta) by numerical integration (alpha, beta >= 1)."""
    p = torch.linspace(0.0, 1.0, 200_001, dtype=torch.float64)
    density = p ** (alpha - 1) * (1 - p) ** (beta - 1)
    mass = torch.trapezoid(density, p)
    informative = 1 - p**size - (1 - p) ** size
    return float(torch.trapezoid(density * informative, p) / mass)


@pytest.mark.parametrize(
    ("alpha", "beta", "size"), [(1.0, 1.0, 2), (1.0, 1.0, 16), (3.5, 1.5, 8), (20.0, 2.0, 4), (2.0, 9.0, 16)]
)
def test_informative_probability_matches_integration_over_the_belief(alpha, beta, size):
    assert informative_probability(alpha, beta, size) == pytest.approx(_integrated(alpha, beta, size), abs=1e-6)


@given(alpha=st.floats(0.01, 1e4), beta=st.floats(0.01, 1e4), size=st.integers(2, 64))
@settings(max_examples=300, deadline=None)
def test_informative_probability_is_a_probability_symmetric_in_the_outcomes(alpha, beta, size):
    q = informative_probability(alpha, beta, size)
    assert 0.0 <= q <= 1.0
    assert q == pytest.approx(informative_probability(beta, alpha, size), abs=1e-9)


def test_a_known_rate_gives_the_binomial_chance_of_a_mixed_group():
    # A belief concentrated at p = 0.3: the chance of 0 < k < 8 is 1 - 0.3^8 - 0.7^8.
    assert informative_probability(3e6, 7e6, 8) == pytest.approx(1 - 0.3**8 - 0.7**8, rel=1e-5)


@pytest.mark.parametrize(("alpha", "beta", "size"), [(2.0, 3.0, 8), (0.5, 0.5, 16), (10.0, 1.0, 4)])
def test_the_prior_is_recovered_from_the_exact_moments_of_its_groups(alpha, beta, size):
    mean = alpha / (alpha + beta)
    between = alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1))  # Var[p]
    spread = mean * (1 - mean) / size + (1 - 1 / size) * between  # Var[k / G] of a beta-binomial
    a0, b0 = beta_prior_from_moments(mean, spread + mean**2, size)
    assert (a0, b0) == (pytest.approx(alpha), pytest.approx(beta))


def test_the_prior_concentration_stays_within_its_bounds():
    # Identical prompts (no spread beyond the binomial) and a population split into solved and failed.
    a0, b0 = beta_prior_from_moments(0.5, 0.25 + 0.25 / 8, 8)
    assert a0 + b0 == pytest.approx(MAX_CONCENTRATION)
    a0, b0 = beta_prior_from_moments(0.5, 0.5, 8)
    assert a0 + b0 == pytest.approx(MIN_CONCENTRATION)


@pytest.mark.parametrize(
    "metric", [torch.tensor([1, 0, 1, 1]), torch.tensor([1.0, -1.0, 1.0, 1.0]), torch.tensor([True, False, True, True])]
)
def test_successes_counts_correct_responses_in_every_encoding(metric):
    assert successes(metric) == 3


def test_forgetting_halves_a_prompts_own_evidence_every_half_life():
    predictor = SuccessPredictor(half_life_steps=10, smoothing_groups=100)
    predictor.record(0, 8, 8)
    a0, b0 = predictor.prior()
    assert predictor.belief(0) == (pytest.approx(a0 + 8), pytest.approx(b0))
    predictor.step = 10
    assert predictor.belief(0) == (pytest.approx(a0 + 4), pytest.approx(b0))
    predictor.record(0, 0, 8)  # the old evidence enters at its decayed weight
    a0, b0 = predictor.prior()  # which the new group moved
    assert predictor.belief(0) == (pytest.approx(a0 + 4), pytest.approx(b0 + 8))
    assert predictor.belief(1) == (a0, b0)  # never seen: the population prior


def test_a_solved_prompt_is_predicted_less_informative_than_a_mixed_one_until_forgotten():
    predictor = SuccessPredictor(half_life_steps=5, smoothing_groups=50)
    for pid in range(50):
        predictor.record(pid, pid % 9, 8)  # a spread population
    predictor.record(100, 8, 8)
    predictor.record(101, 4, 8)
    solved, mixed, fresh = predictor.informative_many([100, 101, 999])
    assert solved < fresh < mixed
    predictor.step = 200  # 40 half-lives later both are back at the prior
    assert predictor.informative_many([100, 101]) == [pytest.approx(fresh, abs=1e-6)] * 2


def test_calibration_is_measured_per_bucket_and_scales_that_buckets_scores():
    predictor = SuccessPredictor(half_life_steps=10, smoothing_groups=1e9)  # no decay of the sums
    predictor.record(0, 4, 8)  # the first group: G and a prior, nothing predicted yet
    assert predictor.calibration_factors() == (1.0, 1.0) and predictor.calibration is None
    # Prompt 0's last group was informative; a prompt never seen counts with the others.
    q_after, q_fresh = predictor.informative_many([0, 5])
    predictor.taken([0, 5])  # a round takes both: their predictions now are what the calibration compares
    predictor.record(0, 8, 8)  # came back solved
    predictor.record(5, 3, 8)  # came back informative
    k = CALIBRATION_PRIOR_GROUPS
    others, after = predictor.calibration_factors()
    assert after == pytest.approx(k / (q_after + k)) and others == pytest.approx((1 + k) / (q_fresh + k))
    assert predictor.calibration == pytest.approx(1 / (q_after + q_fresh))
    # The scores apply each bucket's factor: prompt 5 is now after an informative group, prompt 0 is not.
    q0, q5 = predictor.informative_many([0, 5])
    assert predictor.scores([0, 5]) == [pytest.approx(min(1, others * q0)), pytest.approx(min(1, after * q5))]


def test_predictions_before_any_group_are_not_predictions():
    predictor = SuccessPredictor(half_life_steps=10, smoothing_groups=10)
    assert not predictor.ready and predictor.informative_many([1, 2]) == [1.0, 1.0]
    predictor.record(1, 4, 8)
    assert predictor.ready


# -- sizing ----------------------------------------------------------------------------------------------


def test_certain_predictions_need_the_missing_prompts_plus_the_calibrations_own_margin():
    assert predicted_request(SamplerConfig(single_round_probability=0.5), 5, [1.0] * 20, None) == (5, True)
    # At 0.9 the calibration factor's own error (it averages a finite number of groups) adds a margin.
    count, met = predicted_request(SamplerConfig(train_batch_size=16), 5, [1.0] * 20, None)
    assert met and 5 < count <= 7


def test_the_calibration_scales_the_predictions():
    config = SamplerConfig(train_batch_size=16, single_round_probability=0.5)  # z = 0: the mean alone
    assert predicted_request(config, 4, [0.5] * 20, None) == (8, True)
    assert predicted_request(config, 4, [0.5] * 20, 2.0) == (4, True)


def test_a_round_does_not_dilute_good_prompts_with_ones_below_the_floor():
    config = SamplerConfig(train_batch_size=16, max_oversample_factor=4.0)  # floor 0.25
    assert predicted_request(config, 8, [0.9] * 5 + [0.05] * 100, None) == (5, False)  # short: draw more first
    count, met = predicted_request(config, 2, [0.1] * 100, None)  # scarce everywhere: as many as it takes
    assert met and count > 20
    assert predicted_request(config, 50, [0.9] * 10, None) == (10, False)  # not enough: all of them
    count, met = predicted_request(config, 8, [0.9] * 5 + [0.05] * 200, None, stop_at_floor=False)
    assert met and count > 50  # the last window: as many as the probability needs


# -- ranked selection ------------------------------------------------------------------------------------


class _Fixed:
    """A scorer with fixed scores (ranking key = prediction)."""

    def __init__(self, scores: dict[int, float]) -> None:
        self.table, self.step, self.recorded = scores, 0, []

    ready = True

    def scores(self, ids):
        return [self.table[i] for i in ids]

    def rank_keys(self, ids, generator):
        return self.scores(ids)

    def evidence(self, ids):
        return [0.0 if i in self.unknown else 1.0 for i in ids]

    unknown: frozenset = frozenset()

    def record(self, prompt_id, correct, group_size):
        self.recorded.append((prompt_id, correct, group_size))

    def taken(self, ids):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_ranked_selection_takes_the_best_candidates_and_passes_over_the_rest():
    scorer = _Fixed({i: float(i % 10) for i in range(100)})
    stream = PromptStream(
        100, seed=0, skip_uninformative=True, scorer=scorer, selection_window=4.0, explore_fraction=0.0
    )
    ids, skipped = stream.take(5)
    assert skipped == 15 and stream.prompts_skipped == 15 and stream.position == 20
    drawn = stream._order[:20]
    assert sorted(scorer.table[i] for i in ids) == sorted(scorer.table[i] for i in drawn)[-5:]


def test_ranked_selection_sizes_the_round_from_the_ordered_predictions():
    scorer = _Fixed({i: 1.0 if i < 50 else 0.0 for i in range(100)})
    stream = PromptStream(
        100, seed=0, skip_uninformative=True, scorer=scorer, selection_window=4.0, explore_fraction=0.0
    )
    seen = []

    def size(scores, final):
        seen.append((scores, final))
        return 3 if final else None  # ask for more candidates until the stream can draw no more

    ids, _ = stream.take(10, size=size)
    assert len(ids) == 3 and [len(s) for s, _ in seen] == [40, 80, 100] and [f for _, f in seen] == [False] * 2 + [True]
    assert all(s == sorted(s, reverse=True) for s, _ in seen)
    # The scorer learns the group; the stream returns the prediction the prompt was taken with (for the metrics).
    assert stream.record(ids[0], DropReason.KEEP, correct=2, group_size=4) == scorer.table[ids[0]]
    assert scorer.recorded == [(ids[0], 2, 4)]


def test_exploration_looks_at_the_least_known_prompts_first():
    def generated_worst(explore, unknown):
        scorer = _Fixed({i: 0.0 if i == 0 else 1.0 for i in range(20)})
        scorer.unknown = frozenset(unknown)
        stream = PromptStream(
            20, seed=3, skip_uninformative=True, scorer=scorer, selection_window=4.0, explore_fraction=explore
        )
        return sum(stream.take(5)[0].count(0) for _ in range(400))

    assert generated_worst(0.0, {0}) == 0  # ranked last in every window: starved without exploration
    assert generated_worst(0.2, {0}) > 50  # the least known: first in line at every exploring place
    assert generated_worst(0.2, {1, 2, 3, 4, 5, 6, 7, 8}) < generated_worst(0.2, {0})  # others less known first


def test_a_pool_smaller_than_the_round_hands_out_every_prompt_some_twice():
    stream = PromptStream(5, seed=0, skip_uninformative=True, scorer=_Fixed(dict.fromkeys(range(5), 0.5)))
    ids, skipped = stream.take(8)
    assert len(ids) == 8 and set(ids) == set(range(5)) and skipped == 0


# -- in the replenisher ----------------------------------------------------------------------------------


def _sampler(seed=0, **overrides):
    config = SamplerConfig(
        **{"train_batch_size": 8, "seed": seed, "on_shortfall": "partial", "prompt_selection": "predicted", **overrides}
    )
    policy = SimulatedPolicy(
        drifting_pass_rates(300, seed=seed, start_logit_std=3.0, drift_per_step=0.05), group_size=8, seed=seed
    )
    return BatchReplenisher(config, 300, policy), policy


def _steps(sampler, policy, first, count):
    out = []
    for step in range(first, first + count):
        policy.step = step
        batch = sampler.next_batch()
        out.append(([g.prompt_id for g in batch.groups], batch.metrics))
    return out


def test_the_predictor_state_survives_a_resume_exactly():
    sampler, policy = _sampler()
    _steps(sampler, policy, 0, 25)
    plan = sampler.plan_next_round()  # a planned round and its predictions are part of the state too
    state = sampler.state_dict()
    generator = policy._gen.get_state()
    expected = _steps(sampler, policy, 25, 15)
    resumed, policy2 = _sampler()
    resumed.load_state_dict(state)
    policy2._gen.set_state(generator)
    assert resumed.plan_next_round() == plan
    assert resumed.predictor is not None and resumed.predictor.state_dict() == state["stream"]["scorer"]
    assert _steps(resumed, policy2, 25, 15) == expected


def test_prediction_metrics_are_logged_and_the_predictions_are_calibrated():
    sampler, policy = _sampler(train_batch_size=16)
    steps = _steps(sampler, policy, 0, 60)
    metrics = steps[-1][1]
    for key in (
        "predicted_keep_rate",
        "prediction_brier",
        "prediction_calibration",
        "predictor_size",
        "pool_trained_fraction",
    ):
        assert f"dapo/sampler/{key}" in metrics, key
    predicted = sum(m["dapo/sampler/predicted_keep_rate"] for _, m in steps[10:])
    observed = sum(m["dapo/sampler/keep_rate"] for _, m in steps[10:])
    assert abs(predicted - observed) / observed < 0.25  # predicted and observed informative rates agree
    assert 0 < metrics["dapo/sampler/prediction_brier"] < 0.25  # better than always predicting 1/2


def test_prediction_cuts_generation_where_prompts_differ():
    def cost(selection):
        sampler, policy = _sampler(prompt_selection=selection, revisit_informative=False)
        _steps(sampler, policy, 0, 60)
        return sampler.counters["responses_generated"] / sampler.counters["responses_trained"]

    plain = _sampler(skip_uninformative=False, revisit_informative=False, prompt_selection="streak")
    _steps(*plain, 0, 60)
    uniform = plain[0].counters["responses_generated"] / plain[0].counters["responses_trained"]
    assert cost("predicted") < 0.85 * uniform


def test_selection_settings_are_validated_with_their_key():
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups\.prompt_selection.*'guess'"):
        SamplerConfig(prompt_selection="guess")
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups\.selection_window"):
        SamplerConfig(selection_window=0.5)
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups\.explore_fraction"):
        SamplerConfig(explore_fraction=1.5)
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups\.prediction_half_life_steps"):
        SamplerConfig(prediction_half_life_steps=0)
    assert math.isfinite(SamplerConfig().prediction_half_life_steps)


@pytest.mark.parametrize("overrides", [{"skip_uninformative": False}, {"enable": False}])
def test_prediction_with_prompt_selection_off_is_refused_naming_both_keys(overrides):
    off = f"algorithm.filter_groups.{next(iter(overrides))}"
    with pytest.raises(
        ValueError,
        match=rf"prompt_selection='predicted' chooses prompts only with {off}=true, but "
        rf"{off}=false.*Set {off}=true, or drop algorithm\.filter_groups\."
        rf"prompt_selection=predicted",
    ):
        SamplerConfig(prompt_selection="predicted", **overrides)
    SamplerConfig(prompt_selection="streak", **overrides)  # the default selection stays valid with either off


# -- argument and state checks ---------------------------------------------------------------------------


def _predictor():
    return SuccessPredictor(half_life_steps=10.0, smoothing_groups=64.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"half_life_steps": 0}, ValueError, r"half_life_steps=0 must be a finite number > 0"),
        ({"half_life_steps": math.nan}, ValueError, r"half_life_steps=nan must be a finite number > 0"),
        ({"half_life_steps": "10"}, TypeError, r"half_life_steps='10' \(str\) must be a finite number"),
        ({"smoothing_groups": -1}, ValueError, r"smoothing_groups=-1 must be a finite number >= 1"),
        ({"smoothing_groups": math.inf}, ValueError, r"smoothing_groups=inf must be a finite number"),
        ({"prefer_informative": 1}, TypeError, r"prefer_informative=1 \(int\) must be True or False"),
    ],
)
def test_predictor_settings_are_checked_with_their_name(kwargs, error, words):
    with pytest.raises(error, match=words):
        SuccessPredictor(**{"half_life_steps": 10.0, "smoothing_groups": 64.0, **kwargs})


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((0, 5, 4), ValueError, r"correct=5 must be an integer in \[0, 4\]"),
        ((0, -1, 4), ValueError, r"correct=-1 must be an integer in \[0, 4\]"),
        ((0, 1, 1), ValueError, r"group_size=1 must be an integer >= 2"),  # was a ZeroDivisionError in the prior
        ((0, 0, 0), ValueError, r"group_size=0 must be an integer >= 2"),
        ((0, 2, 4.0), TypeError, r"group_size=4.0 \(float\) must be an integer >= 2"),
        ((0, 2.5, 4), TypeError, r"correct=2.5 \(float\) must be an integer"),
        ((-1, 2, 4), ValueError, r"prompt_id=-1 must be an integer >= 0"),
    ],
)
def test_a_record_that_does_not_fit_is_refused_and_changes_nothing(args, error, words):
    predictor = _predictor()
    predictor.record(3, 2, 4)
    before = predictor.state_dict()
    with pytest.raises(error, match=words):
        predictor.record(*args)
    assert predictor.state_dict() == before
    assert 0 < predictor.informative(3) < 1


@pytest.mark.parametrize(
    ("state", "error", "words"),
    [
        (None, TypeError, "the SuccessPredictor state is NoneType, not a mapping"),
        ({"bogus": 1}, ValueError, r"the SuccessPredictor state has unknown keys \['bogus'\]"),
        ({"step": -3}, ValueError, r"'step' is -3; expected an integer >= 0"),
        ({"group_size": 1}, ValueError, r"'group_size' is 1; expected an integer >= 2"),
        ({"prompts": [[0, -1.0, 2.0, 0, False]]}, ValueError, r"'prompts' is -1.0; expected a finite number >= 0"),
        ({"prompts": [[0, 1.0, 2.0]]}, ValueError, r"'prompts\[0\]' is \[0, 1.0, 2.0\]; expected a row of 5 items"),
        ({"moments": [1.0, math.nan, 0.0]}, ValueError, r"'moments\[1\]' is nan"),
        (
            {"calibration": [[0.0, 0.0]]},
            ValueError,
            r"'calibration' is \[\[0.0, 0.0\]\]; expected a list of 2 \[2 items",
        ),
        ({"taken": [[4, 0, 1.5]]}, ValueError, r"'taken' is 1.5; expected a finite number >= 0 and <= 1"),
        ({"taken": [[4, 2, 0.5]]}, ValueError, r"'taken' is 2; expected an integer in \[0, 1\]"),
    ],
)
def test_a_damaged_predictor_state_is_refused_and_the_predictor_is_unchanged(state, error, words):
    predictor = _predictor()
    predictor.record(3, 2, 4)
    predictor.taken([5])
    before = predictor.state_dict()
    with pytest.raises(error, match=words):
        predictor.load_state_dict(state)
    assert predictor.state_dict() == before


def test_a_predictor_state_round_trips_and_an_empty_one_restores_an_empty_predictor():
    predictor = _predictor()
    for pid, correct in ((1, 0), (2, 3), (1, 2)):
        predictor.record(pid, correct, 4)
    predictor.taken([2, 7])
    restored = _predictor()
    restored.load_state_dict(predictor.state_dict())
    assert restored.state_dict() == predictor.state_dict()
    restored.load_state_dict({})
    assert restored.state_dict() == _predictor().state_dict()


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((math.nan, 1.0, 8), ValueError, r"alpha=nan must be a finite number >= 0"),
        ((1.0, -0.5, 8), ValueError, r"beta=-0.5 must be a finite number >= 0"),
        ((1.0, math.inf, 8), ValueError, r"beta=inf must be a finite number >= 0"),
        ((0.0, 0.0, 8), ValueError, r"alpha=0.0 and beta=0.0: Beta\(0, 0\) is not a distribution"),
        ((1.0, 1.0, 2.5), TypeError, r"group_size=2.5 \(float\) must be an integer >= 2"),
        ((1.0, 1.0, 1), ValueError, r"group_size=1 must be an integer >= 2"),
        (("1", 1.0, 8), TypeError, r"alpha='1' \(str\) must be a finite number"),
    ],
)
def test_informative_probability_refuses_what_is_no_belief(args, error, words):
    with pytest.raises(error, match=words):
        informative_probability(*args)


def test_a_zero_beta_parameter_is_the_limit_where_no_group_is_mixed():
    assert informative_probability(0.0, 3.0, 8) == 0.0  # all belief on p = 0: every group all wrong
    assert informative_probability(3.0, 0.0, 8) == 0.0  # all belief on p = 1: every group all correct
    assert informative_probability(1e-9, 3.0, 8) < 1e-8  # and it is the limit of small parameters


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((1.5, 0.5, 8), r"mean=1.5 must be a finite number >= 0 and <= 1"),
        ((0.5, math.nan, 8), r"second_moment=nan must be a finite number"),
        ((0.5, 0.3, 1), r"group_size=1 must be an integer >= 2"),
    ],
)
def test_beta_prior_from_moments_checks_its_moments(args, words):
    with pytest.raises(ValueError, match=words):
        beta_prior_from_moments(*args)


def test_successes_refuses_a_tensor_without_values():
    with pytest.raises(ValueError, match="metric is a meta tensor"):
        successes(torch.empty(4, device="meta"))
    with pytest.raises(TypeError, match=r"metric is of dtype torch.complex64"):
        successes(torch.ones(4, dtype=torch.complex64))
    with pytest.raises(TypeError, match="metric is a list"):
        successes([1, 0])
