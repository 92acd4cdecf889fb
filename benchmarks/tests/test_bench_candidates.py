"""benchmarks/candidates.py: the logit-belief predictor's quadratures, its update, its fitted drift and training
shift, and its exact resume."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.candidates import (
    LogitBeliefPredictor,
    _update,
    candidate_sampler,
    hermite_gauss,
    informative_under_normal,
    logit_moments,
)
from dapo_verl.config import SamplerConfig
from dapo_verl.sampler.simulation import SimulatedPolicy

GRID = torch.linspace(-150, 150, 1_500_001, dtype=torch.float64)  # logits, for exact integrals by the trapezoid rule


def _normal(mean: float, var: float) -> torch.Tensor:
    return torch.exp(-((GRID - mean) ** 2) / (2 * var)) / math.sqrt(2 * math.pi * var)


def test_hermite_gauss_integrates_polynomials_exactly():
    nodes, weights = hermite_gauss(6)
    assert float(weights.sum()) == pytest.approx(math.sqrt(math.pi))  # integral of exp(-x^2)
    assert float((weights * nodes**2).sum()) == pytest.approx(math.sqrt(math.pi) / 2)
    assert float((weights * nodes**10).sum()) == pytest.approx(945 * math.sqrt(math.pi) / 32)  # degree 2n - 2


@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 1.0), (0.3, 0.2), (5.0, 2.0)])
def test_logit_moments_are_those_of_logit_p_under_the_beta(alpha, beta):
    log_sig = torch.nn.functional.logsigmoid
    log_density = (
        alpha * log_sig(GRID)
        + beta * log_sig(-GRID)  # Beta density in p, times dp/dlogit = p(1-p)
        - (math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta))
    )
    density = torch.exp(log_density)
    mean = float(torch.trapezoid(GRID * density, GRID))
    var = float(torch.trapezoid((GRID - mean) ** 2 * density, GRID))
    assert logit_moments(alpha, beta) == (pytest.approx(mean, abs=1e-4), pytest.approx(var, rel=1e-4))


@pytest.mark.parametrize(("mean", "var"), [(0.0, 0.1), (-3.0, 4.0), (2.5, 1.0), (-1.0, 0.5)])
def test_informative_chance_matches_the_integral_over_the_normal_belief(mean, var):
    p = torch.sigmoid(GRID)
    exact = float(torch.trapezoid((1 - p**16 - (1 - p) ** 16) * _normal(mean, var), GRID))
    assert informative_under_normal([mean], [var], 16)[0] == pytest.approx(exact, abs=0.015)  # 6 nodes: coarse


@pytest.mark.parametrize(("mean", "var", "correct"), [(0.0, 1.0, 5), (-1.5, 16.0, 0), (2.0, 9.0, 16), (-4, 2.0, 1)])
def test_the_update_keeps_the_exact_posterior_mean_and_variance(mean, var, correct):
    log_post = (
        correct * torch.nn.functional.logsigmoid(GRID)
        + (16 - correct) * torch.nn.functional.logsigmoid(-GRID)
        - (GRID - mean) ** 2 / (2 * var)
    )
    weight = torch.exp(log_post - log_post.max())
    weight /= torch.trapezoid(weight, GRID)
    exact_mean = float(torch.trapezoid(GRID * weight, GRID))
    exact_var = float(torch.trapezoid((GRID - exact_mean) ** 2 * weight, GRID))
    new_mean, new_var = _update(mean, var, correct, 16)
    assert new_mean == pytest.approx(exact_mean, abs=0.02)
    assert new_var == pytest.approx(exact_var, rel=0.05)


def _learn(delta: float, eta: float, seed: int = 0) -> LogitBeliefPredictor:  # 10k groups, about 2 s
    """Feed the predictor groups of prompts whose logit is theta_i + eta t + delta (trainings of the prompt)."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(400, generator=gen, dtype=torch.float64) * 2.0 - 1.0
    trainings = torch.zeros(400, dtype=torch.float64)
    predictor = LogitBeliefPredictor(half_life_steps=10.0, smoothing_groups=256.0)
    for step in range(1, 151):
        predictor.step = step
        chosen = torch.randperm(400, generator=gen)[:64]
        logits = theta[chosen] + eta * step + delta * trainings[chosen]
        correct = torch.binomial(torch.full((64,), 16.0, dtype=torch.float64), torch.sigmoid(logits), generator=gen)
        for pid, k in zip(chosen.tolist(), correct.long().tolist()):
            predictor.record(pid, k, 16)
            if 0 < k < 16:
                trainings[pid] += 1  # trained after this step, as the sampler's batches are
    return predictor


def test_the_fitted_training_shift_separates_training_from_drift():
    frozen, learning = _learn(delta=0.0, eta=0.02), _learn(delta=0.8, eta=0.0)
    assert abs(frozen.train_shift) < 0.15
    assert frozen.drift == pytest.approx(0.02, abs=0.015)
    assert 0.3 < learning.train_shift < 1.2  # biased (0.44 here for 0.8), but clear of the frozen run's
    assert abs(learning.drift) < 0.05  # the drift absorbs a little of the training effect (0.023 here)


def test_the_lookahead_key_ranks_a_prompt_training_keeps_informative_above_one_it_solves():
    predictor = LogitBeliefPredictor(half_life_steps=10.0, smoothing_groups=256.0, lookahead=True)
    predictor.group_size, predictor.train_shift = 16, 1.5
    # Equal chances now (a success rate of about 0.1 or 0.9 in logits +-2.2); one training moves both up by 1.5.
    hard, easy = predictor._keys([-2.2, 2.2], [0.05, 0.05], 16)
    q = informative_under_normal([-2.2], [0.05], 16)[0]
    assert q == pytest.approx(informative_under_normal([2.2], [0.05], 16)[0])
    q_hard_next, q_easy_next = informative_under_normal([-0.7, 3.7], [0.05, 0.05], 16)
    assert hard == pytest.approx(q * (1 + q_hard_next - q)) and easy == pytest.approx(q * (1 + q_easy_next - q))
    assert hard > q > easy  # the hard prompt stays informative after training, the easy one is solved by it
    predictor.lookahead = False
    assert predictor._keys([-2.2, 2.2], [0.05, 0.05], 16) == pytest.approx([q, q])


@pytest.mark.parametrize("name", ["logit_belief", "logit_lookahead"])
def test_a_run_resumed_from_the_candidates_state_continues_identically(name):
    config = SamplerConfig(train_batch_size=8, seed=3, on_shortfall="partial")
    rates = torch.linspace(-4, 4, 64).sigmoid().tolist()

    def sampler():
        policy = SimulatedPolicy(lambda pid, step: rates[pid], group_size=8, seed=3)
        return candidate_sampler(name, config, 64, policy), policy

    first, policy = sampler()
    for _ in range(6):
        first.next_batch()
    state = first.state_dict()
    second, second_policy = sampler()
    second.load_state_dict(state)
    assert second.predictor.state_dict() == first.predictor.state_dict()
    assert second.predictor.lookahead == first.predictor.lookahead == (name == "logit_lookahead")
    assert second.predictor.train_shift == first.predictor.train_shift != 0.0
    second_policy._gen.set_state(policy._gen.get_state())  # the simulated model's draws continue where they were
    for _ in range(4):
        assert [g.prompt_id for g in second.next_batch().groups] == [g.prompt_id for g in first.next_batch().groups]


def test_an_unknown_candidate_is_refused_by_name():
    with pytest.raises(ValueError, match="Unknown candidate 'nope'"):
        candidate_sampler("nope", SamplerConfig(train_batch_size=4), 16, lambda ids: [])
