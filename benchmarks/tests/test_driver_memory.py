"""The legacy trainer keeps each group as a compact copy in a canonical order (issue 11, driver memory)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_driver_memory import measure
from dapo_verl.adapter.trainer import canonical_group_rows, padded_rows_to_keep

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


def _kept(responses, lengths, *, real, n):
    keep = padded_rows_to_keep(responses, lengths, real=real, n=n)
    return [[tuple(responses[i, : lengths[i]].tolist()) for i in keep[j * n : (j + 1) * n]] for j in range(real // n)]


@pytest.mark.parametrize("pad", [1, 4])  # within prompt 0's rows, and spanning prompts 0 and 1
def test_padded_rollout_keeps_n_samples_per_prompt_whatever_order_identical_requests_finished_in(gen, pad):
    n, prompts = 3, 3
    real = n * prompts
    copies = [k % real for k in range(pad)]  # pad row real + k repeats row k (verl's pad_dataproto_to_divisor)
    responses = torch.randint(0, 50, (real + pad, 5), generator=gen)
    lengths = torch.randint(1, 6, (real + pad,), generator=gen)
    kept = _kept(responses, lengths, real=real, n=n)
    assert [len(group) for group in kept] == [n] * prompts
    # Identical requests answered in another order: the samples of each prompt (its rows and the pad rows
    # that repeat them) are permuted among themselves.
    for prompt in range(prompts):
        rows = [*range(prompt * n, prompt * n + n), *(real + k for k, row in enumerate(copies) if row // n == prompt)]
        perm = torch.tensor(rows)[torch.randperm(len(rows), generator=gen)]
        shuffled_responses, shuffled_lengths = responses.clone(), lengths.clone()
        shuffled_responses[rows], shuffled_lengths[rows] = responses[perm], lengths[perm]
        again = _kept(shuffled_responses, shuffled_lengths, real=real, n=n)
        assert [sorted(group) for group in again] == [sorted(group) for group in kept]
    # Each prompt keeps only its own samples.
    own = {
        j: {
            tuple(responses[r, : lengths[r]].tolist())
            for r in range(real + pad)
            if (r if r < real else copies[r - real]) // n == j
        }
        for j in range(prompts)
    }
    assert all(set(group) <= own[j] for j, group in enumerate(kept))
