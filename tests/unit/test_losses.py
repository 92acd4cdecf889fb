"""dapo_loss and friends: contract, reference formulas, gradients, padding and errors."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_verl.core import (
    LossAggregation,
    aggregate_loss,
    clip_diagnostics,
    clipped_surrogate_loss_matrix,
    clipped_surrogate_with_diagnostics,
    dapo_loss,
    group_token_mean_weights,
    policy_ratio,
)
from tools.dispatch_probes import count_host_syncs


def _batch(gen, b=6, length=9, dtype=torch.float64, spread=0.4):
    logp = (-torch.rand(b, length, generator=gen, dtype=dtype) * 3).requires_grad_(True)
    old = (logp.detach() + spread * torch.randn(b, length, generator=gen, dtype=dtype)).clamp(max=0)
    adv = torch.randn(b, generator=gen, dtype=dtype)
    lengths = torch.randint(1, length + 1, (b,), generator=gen)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    return logp, old, adv, mask


def _reference_loss(logp, old, adv, mask, low, high, c=None):
    """The paper's formula, token by token, in plain Python."""
    total, count = 0.0, 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            r = math.exp(max(-20.0, min(20.0, float(logp[i, t]) - float(old[i, t]))))
            a = float(adv[i])
            term = min(r * a, min(max(r, 1 - low), 1 + high) * a)
            loss = -term
            if c is not None and a < 0:
                loss = min(loss, -a * c)
            total += loss
            count += 1
    return total / max(count, 1)


# --- contract ----------------------------------------------------------------------------------


def test_returns_a_scalar_on_the_input_device_with_the_spec_defaults(gen):
    logp, old, adv, mask = _batch(gen, dtype=torch.float32)
    loss = dapo_loss(logp, old, adv, mask)
    assert loss.shape == ()
    assert loss.device == logp.device
    assert loss.dtype == torch.float32
    explicit = dapo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert torch.equal(loss, explicit)


def test_float64_inputs_stay_float64_and_half_precision_is_upcast(gen):
    logp, old, adv, mask = _batch(gen)
    assert dapo_loss(logp, old, adv, mask).dtype == torch.float64
    half = dapo_loss(logp.detach().bfloat16(), old.bfloat16(), adv.bfloat16(), mask)
    assert half.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_formula_on_random_inputs(gen, dtype):
    for _ in range(5):
        logp, old, adv, mask = _batch(gen, dtype=dtype)
        expected = _reference_loss(logp.detach(), old, adv, mask, 0.2, 0.28)
        actual = float(dapo_loss(logp, old, adv, mask))
        assert actual == pytest.approx(expected, rel=1e-5 if dtype == torch.float32 else 1e-12, abs=1e-7)


def test_dual_clip_matches_reference(gen):
    logp, old, adv, mask = _batch(gen, spread=2.0)
    expected = _reference_loss(logp.detach(), old, adv, mask, 0.2, 0.28, c=3.0)
    assert float(dapo_loss(logp, old, adv, mask, clip_ratio_c=3.0)) == pytest.approx(expected, rel=1e-12)


def test_bool_and_01_masks_agree(gen):
    logp, old, adv, mask = _batch(gen)
    assert torch.equal(dapo_loss(logp, old, adv, mask), dapo_loss(logp, old, adv, mask.to(torch.float64)))
    assert torch.equal(dapo_loss(logp, old, adv, mask), dapo_loss(logp, old, adv, mask.to(torch.int64)))


def test_per_token_advantages_equal_per_response_advantages(gen):
    logp, old, adv, mask = _batch(gen)
    per_token = adv.unsqueeze(-1).expand_as(logp)
    assert torch.equal(dapo_loss(logp, old, adv, mask), dapo_loss(logp, old, per_token, mask))


def test_symmetric_clip_reproduces_ppo(gen):
    logp, old, adv, mask = _batch(gen, spread=1.0)
    expected = _reference_loss(logp.detach(), old, adv, mask, 0.2, 0.2)
    assert float(dapo_loss(logp, old, adv, mask, 0.2, 0.2)) == pytest.approx(expected, rel=1e-12)


def test_inputs_are_not_modified(gen):
    logp, old, adv, mask = _batch(gen)
    copies = [t.detach().clone() for t in (logp, old, adv, mask)]
    dapo_loss(logp, old, adv, mask).backward()
    for before, after in zip(copies, (logp.detach(), old, adv, mask)):
        assert torch.equal(before, after)


