"""pass@k of sampled responses: the chance that at least one of k responses to a prompt is correct.

With n responses per prompt of which c are correct, the unbiased estimator (Chen et al. 2021, arXiv 2107.03374,
Eq. 1) is

    pass@k = 1 - C(n - c, k) / C(n, k)        (1 when n - c < k)

averaged over prompts. DAPO (arXiv 2503.14476, §3.1) argues that clip-higher keeps exploration alive; pass@k
for k up to the group size is where a loss of exploration shows first, while greedy accuracy may not move.

verl reports the same quantity as ``best@k/mean`` of a 0/1 score, estimated by bootstrap resampling with
replacement (``verl.trainer.ppo.metric_utils.process_validation_metrics``); the estimator here is exact and
needs no random numbers. :func:`pass_at_k_sizes` gives verl's sizes k = 2, 4, 8, ... below n, then n.

Shape legend: P prompts, n responses per prompt.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dapo_verl.core._checks import check_real_data

__all__ = ["pass_at_k", "pass_at_k_sizes"]


def pass_at_k_sizes(n: int) -> list[int]:
    """verl's sizes of ``best@k``: the powers of two from 2 below ``n``, then ``n``; none for ``n`` < 2.

    Example:
        >>> pass_at_k_sizes(8), pass_at_k_sizes(6), pass_at_k_sizes(1)
        ([2, 4, 8], [2, 4, 6], [])
    """
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n] if n >= 2 else []


def pass_at_k(correct: Tensor, k: int) -> Tensor:
    """Per-prompt unbiased pass@k (module formula).

    Args:
        correct: (P, n) bool or 0/1. Whether each sampled response is correct.
        k: Responses drawn, 1 <= k <= n.

    Returns:
        (P,) float64 pass@k of each prompt; its mean is the estimate over prompts.

    Raises:
        TypeError: if ``correct`` is not a tensor, or is complex.
        ValueError: if ``correct`` is a meta tensor, is not 2-D or holds values other than 0 and 1, or ``k`` is not
            in [1, n].

    Example:
        >>> pass_at_k(torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]]), 2).tolist()
        [0.5, 0.0, 0.8333333333333334]
    """
    if not isinstance(correct, Tensor):
        raise TypeError(f"correct must be a (P, n) tensor of 0/1 outcomes, got {type(correct).__name__}.")
    check_real_data("correct", correct)
    if correct.ndim != 2:
        raise ValueError(
            f"correct has shape {tuple(correct.shape)} but must be (P, n): one row of outcomes per prompt."
        )
    n = correct.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"k={k!r} must be an integer in [1, n] = [1, {n}]; draw at most as many responses as sampled.")
    outcomes = correct.to(torch.float64)
    if bool(((outcomes != 0) & (outcomes != 1)).any()):
        raise ValueError("correct must hold only 0/1 (or bool) outcomes; pass the verifier's per-response verdict.")
    wrong = n - outcomes.sum(dim=1)  # (P,)
    # C(n - c, k) / C(n, k) = prod_{i=0}^{k-1} (n - c - i) / (n - i); a factor <= 0 means fewer than k wrong ones
    steps = torch.arange(k, dtype=torch.float64, device=correct.device)  # (k,)
    factors = ((wrong.unsqueeze(1) - steps) / (n - steps)).clamp_min(0.0)  # (P, k)
    return 1.0 - factors.prod(dim=1)
