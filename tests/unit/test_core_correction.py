"""Token-level truncated importance weights against verl's own rollout correction, and their input checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.core import truncated_importance_weights

rollout_corr = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason="verl is a test dependency")


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 9),
    spread=st.floats(0.01, 30.0),
    threshold=st.floats(0.1, 10.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_weights_equal_verls_token_level_rollout_correction(rows, cols, spread, threshold, seed):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, cols, generator=gen) * spread
    rollout = -torch.rand(rows, cols, generator=gen) * spread
    mask = torch.rand(rows, cols, generator=gen) < 0.7
    mask[0, 0] = True  # verl's metrics refuse a batch without a response token (ours gives zeros)
    ours = truncated_importance_weights(old, rollout, mask, threshold=threshold)
    theirs, _ = rollout_corr.compute_rollout_correction_weights(
        old - rollout, mask.float(), rollout_is="token", rollout_is_threshold=threshold
    )
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    assert not ours.requires_grad and bool((ours[~mask] == 0).all()) and bool((ours <= threshold).all())


def test_a_response_sampled_by_the_current_policy_weighs_one_and_padding_may_hold_anything():
    logp = torch.tensor([[-0.5, -1.0, float("nan")], [-2.0, float("-inf"), 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    weights = truncated_importance_weights(logp, logp.clone(), mask)
    assert weights.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert truncated_importance_weights(logp, logp, torch.zeros(2, 3, dtype=torch.bool)).tolist() == [[0.0] * 3] * 2


def test_an_older_token_more_likely_now_is_capped_and_one_less_likely_is_weighed_down():
    old = torch.log(torch.tensor([[0.9, 0.1, 0.5]]))
    rollout = torch.log(torch.tensor([[0.3, 0.4, 0.5]]))
    weights = truncated_importance_weights(old, rollout, torch.ones(1, 3, dtype=torch.bool), threshold=2.0)
    assert weights[0].tolist() == pytest.approx([2.0, 0.25, 1.0])  # 3 capped at 2


@pytest.mark.parametrize("threshold", [0.0, -1.0, float("inf"), float("nan"), True, "2"])
def test_a_threshold_that_is_not_a_positive_number_is_refused(threshold):
    logp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"threshold=.*positive finite number; verl's default"):
        truncated_importance_weights(logp, logp, torch.ones(1, 2), threshold=threshold)


def test_bad_inputs_name_the_argument():
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"old_logp has shape \(2, 3\).*rollout_logp|rollout_logp.*\(2, 4\)"):
        truncated_importance_weights(logp, torch.zeros(2, 4), mask)
    with pytest.raises(ValueError, match="rollout_logp.*NaN or inf"):
        truncated_importance_weights(logp, torch.tensor([[0.0, float("nan"), 0.0]] * 2), mask)
    with pytest.raises(ValueError, match="mask"):
        truncated_importance_weights(logp, logp, torch.full((2, 3), 2.0))