# --- gradients ---------------------------------------------------------------------------------


def _grad_at_ratio(ratio, advantage, low, high):
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    dapo_loss(
        logp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64),
        torch.ones(1, 1),
        low,
        high,
    ).backward()
    return float(logp.grad)


@pytest.mark.parametrize(
    ("ratio", "advantage", "low", "high", "has_gradient"),
    [
        (1.25, 1.0, 0.2, 0.28, True),  # inside the widened upper bound: still trained
        (1.25, 1.0, 0.2, 0.20, False),  # above 1 + 0.2: clipped
        (1.30, 1.0, 0.2, 0.28, False),  # above 1 + 0.28: clipped
        (0.75, 1.0, 0.2, 0.28, True),  # below 1 with A > 0: the lower clip never acts
        (0.75, -1.0, 0.2, 0.28, False),  # below 1 - 0.2 with A < 0: clipped
        (0.85, -1.0, 0.2, 0.28, True),
        (1.40, -1.0, 0.2, 0.28, True),  # above 1 with A < 0: the upper clip never acts
    ],
)
def test_which_ratios_have_gradient(ratio, advantage, low, high, has_gradient):
    assert (_grad_at_ratio(ratio, advantage, low, high) != 0.0) is has_gradient


def test_padding_gets_exactly_zero_gradient_even_with_inf_and_huge_values(gen):
    logp, old, adv, mask = _batch(gen)
    poisoned = logp.detach().clone()
    poisoned[~mask] = -math.inf
    poisoned_old = old.clone()
    poisoned_old[~mask] = 1e30
    poisoned.requires_grad_(True)
    loss = dapo_loss(poisoned, poisoned_old, adv, mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(poisoned.grad[~mask] == 0)
    assert torch.all(torch.isfinite(poisoned.grad))
    clean = dapo_loss(logp, old, adv, mask)
    assert float(loss) == pytest.approx(float(clean), rel=1e-12)


def test_no_gradient_flows_into_old_logp_or_advantages(gen):
    logp, old, adv, mask = _batch(gen)
    old = old.clone().requires_grad_(True)
    adv = adv.clone().requires_grad_(True)
    dapo_loss(logp, old, adv, mask).backward()
    assert old.grad is None and adv.grad is None
    assert logp.grad is not None


def test_empty_mask_gives_a_differentiable_zero(gen):
    logp, old, adv, _ = _batch(gen)
    loss = dapo_loss(logp, old, adv, torch.zeros_like(logp, dtype=torch.bool))
    assert float(loss) == 0.0
    loss.backward()
    assert torch.all(logp.grad == 0)


def test_gradient_matches_reference_by_finite_differences():
    gen = torch.Generator().manual_seed(7)
    logp, old, adv, mask = _batch(gen, b=3, length=4, spread=0.1)
    dapo_loss(logp, old, adv, mask).backward()
    eps = 1e-7
    for i in range(3):
        for t in range(4):
            if not mask[i, t]:
                continue
            plus, minus = logp.detach().clone(), logp.detach().clone()
            plus[i, t] += eps
            minus[i, t] -= eps
            numeric = (
                _reference_loss(plus, old, adv, mask, 0.2, 0.28) - _reference_loss(minus, old, adv, mask, 0.2, 0.28)
            ) / (2 * eps)
            assert float(logp.grad[i, t]) == pytest.approx(numeric, abs=1e-6)


# --- aggregation -------------------------------------------------------------------------------


def test_token_mean_weighs_tokens_not_responses():
    mask = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    loss_mat = torch.where(mask, torch.tensor([[1.0], [3.0]]), 0.0)
    assert float(aggregate_loss(loss_mat, mask, "token_mean_global")) == pytest.approx((2 * 1 + 8 * 3) / 10)
    assert float(aggregate_loss(loss_mat, mask, "seq_mean_token_mean")) == pytest.approx((1 + 3) / 2)
    assert float(aggregate_loss(loss_mat, mask, "seq_mean_token_sum")) == pytest.approx((2 + 24) / 2)


def test_micro_batches_with_the_global_token_count_sum_to_the_full_batch_loss(gen):
    logp, old, adv, mask = _batch(gen, b=8)
    full = dapo_loss(logp, old, adv, mask)
    total_tokens = int(mask.sum())
    parts = sum(
        dapo_loss(logp[i : i + 3], old[i : i + 3], adv[i : i + 3], mask[i : i + 3], num_valid_tokens=total_tokens)
        for i in range(0, 8, 3)
    )
    assert float(parts) == pytest.approx(float(full), rel=1e-12)


def test_group_token_mean_averages_within_each_group_first():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    loss_mat = torch.where(mask, torch.tensor([[1.0], [4.0], [2.0], [6.0]]), 0.0)
    groups = torch.tensor([0, 0, 1, 1])
    expected = ((2 * 1 + 4 * 4) / 6 + (2 + 6) / 2) / 2
    assert float(aggregate_loss(loss_mat, mask, LossAggregation.TOKEN_MEAN_GROUP, group_index=groups)) == pytest.approx(
        expected
    )


def test_group_weights_turn_seq_mean_token_sum_into_group_token_mean(gen):
    logp, old, adv, mask = _batch(gen, b=8)
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    direct = dapo_loss(logp, old, adv, mask, aggregation="token_mean_group", group_index=groups)
    weights = group_token_mean_weights(mask, groups, dtype=torch.float64)
    loss_mat = clipped_surrogate_loss_matrix(logp, old, adv * weights, mask)
    folded = aggregate_loss(loss_mat, mask, "seq_mean_token_sum", num_sequences=8)
    assert float(folded) == pytest.approx(float(direct), rel=1e-12)


def test_unknown_aggregation_lists_the_known_ones(gen):
    logp, old, adv, mask = _batch(gen)
    with pytest.raises(ValueError, match="Unknown loss aggregation 'token-mean'.*token_mean_global"):
        dapo_loss(logp, old, adv, mask, aggregation="token-mean")


def test_group_mean_without_groups_says_what_to_pass(gen):
    logp, old, adv, mask = _batch(gen)
    with pytest.raises(ValueError, match="needs group_index"):
        dapo_loss(logp, old, adv, mask, aggregation="token_mean_group")


# --- diagnostics -------------------------------------------------------------------------------


def test_clip_fractions_partition_the_clipped_tokens():
    ratios = torch.tensor([[1.25, 1.30, 0.70, 0.90, 1.10, 5.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    logp = ratios.log()
    stats = clip_diagnostics(logp, torch.zeros_like(logp), adv, torch.ones_like(logp), clip_ratio_c=3.0)
    assert float(stats["clip_upper_fraction"]) == pytest.approx(1 / 6)  # 1.30 with A > 0
    assert float(stats["clip_lower_fraction"]) == pytest.approx(1 / 6)  # 0.70 with A < 0
    assert float(stats["dual_clip_fraction"]) == pytest.approx(1 / 6)  # 5.0 with A < 0
    assert float(stats["clip_higher_kept_fraction"]) == pytest.approx(1 / 6)  # 1.25 with A > 0
    assert float(stats["ratio_max"]) == pytest.approx(5.0)
    assert float(stats["ratio_min"]) == pytest.approx(0.7)


def test_clipped_token_probabilities_by_hand():
    # old probabilities 0.01, 0.5, 0.05, 0.9, 0.3, 0.2; ratios as in the partition test above
    old_prob = torch.tensor([[0.01, 0.5, 0.05, 0.9, 0.3, 0.2]], dtype=torch.float64)
    ratios = torch.tensor([[1.25, 1.30, 1.50, 1.10, 0.70, 1.21]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, 1.0]], dtype=torch.float64)
    old = old_prob.log()
    stats = clip_diagnostics(old + ratios.log(), old, adv, torch.ones_like(old), clip_low=0.2, clip_high=0.28)
    assert float(stats["positive_advantage_tokens"]) == 5  # every token but the A < 0 one
    assert float(stats["clip_upper_tokens"]) == 2  # r 1.30 (p 0.5) and 1.50 (p 0.05)
    assert float(stats["clip_upper_old_prob_sum"]) == pytest.approx(0.55)
    assert float(stats["clip_upper_old_prob_max"]) == pytest.approx(0.5)
    assert float(stats["clip_higher_kept_tokens"]) == 2  # r 1.25 (p 0.01) and 1.21 (p 0.2)
    assert float(stats["clip_higher_kept_old_prob_sum"]) == pytest.approx(0.21)
    assert float(stats["clip_higher_kept_old_prob_max"]) == pytest.approx(0.2)
    symmetric = clip_diagnostics(old + ratios.log(), old, adv, torch.ones_like(old), clip_low=0.2, clip_high=0.2)
    assert float(symmetric["clip_upper_tokens"]) == 4  # eps_high = eps_low: nothing is kept by clip-higher
    assert float(symmetric["clip_upper_old_prob_sum"]) == pytest.approx(0.76)
    assert float(symmetric["clip_higher_kept_tokens"]) == float(symmetric["clip_higher_kept_old_prob_max"]) == 0.0


def test_clip_diagnostics_on_empty_mask_are_neutral(gen):
    logp, old, adv, mask = _batch(gen)
    stats = clip_diagnostics(logp, old, adv, torch.zeros_like(mask))
    assert all(float(stats[k]) == 0.0 for k in stats if k.endswith("_fraction"))
    assert float(stats["ratio_mean"]) == float(stats["ratio_min"]) == float(stats["ratio_max"]) == 1.0
    assert all(float(stats[k]) == 0.0 for k in stats if "_tokens" in k or "_old_prob_" in k)  # no NaN


def _reference_diagnostics(logp, old, adv, mask, low, high, c):
    """The diagnostics the straightforward way: boolean indexing of the valid tokens."""
    ratio = torch.exp((logp - old).clamp(-20, 20))[mask]
    adv = adv.unsqueeze(-1).expand_as(logp)[mask]
    pos, neg = adv > 0, adv < 0
    share = lambda hits: float(hits.sum()) / max(int(mask.sum()), 1)  # noqa: E731
    return {
        "clip_upper_fraction": share(pos & (ratio > 1 + high)),
        "clip_lower_fraction": share(neg & (ratio < 1 - low)),
        "dual_clip_fraction": share(neg & (ratio > c)) if c is not None else 0.0,
        "clip_higher_kept_fraction": share(pos & (ratio > 1 + low) & (ratio <= 1 + high)),
        "ratio_mean": float(ratio.mean()) if ratio.numel() else 1.0,
        "ratio_min": float(ratio.min()) if ratio.numel() else 1.0,
        "ratio_max": float(ratio.max()) if ratio.numel() else 1.0,
        "approx_kl": -float((logp - old).clamp(-20, 20)[mask].sum()) / max(int(mask.sum()), 1),
        **_reference_probabilities(
            old.clamp(max=0).exp()[mask], pos, pos & (ratio > 1 + high), pos & (ratio > 1 + low) & (ratio <= 1 + high)
        ),
    }


def _reference_probabilities(prob, positive, upper, kept):
    """Counts, sums and maxima of the old-policy probabilities, by boolean indexing."""

    def stats(name, hits):
        chosen = prob[hits]
        return {
            f"{name}_tokens": float(hits.sum()),
            f"{name}_old_prob_sum": float(chosen.sum()),
            f"{name}_old_prob_max": float(chosen.max()) if chosen.numel() else 0.0,
        }

    return {
        "positive_advantage_tokens": float(positive.sum()),
        **stats("clip_upper", upper),
        **stats("clip_higher_kept", kept),
    }


@pytest.mark.parametrize(("low", "high", "c"), [(0.2, 0.28, None), (0.2, 0.28, 3.0), (0.3, 0.1, 1.5), (0.0, 0.0, 2.0)])
def test_clip_diagnostics_equal_boolean_indexing_of_the_valid_tokens(gen, low, high, c):
    for _ in range(4):
        logp, old, adv, mask = _batch(gen, b=7, length=11, spread=1.0)
        adv[0] = 0.0  # a zero-advantage response counts as a token, never as clipped
        expected = _reference_diagnostics(logp.detach(), old, adv, mask, low, high, c)
        stats = clip_diagnostics(logp, old, adv, mask, clip_low=low, clip_high=high, clip_ratio_c=c)
        assert set(stats) == set(expected)
        for key, value in expected.items():
            assert float(stats[key]) == pytest.approx(value, rel=1e-12, abs=1e-15), key
        tokens = int(mask.sum())  # the counts are the clip fractions' numerators
        assert float(stats["clip_upper_tokens"]) == pytest.approx(float(stats["clip_upper_fraction"]) * tokens)
        assert float(stats["clip_higher_kept_tokens"]) == pytest.approx(
            float(stats["clip_higher_kept_fraction"]) * tokens
        )


def test_loss_and_diagnostics_in_one_pass_equal_the_separate_functions(gen):
    logp, old, adv, mask = _batch(gen, spread=1.0)
    together = clipped_surrogate_with_diagnostics(logp, old, adv, mask, clip_ratio_c=3.0)
    assert torch.equal(together.loss_matrix, clipped_surrogate_loss_matrix(logp, old, adv, mask, clip_ratio_c=3.0))
    apart = clip_diagnostics(logp, old, adv, mask, clip_ratio_c=3.0)
    assert {k: float(v) for k, v in together.diagnostics.items()} == {k: float(v) for k, v in apart.items()}
    assert not any(v.requires_grad for v in together.diagnostics.values())


def test_nan_and_inf_on_padding_give_the_clean_result_and_zero_gradient(gen):
    logp, old, adv, mask = _batch(gen, spread=1.0)
    per_token = adv.unsqueeze(-1).expand_as(logp).clone()
    clean = clipped_surrogate_with_diagnostics(logp, old, per_token, mask, clip_ratio_c=3.0)
    poisoned = logp.detach().clone()
    poisoned[~mask] = math.nan
    poisoned_old = old.clone()
    poisoned_old[~mask] = math.inf
    per_token[~mask] = -math.inf
    poisoned.requires_grad_(True)
    dirty = clipped_surrogate_with_diagnostics(poisoned, poisoned_old, per_token, mask, clip_ratio_c=3.0)
    assert torch.equal(dirty.loss_matrix, clean.loss_matrix)
    assert {k: float(v) for k, v in dirty.diagnostics.items()} == {k: float(v) for k, v in clean.diagnostics.items()}
    dirty.loss_matrix.sum().backward()
    assert torch.all(poisoned.grad[~mask] == 0) and torch.isfinite(poisoned.grad).all()


def test_equal_infinities_at_a_valid_position_are_refused(gen):
    logp, old, adv, mask = _batch(gen)
    both = logp.detach().clone()
    both[0, 0], old[0, 0] = -math.inf, -math.inf
    with pytest.raises(ValueError, match=r"logp is -inf at index \(0, 0\), a valid token"):
        dapo_loss(both, old, adv, mask)


@pytest.mark.parametrize("value", [math.inf, -math.inf])
@pytest.mark.parametrize("name", ["logp", "old_logp"])
def test_an_infinite_log_prob_on_a_valid_token_is_refused_and_on_padding_ignored(gen, name, value):
    logp, old, adv, mask = _batch(gen)
    tensors = {"logp": logp.detach().clone(), "old_logp": old.clone()}
    valid, padded = mask.nonzero()[0].tolist(), (~mask).nonzero()[0].tolist()
    tensors[name][tuple(valid)] = value
    with pytest.raises(ValueError, match=rf"^{name} is {value} at index \({valid[0]}, {valid[1]}\), a valid token"):
        dapo_loss(tensors["logp"], tensors["old_logp"], adv, mask)
    with pytest.raises(ValueError, match=rf"^{name} is {value}"):
        clip_diagnostics(tensors["logp"], tensors["old_logp"], adv, mask)
    tensors = {"logp": logp.detach().clone(), "old_logp": old.clone()}
    tensors[name][tuple(padded)] = value
    reference = dapo_loss(logp.detach(), old, adv, mask)
    assert torch.equal(dapo_loss(tensors["logp"], tensors["old_logp"], adv, mask), reference)


@pytest.mark.parametrize(("high", "dual"), [(1e308, None), (0.28, 1e308), (1e9, 5e8)])
def test_clip_bounds_beyond_the_largest_ratio_never_bind_and_never_overflow(gen, high, dual):
    logp, old, adv, mask = _batch(gen, dtype=torch.float32)
    loose = clipped_surrogate_with_diagnostics(logp, old, adv, mask, clip_high=high, clip_ratio_c=dual)
    held = clipped_surrogate_with_diagnostics(
        logp,
        old,
        adv,
        mask,
        clip_high=min(high, math.exp(20)),
        clip_ratio_c=None if dual is None else min(dual, math.exp(20)),
    )
    assert torch.equal(loose.loss_matrix, held.loss_matrix)
    assert loose.diagnostics == held.diagnostics


def test_one_host_synchronisation_per_call_and_no_boolean_indexing(gen):
    logp, old, adv, mask = _batch(gen, dtype=torch.float32)
    for call in (
        lambda: dapo_loss(logp, old, adv, mask.long(), num_valid_tokens=torch.tensor(100)),
        lambda: clipped_surrogate_with_diagnostics(logp, old, adv, mask, clip_ratio_c=3.0),
        lambda: clip_diagnostics(logp, old, adv, mask.float()),
        lambda: policy_ratio(logp, old, mask),
    ):
        with count_host_syncs() as syncs:
            call()
        assert syncs == ["Tensor.tolist"]


def test_policy_ratio_is_one_on_padding(gen):
    logp, old, _, mask = _batch(gen)
    ratio = policy_ratio(logp, old, mask)
    assert torch.all(ratio[~mask] == 1)


# --- errors ------------------------------------------------------------------------------------


def test_mismatched_shapes_name_both_shapes(gen):
    logp, old, adv, mask = _batch(gen)
    with pytest.raises(ValueError, match=r"logp has shape \(6, 9\) but mask has shape \(6, 8\)"):
        dapo_loss(logp, old, adv, mask[:, :8])
    with pytest.raises(ValueError, match=r"advantages has shape \(5,\) but logp has 6 rows"):
        dapo_loss(logp, old, adv[:5], mask)
    with pytest.raises(ValueError, match=r"logp has shape .* but old_logp has shape"):
        dapo_loss(logp, old[:, :3], adv, mask)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_low": -0.1}, "clip_low=-0.1 must be >= 0.0"),
        ({"clip_low": 1.5}, "clip_low=1.5 must be <= 1.0"),
        ({"clip_high": -0.2}, "clip_high=-0.2 must be >= 0.0"),
        ({"clip_high": float("nan")}, "clip_high=nan is not finite"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c=1.0 must be > 1.0"),
    ],
)
def test_bad_clip_widths_are_rejected(gen, kwargs, match):
    logp, old, adv, mask = _batch(gen)
    with pytest.raises(ValueError, match=match):
        dapo_loss(logp, old, adv, mask, **kwargs)


def test_nan_at_a_valid_position_is_an_error_but_not_on_padding(gen):
    logp, old, adv, mask = _batch(gen)
    bad = logp.detach().clone()
    bad[~mask] = math.nan
    dapo_loss(bad, old, adv, mask)  # NaN only on padding: fine
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"logp contains NaN \(first at index \(0, 0\)"):
        dapo_loss(bad, old, adv, mask)
    bad_adv = adv.clone()
    bad_adv[1] = math.inf
    with pytest.raises(ValueError, match="advantages contains NaN or inf"):
        dapo_loss(logp, old, bad_adv, mask)


def test_type_errors_name_the_argument(gen):
    logp, old, adv, mask = _batch(gen)
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        dapo_loss(logp, old, adv, mask.tolist())
    with pytest.raises(TypeError, match="logp has dtype torch.int64"):
        dapo_loss(torch.zeros(6, 9, dtype=torch.int64), old, adv, mask)


def test_non_binary_mask_is_rejected(gen):
    logp, old, adv, mask = _batch(gen)
    with pytest.raises(ValueError, match="mask has values other than 0 and 1"):
        dapo_loss(logp, old, adv, mask.to(torch.float64) * 0.5)


def test_wrong_ndim_is_rejected(gen):
    logp, old, adv, mask = _batch(gen)
    with pytest.raises(ValueError, match=r"logp has shape \(54,\) but must be \(B, L\)"):
        dapo_loss(logp.reshape(-1), old, adv, mask)


# --- token counts and overflow -----------------------------------------------------------------


def _twenty_tokens(advantage=1.0, dtype=torch.float32):
    logp = torch.full((1, 20), 0.1, dtype=dtype, requires_grad=True)
    return logp, torch.zeros(1, 20, dtype=dtype), torch.tensor([advantage], dtype=dtype), torch.ones(1, 20)


@pytest.mark.parametrize(
    ("count", "match"),
    [
        (torch.tensor(math.nan), r"num_valid_tokens=nan is not a finite number"),
        (torch.tensor(math.inf), r"num_valid_tokens=inf is not a finite number"),
        (0, r"num_valid_tokens=0 is smaller than the 20 valid tokens"),
        (torch.tensor(0), r"num_valid_tokens=0 is smaller than the 20 valid tokens"),
        (19, r"num_valid_tokens=19 is smaller than the 20 valid tokens"),
        (20.5, r"num_valid_tokens=20.5 is not a whole number"),
        (torch.tensor(20.5), r"num_valid_tokens=20.5 is not a whole number"),
        (torch.tensor([20, 20]), r"num_valid_tokens has shape \(2,\) but must be a single number"),
    ],
)
def test_bad_num_valid_tokens_is_refused_with_the_value_and_the_fix(count, match):
    logp, old, adv, mask = _twenty_tokens()
    with pytest.raises(ValueError, match=match) as info:
        dapo_loss(logp, old, adv, mask, num_valid_tokens=count)
    assert "whole mini-batch" in str(info.value)  # says what to pass instead


def test_num_valid_tokens_as_int_float_or_tensor_divides_the_token_sum():
    logp, old, adv, mask = _twenty_tokens()
    per_token = float(dapo_loss(logp, old, adv, mask))
    for count in (40, 40.0, torch.tensor(40), torch.tensor(40.0)):
        assert float(dapo_loss(logp, old, adv, mask, num_valid_tokens=count)) == pytest.approx(per_token / 2)


def test_zero_valid_tokens_is_accepted_for_an_empty_mask():
    logp, old, adv, mask = _twenty_tokens()
    loss = dapo_loss(logp, old, adv, torch.zeros_like(mask), num_valid_tokens=0)
    assert float(loss) == 0.0
    loss.backward()
    assert torch.all(logp.grad == 0)


def test_bad_num_sequences_is_refused_like_num_valid_tokens(gen):
    logp, old, adv, mask = _batch(gen)
    loss_mat = clipped_surrogate_loss_matrix(logp, old, adv, mask)
    with pytest.raises(ValueError, match=r"num_sequences=2 is smaller than the 6 non-empty responses"):
        aggregate_loss(loss_mat, mask, "seq_mean_token_mean", num_sequences=2)


@pytest.mark.parametrize("advantage", [1e38, -1e38, 3e38, -3e38])
def test_advantages_beyond_float32_are_refused_instead_of_an_inf_loss(advantage):
    logp, old, adv, mask = _twenty_tokens(advantage)
    with pytest.raises(ValueError, match=r"advantages .* overflow float32.*float64"):
        dapo_loss(logp, old, adv, mask)
    with pytest.raises(ValueError, match=r"advantages .* overflow float32"):
        clipped_surrogate_loss_matrix(logp, old, adv, mask)


@pytest.mark.parametrize("advantage", [1e38, -1e38, 1e300])
def test_huge_advantages_in_float64_give_a_finite_exact_loss_and_gradient(advantage):
    logp, old, adv, mask = _twenty_tokens(advantage, dtype=torch.float64)
    loss = dapo_loss(logp, old, adv, mask)
    loss.backward()
    expected = _reference_loss(logp.detach(), old, adv, mask, 0.2, 0.28)
    assert math.isfinite(float(loss)) and float(loss) == pytest.approx(expected, rel=1e-12)
    assert torch.isfinite(logp.grad).all()


def test_large_but_representable_float32_advantages_still_train():
    logp, old, adv, mask = _twenty_tokens(1e36)
    loss = dapo_loss(logp, old, adv, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


def test_meta_tensors_are_refused_before_any_value_is_read():
    logp, old, adv, mask = _twenty_tokens()
    with pytest.raises(ValueError, match=r"logp is a meta tensor \(shape \(1, 20\), no data\).*materialized"):
        dapo_loss(torch.empty(1, 20, device="meta"), old, adv, mask)
    with pytest.raises(ValueError, match=r"num_valid_tokens is a meta tensor .*materialized CPU or GPU tensor"):
        dapo_loss(logp, old, adv, mask, num_valid_tokens=torch.empty((), device="meta"))
    with pytest.raises(TypeError, match=r"num_valid_tokens has dtype torch.complex64 but must be a real number"):
        dapo_loss(logp, old, adv, mask, num_valid_tokens=torch.tensor(20 + 0j))
