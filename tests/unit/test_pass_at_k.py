"""pass@k: the unbiased estimator against enumerating every k-subset, and verl's sizes."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.core import pass_at_k, pass_at_k_sizes


def _by_enumeration(row, k):
    subsets = list(itertools.combinations(row, k))
    return sum(any(s) for s in subsets) / len(subsets)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=5), k=st.integers(1, 6))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_response(rows, k):
    got = pass_at_k(torch.tensor(rows), k)
    assert got.tolist() == pytest.approx([_by_enumeration(row, k) for row in rows], abs=1e-12)


def test_pass_at_k_by_hand_and_its_limits():
    correct = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0], [0] * 8, [1] * 8])
    assert pass_at_k(correct, 1).tolist() == pytest.approx([1 / 8, 0.0, 1.0])  # pass@1 is the sampled accuracy
    assert pass_at_k(correct, 2).tolist() == pytest.approx([1 - (7 * 6) / (8 * 7), 0.0, 1.0])
    assert pass_at_k(correct, 8).tolist() == [1.0, 0.0, 1.0]  # k = n: any correct
    rising = [pass_at_k(correct[:1], k).item() for k in range(1, 9)]
    assert rising == sorted(rising)


def test_pass_at_k_refuses_bad_input():
    with pytest.raises(ValueError, match=r"\[1, n\] = \[1, 4\]"):
        pass_at_k(torch.ones(2, 4), 5)
    with pytest.raises(ValueError, match="must be \\(P, n\\)"):
        pass_at_k(torch.ones(4), 1)
    with pytest.raises(ValueError, match="only 0/1"):
        pass_at_k(torch.tensor([[0.5, 1.0]]), 1)
    with pytest.raises(TypeError, match="tensor"):
        pass_at_k([[1, 0]], 1)


def test_sizes_are_verls_best_at_k_sizes():
    assert pass_at_k_sizes(8) == [2, 4, 8]
    assert pass_at_k_sizes(16) == [2, 4, 8, 16]
    assert pass_at_k_sizes(5) == [2, 4, 5]
    assert pass_at_k_sizes(2) == [2] and pass_at_k_sizes(1) == []


def test_a_meta_or_complex_outcome_tensor_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"correct is a meta tensor .*materialized"):
        pass_at_k(torch.empty(2, 4, device="meta"), 2)
    with pytest.raises(TypeError, match=r"correct has dtype torch.complex64 but must be real"):
        pass_at_k(torch.ones(2, 4, dtype=torch.complex64), 2)
