"""Randomised invariants of the loss, advantages and filter (hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.core import (
    dapo_loss,
    dynamic_group_mask,
    group_advantages,
    group_advantages_by_index,
)

seeds = st.integers(min_value=0, max_value=2**31 - 1)


def _batch(seed, b, length):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, length, generator=gen, dtype=torch.float64) * 3
    old = (logp + 0.5 * torch.randn(b, length, generator=gen, dtype=torch.float64)).clamp(max=0)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    mask = torch.rand(b, length, generator=gen) > 0.3
    return logp, old, adv, mask


@settings(max_examples=60, deadline=None)
@given(seed=seeds, b=st.integers(1, 8), length=st.integers(1, 12), high=st.floats(0.0, 0.5))
def test_loss_and_gradient_invariant_to_row_permutation(seed, b, length, high):
    logp, old, adv, mask = _batch(seed, b, length)
    perm = torch.randperm(b, generator=torch.Generator().manual_seed(seed))
    a = logp.clone().requires_grad_(True)
    p = logp[perm].clone().requires_grad_(True)
    loss_a = dapo_loss(a, old, adv, mask, 0.2, high)
    loss_p = dapo_loss(p, old[perm], adv[perm], mask[perm], 0.2, high)
    loss_a.backward()
    loss_p.backward()
    torch.testing.assert_close(loss_a, loss_p, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(a.grad[perm], p.grad, rtol=1e-12, atol=1e-14)


@settings(max_examples=60, deadline=None)
@given(
    seed=seeds,
    b=st.integers(1, 8),
    length=st.integers(1, 12),
    extra_rows=st.integers(0, 4),
    extra_cols=st.integers(0, 4),
    junk=st.sampled_from([0.0, -float("inf"), 1e30, float("nan")]),
)
def test_loss_invariant_to_appended_fully_masked_padding(seed, b, length, extra_rows, extra_cols, junk):
    logp, old, adv, mask = _batch(seed, b, length)
    big = torch.full((b + extra_rows, length + extra_cols), junk, dtype=torch.float64)
    big_old = big.clone()
    big[:b, :length], big_old[:b, :length] = logp, old
    big_mask = torch.zeros(big.shape, dtype=torch.bool)
    big_mask[:b, :length] = mask
    big_adv = torch.cat([adv, torch.zeros(extra_rows, dtype=torch.float64)])
    big.requires_grad_(True)
    small = logp.clone().requires_grad_(True)
    padded_loss = dapo_loss(big, big_old, big_adv, big_mask)
    loss = dapo_loss(small, old, adv, mask)
    padded_loss.backward()
    loss.backward()
    torch.testing.assert_close(padded_loss, loss, rtol=1e-12, atol=1e-14)
    assert torch.all(big.grad[~big_mask] == 0)
    torch.testing.assert_close(big.grad[:b, :length], small.grad, rtol=1e-12, atol=1e-14)


@settings(max_examples=60, deadline=None)
@given(seed=seeds, p=st.integers(1, 6), g=st.integers(2, 6), binary=st.booleans())
def test_advantages_are_permutation_equivariant_and_zero_for_uniform_groups(seed, p, g, binary):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (p, g), generator=gen).double() if binary else torch.randn(p, g, generator=gen)
    rewards = rewards.double()
    adv = group_advantages(rewards)
    keep = dynamic_group_mask(rewards)
    assert torch.all(adv[~keep] == 0)
    assert torch.all(adv[keep].abs().sum(dim=-1) > 0)
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(p, dtype=torch.float64), atol=1e-9, rtol=0)
    perm = torch.randperm(g, generator=gen)
    torch.testing.assert_close(group_advantages(rewards[:, perm]), adv[:, perm])
    labels = [i // g for i in range(p * g)]
    torch.testing.assert_close(
        group_advantages_by_index(rewards.reshape(-1), labels), adv.reshape(-1), rtol=1e-12, atol=1e-12
    )


@settings(max_examples=60, deadline=None)
@given(seed=seeds, b=st.integers(2, 10), length=st.integers(1, 8), cut=st.integers(1, 9), high=st.floats(0.0, 0.5))
def test_clipped_probability_parts_add_up_over_any_split_into_micro_batches(seed, b, length, cut, high):
    from dapo_verl.core import clip_diagnostics

    logp, old, adv, mask = _batch(seed, b, length)
    cut = min(cut, b - 1)
    whole = clip_diagnostics(logp, old, adv, mask, clip_high=high)
    parts = [
        clip_diagnostics(logp[rows], old[rows], adv[rows], mask[rows], clip_high=high)
        for rows in (slice(0, cut), slice(cut, b))
    ]
    for key in (
        "positive_advantage_tokens",
        "clip_upper_tokens",
        "clip_upper_old_prob_sum",
        "clip_higher_kept_tokens",
        "clip_higher_kept_old_prob_sum",
    ):
        torch.testing.assert_close(whole[key], parts[0][key] + parts[1][key], rtol=1e-12, atol=1e-14)
    for key in ("clip_upper_old_prob_max", "clip_higher_kept_old_prob_max"):
        assert float(whole[key]) == max(float(p[key]) for p in parts)
    assert 0 <= float(whole["clip_upper_old_prob_sum"]) <= float(whole["clip_upper_tokens"])
    assert float(whole["clip_upper_tokens"]) <= float(whole["positive_advantage_tokens"])
