"""The oracles of ``benchmarks/oracle.py``: exact pass rates against sampled responses, their ranking keys, and a
short local run through each."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.oracle import ORACLES, SKIP_BELOW, OraclePredictor, exact_pass_rates, oracle_sampler
from dapo_verl.config import OverlongConfig, SamplerConfig
from dapo_verl.local.config import ModelConfig
from dapo_verl.local.model import load_or_build
from dapo_verl.local.rollout import Rollout
from dapo_verl.local.tasks import make_task

PROMPTS = list(range(0, 9800, 700))  # 14 prompts with different answers


@pytest.fixture(scope="module")
def sharp_rollout(tmp_path_factory):
    """A tiny policy taught a few of :data:`PROMPTS`' answers by a few supervised steps, so that pass rates differ
    widely between prompts; one rollout samples 2,000 responses per prompt."""
    task = make_task("copy3", heldout_size=200, seed=0)
    model, tokenizer, _, _ = load_or_build(
        ModelConfig(), max_positions=16, seed=1, cache_dir=tmp_path_factory.mktemp("cache")
    )
    rollout = Rollout(
        model,
        tokenizer,
        task,
        n=2000,
        temperature=0.8,
        max_response_length=3,
        overlong=OverlongConfig(overlong_reward_penalty=False),
        device=torch.device("cpu"),
    )
    taught = torch.as_tensor(PROMPTS[:4])
    inputs = torch.cat([rollout.train_prompts[taught], rollout.train_answers[taught]], dim=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(8):
        logits = model(input_ids=inputs).logits[:, -2]  # the answer's position
        loss = torch.nn.functional.cross_entropy(logits, rollout.train_answers[taught, 0])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return rollout


def test_exact_pass_rates_are_the_sampled_correct_rate(sharp_rollout):
    ids = PROMPTS
    exact = exact_pass_rates(sharp_rollout, ids)
    torch.manual_seed(0)
    sampled = [group.metric.float().mean().item() for group in sharp_rollout(ids)]
    assert max(exact) - min(exact) > 0.3  # the check spans rates far apart, not one value
    for p, rate in zip(exact, sampled):
        sd = math.sqrt(max(p * (1 - p), 1e-4) / sharp_rollout.n)
        assert abs(rate - p) < 5 * sd + 1e-3, (p, rate)


def test_exact_pass_rates_leave_the_policy_in_its_mode(sharp_rollout):
    sharp_rollout.model.train()
    exact_pass_rates(sharp_rollout, [0, 1])
    assert sharp_rollout.model.training


def _predictor(rates, cap):
    table = dict(enumerate(rates))
    return OraclePredictor(lambda ids: [table[i] for i in ids], group_size=8, smoothing_groups=10.0, cap=cap)


def test_scores_are_the_exact_informative_chances_and_keys_are_capped_as_named():
    rates = [0.0, 0.5, 0.9, 0.999, 0.2]
    chances = [1 - p**8 - (1 - p) ** 8 for p in rates]
    generator = torch.Generator()
    assert _predictor(rates, None).scores(range(5)) == pytest.approx(chances)
    assert _predictor(rates, None).rank_keys(range(5), generator) == pytest.approx(chances)
    mean = sum(chances) / 5
    assert _predictor(rates, "mean").rank_keys(range(5), generator) == pytest.approx([min(q, mean) for q in chances])
    skip = _predictor(rates, SKIP_BELOW).rank_keys(range(5), generator)
    assert skip == pytest.approx([0.0, SKIP_BELOW, SKIP_BELOW, chances[3], SKIP_BELOW])
    assert chances[3] < SKIP_BELOW  # the nearly solved prompt ranks below every informative one, the failed one last


def test_the_oracle_has_no_state_to_resume_and_refuses_a_bad_cap():
    with pytest.raises(NotImplementedError, match="no state to resume"):
        _predictor([0.5], None).state_dict()
    with pytest.raises(ValueError, match="cap='max'"):
        _predictor([0.5], "max")
    with pytest.raises(ValueError, match="cap=1.5"):
        _predictor([0.5], 1.5)


def test_the_oracle_needs_the_local_rollout_and_a_known_name():
    config = SamplerConfig(train_batch_size=4, gen_batch_size=8)
    with pytest.raises(TypeError, match="local backend's Rollout"):
        oracle_sampler("oracle", config, 10, lambda ids: [])
    with pytest.raises(ValueError, match="Unknown oracle 'oracle_x'"):
        oracle_sampler("oracle_x", config, 10, lambda ids: [])


@pytest.mark.parametrize("name", ORACLES)
def test_each_oracle_trains_through_the_local_run_and_logs_its_calibration(name, tmp_path):
    from benchmarks.bench_local import _train

    out = _train((name, 0, 6, "cpu", str(tmp_path / "cache"), str(tmp_path / "run"), ("trainer.test_freq=200",)))
    assert out["steps"] == 6 and out["predicted"]
    assert out["responses_trained"] > 0
    history = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "calibration" in line]
    assert history  # the replenisher logged its calibration of the oracle's predictions
