"""dynamic_group_mask and drop reasons."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_verl.core import DropReason, dynamic_group_mask, group_drop_reasons


@pytest.mark.parametrize(
    "encode",
    [
        lambda v: torch.tensor(v, dtype=torch.float32),
        lambda v: torch.tensor(v, dtype=torch.float32) * 2 - 1,
        lambda v: torch.tensor(v, dtype=torch.bool),
        lambda v: torch.tensor(v, dtype=torch.int64),
    ],
)
def test_only_mixed_groups_survive_in_every_encoding(encode):
    rewards = encode([[0, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1]])
    keep = dynamic_group_mask(rewards)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, False]


def test_mask_stays_on_the_rewards_device_and_handles_no_groups():
    assert dynamic_group_mask(torch.zeros(0, 4)).shape == (0,)
    rewards = torch.tensor([[0.0, 1.0]])
    assert dynamic_group_mask(rewards).device == rewards.device


def test_non_binary_metric_uses_a_zero_spread_test():
    rewards = torch.tensor([[0.5, 0.5], [0.5, 0.7], [2.0, 2.0]])
    assert dynamic_group_mask(rewards).tolist() == [False, True, False]
    reasons = [DropReason(int(r)) for r in group_drop_reasons(rewards)]
    assert reasons == [DropReason.ZERO_SPREAD, DropReason.KEEP, DropReason.ZERO_SPREAD]


def test_drop_reasons_name_the_cause():
    rewards = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0], [1.0, -1.0]])
    labels = [DropReason(int(r)).label for r in group_drop_reasons(rewards)]
    assert labels == ["all_correct", "all_wrong", "all_wrong", "keep"]
    bools = torch.tensor([[True, True], [False, False]])
    assert [DropReason(int(r)).label for r in group_drop_reasons(bools)] == ["all_correct", "all_wrong"]


@pytest.mark.parametrize(
    ("rewards", "match"),
    [
        (torch.zeros(4), r"rewards has shape \(4,\) but must be \(P, G\)"),
        (torch.zeros(2, 2, 2), r"must be \(P, G\)"),
        (torch.zeros(3, 1), "G=1 responses per prompt, but dynamic sampling needs G >= 2"),
        (torch.tensor([[0.0, math.nan]]), r"rewards contains NaN or inf \(first at index \(0, 1\)"),
        (torch.tensor([[1.0, math.inf]]), r"rewards contains NaN or inf \(first at index \(0, 1\): inf\)"),
    ],
)
def test_bad_rewards_are_rejected_with_the_fix(rewards, match):
    with pytest.raises(ValueError, match=match):
        dynamic_group_mask(rewards)


def test_a_complex_metric_is_refused_naming_its_dtype():
    rewards = torch.tensor([[1 + 1j, 1 + 0j], [0j, 1 + 0j]])  # the first group differs only in its imaginary part
    for function in (dynamic_group_mask, group_drop_reasons):
        with pytest.raises(TypeError, match=r"rewards has dtype torch.complex64 but must be real .* imaginary part"):
            function(rewards)


def test_a_meta_tensor_is_refused_as_having_no_values():
    for function in (dynamic_group_mask, group_drop_reasons):
        with pytest.raises(
            ValueError,
            match=r"rewards is a meta tensor \(shape \(2, 4\), no data\).*materialized CPU "
            r"or GPU tensor is expected",
        ):
            function(torch.empty(2, 4, device="meta"))
