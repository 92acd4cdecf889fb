"""The legacy trainer keeps each group as a compact copy in a canonical order (issue 11, driver memory)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_driver_memory import measure
from dapo_verl.adapter.trainer import canonical_group_rows

pytestmark = pytest.mark.verl


def test_kept_groups_hold_only_their_own_bytes():
    # The paper round scaled by 1/256 rows and 1/64 tokens; one group kept of 6.
    compact = measure("compact copy (after)", row_factor=256, length_factor=64, kept=1)
    view = measure("slice view (before)", row_factor=256, length_factor=64, kept=1)
    assert compact["ratio"] <= 1.1
    assert view["ratio"] == pytest.approx(6.0)  # a slice pins its whole round: what the trainer did before


def test_canonical_order_ignores_the_order_responses_arrived_in(gen):
    responses = torch.randint(0, 5, (8, 6), generator=gen)
    lengths = torch.tensor([3, 6, 6, 2, 3, 6, 1, 6])
    order = canonical_group_rows(responses, lengths, start=0, size=8)
    canonical = [responses[i, : lengths[i]].tolist() for i in order]
    perm = torch.randperm(8, generator=gen)
    shuffled = canonical_group_rows(responses[perm], lengths[perm], start=0, size=8)
    assert [responses[perm][i, : lengths[perm][i]].tolist() for i in shuffled] == canonical
    assert [len(r) for r in canonical] == sorted(lengths.tolist())
    assert canonical_group_rows(responses, lengths, start=4, size=4).min() >= 4  # stays inside its group
