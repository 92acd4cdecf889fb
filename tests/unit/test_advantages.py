"""Group-normalised advantages: reference formula, verl conventions, zero-spread groups and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dapo_verl.core import group_advantages, group_advantages_by_index, group_ids_from_index


def _reference(rows, eps, scale):
    out = []
    for row in rows:
        mean = sum(row) / len(row)
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / (len(row) - 1))
        out.append([0.0 if max(row) == min(row) else (r - mean) / ((std + eps) if scale else 1.0) for r in row])
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [True, False])
def test_grouped_form_matches_reference(gen, dtype, scale):
    rewards = torch.randint(0, 2, (7, 5), generator=gen).to(dtype) * 2 - 1
    rewards[0] += torch.rand(5, generator=gen, dtype=dtype)  # one non-binary row
    expected = torch.tensor(_reference(rewards.tolist(), 1e-6, scale), dtype=dtype)
    actual = group_advantages(rewards, scale_by_std=scale)
    assert actual.dtype == dtype and actual.shape == (7, 5)
    torch.testing.assert_close(actual, expected, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)


def test_zero_spread_groups_get_exactly_zero():
    rewards = torch.tensor([[0.3, 0.3, 0.3], [1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    assert torch.all(group_advantages(rewards) == 0)
    flat = rewards.reshape(-1)
    assert torch.all(group_advantages_by_index(flat, [0, 0, 0, 1, 1, 1, 2, 2, 2]) == 0)


def test_flat_form_equals_grouped_form_with_interleaved_labels(gen):
    rewards = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    grouped = group_advantages(rewards)
    order = torch.randperm(24, generator=gen)
    labels = np.array([f"uid-{i // 6}" for i in range(24)], dtype=object)[order.numpy()]
    flat = group_advantages_by_index(rewards.reshape(-1)[order], labels)
    torch.testing.assert_close(flat, grouped.reshape(-1)[order], rtol=1e-12, atol=1e-12)


def test_singleton_group_follows_verl_mean0_std1_convention():
    adv = group_advantages_by_index(torch.tensor([2.0, 1.0, 0.0]), ["solo", "pair", "pair"], eps=1e-6)
    assert float(adv[0]) == pytest.approx(2.0 / (1 + 1e-6))
    assert float(adv[1]) == pytest.approx(-float(adv[2]))


def test_eps_and_no_std_variant():
    rewards = torch.tensor([[1.0, 0.0]])
    assert float(group_advantages(rewards, eps=0.0)[0, 0]) == pytest.approx(1 / math.sqrt(2))
    assert float(group_advantages(rewards, eps=1.0)[0, 0]) == pytest.approx(0.5 / (math.sqrt(0.5) + 1))
    assert float(group_advantages(rewards, scale_by_std=False)[0, 0]) == pytest.approx(0.5)


def test_group_ids_are_dense_in_order_of_first_appearance():
    ids, n = group_ids_from_index(["b", "a", "b", "c"], 4)
    assert ids.tolist() == [0, 1, 0, 2] and n == 3
    ids, n = group_ids_from_index(torch.tensor([7, 7, 3]), 3)
    assert ids.tolist() == [0, 0, 1] and n == 2


@pytest.mark.parametrize(
    ("rewards", "error", "match"),
    [
        (torch.zeros(3), ValueError, r"rewards has shape \(3,\) but must be \(P, G\)"),
        (torch.zeros(3, 1), ValueError, "G=1, but a group-normalised advantage needs G >= 2"),
        (torch.tensor([[1.0, math.nan]]), ValueError, r"rewards contains NaN or inf \(first at index \(0, 1\)"),
        (torch.tensor([[1.0, math.inf]]), ValueError, "rewards contains NaN or inf"),
        (torch.tensor([[1, 0]]), TypeError, "rewards has dtype torch.int64 but must be floating point"),
        ([[1.0, 0.0]], TypeError, "rewards must be a torch.Tensor"),
    ],
)
def test_grouped_form_errors(rewards, error, match):
    with pytest.raises(error, match=match):
        group_advantages(rewards)


def test_flat_form_errors():
    with pytest.raises(ValueError, match="index has 2 labels but there are 3 responses"):
        group_advantages_by_index(torch.zeros(3), ["a", "b"])
    with pytest.raises(ValueError, match="eps=-1.0 must be >= 0.0"):
        group_advantages_by_index(torch.zeros(2), ["a", "a"], eps=-1.0)
    with pytest.raises(ValueError, match="index has shape"):
        group_advantages_by_index(torch.zeros(2), torch.tensor([0.5, 1.5]))
