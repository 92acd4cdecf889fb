"""Group-normalised outcome advantages (GRPO / DAPO, arXiv 2503.14476, Eq. 9).

    A_i = (R_i - mean_j R_j) / (std_j R_j + eps),  the same value for every token of response i,

where the mean and the standard deviation are taken over the G responses to the same prompt.

Numerics follow verl's ``grpo`` estimator (``compute_grpo_outcome_advantage``) so that the two agree to
float64 precision: the unbiased standard deviation (``torch.std``), ``eps`` added to the std before
dividing, and an optional no-std variant (Dr. GRPO, arXiv 2503.20783). The arithmetic runs in float64 (or
wider) and the result is cast back to the rewards' dtype, so large rewards cannot overflow the variance.

Departures, and why:
* A zero-spread group (all rewards equal) gets exactly 0, not a rounding residue divided by ``eps``:
  its gradient is zero in exact arithmetic and dynamic sampling relies on that.
* In the flat, index-grouped form a group of one response gets mean 0 and std 1, as in verl, so that
  ``dapo`` and ``grpo`` agree on every input. The (P, G) form rejects G < 2 instead: a group of one
  has no baseline.

Shape legend: P prompts, G responses per prompt, N responses in a flat list.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import torch
from torch import Tensor

from dapo_verl.core._checks import check_finite, check_float_dtype, check_number, check_tensor

__all__ = ["group_advantages", "group_advantages_by_index", "group_ids_from_index"]

_EPS_FIX = "Use a small positive value such as 1e-6 (verl's grpo default)."


def group_advantages(rewards: Tensor, *, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Normalise each response's reward within its prompt group.

    A[p, g] = (R[p, g] - mean_g R[p]) / (std_g R[p] + eps). With ``scale_by_std=False`` the division is
    skipped (Dr. GRPO variant).

    Args:
        rewards: (P, G) float. Scalar outcome reward of each response.
        scale_by_std: Divide by the group's unbiased standard deviation plus ``eps``.
        eps: Added to the standard deviation before dividing; must be >= 0.

    Returns:
        (P, G) advantages in ``rewards.dtype``; exactly 0 for every member of a zero-spread group.

    Raises:
        ValueError: if ``rewards`` is not 2-D, has G < 2 or NaN, or ``eps`` is negative.

    Example:
        >>> group_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), eps=0.0)
        tensor([[ 0.7071, -0.7071],
                [ 0.0000,  0.0000]])
    """
    rewards = check_tensor("rewards", rewards, ndim=2, shape_doc="(P, G)")
    check_float_dtype("rewards", rewards)
    if rewards.shape[1] < 2:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}: G={rewards.shape[1]}, but a group-normalised advantage "
            f"needs G >= 2 responses per prompt. Set rollout.n >= 2."
        )
    check_finite("rewards", rewards, fix="Check the reward function; every response needs a finite score.")
    eps = check_number("eps", eps, minimum=0.0, fix=_EPS_FIX)
    if rewards.numel() == 0:
        return torch.zeros_like(rewards)
    wide = rewards.to(torch.promote_types(rewards.dtype, torch.float64))  # no overflow in the variance
    centred = wide - wide.mean(dim=1, keepdim=True)  # (P, G)
    if scale_by_std:
        centred = centred / (wide.std(dim=1, keepdim=True) + eps)
    spread = wide.amax(dim=1, keepdim=True) > wide.amin(dim=1, keepdim=True)  # (P, 1)
    return _finite_advantages(torch.where(spread, centred, torch.zeros_like(centred)), rewards.dtype)


def _finite_advantages(advantages: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast back to the rewards' dtype, refusing rewards too large to normalise (|R| near the float64 limit)."""
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError(
            "rewards are too large to normalise (their spread overflows float64); rescale the reward function's "
            "output to a sane range such as [-1, 1]."
        )
    return advantages.to(dtype)


def group_ids_from_index(index: Tensor | Iterable[Hashable], num_rows: int) -> tuple[Tensor, int]:
    """Map per-row group labels (uids, prompt indices) to dense ids 0..num_groups-1.

    Args:
        index: (N,) integer tensor, or any sequence of N hashable labels (e.g. verl's ``uid`` object array).
        num_rows: N, the number of rows the labels must cover.

    Returns:
        ``(group_ids, num_groups)``: (N,) int64 dense ids in order of first appearance, and their count.

    Raises:
        ValueError: if the number of labels is not ``num_rows``.
    """
    if isinstance(index, Tensor):
        if index.ndim != 1 or index.is_floating_point():
            raise ValueError(
                f"index has shape {tuple(index.shape)} and dtype {index.dtype}; it must be (N,) integer labels. "
                f"Pass one integer group label per response."
            )
        labels: list[Hashable] = index.tolist()
    else:
        labels = list(index)
    if len(labels) != num_rows:
        raise ValueError(
            f"index has {len(labels)} labels but there are {num_rows} responses; every response needs the "
            f"label of its prompt group. Repeat each prompt's uid once per response."
        )
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(label, len(dense)) for label in labels]
    return torch.tensor(ids, dtype=torch.int64), len(dense)


def group_advantages_by_index(
    scores: Tensor,
    index: Tensor | Iterable[Hashable],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Group-normalised advantages for a flat batch whose groups are given by labels.

    Rows sharing a label form one group; groups may be interleaved and of unequal size. A group of one
    row gets mean 0 and std 1 (verl's convention), so its advantage is ``score / (1 + eps)``.

    Args:
        scores: (N,) float. Scalar outcome reward of each response.
        index: (N,) group labels (see :func:`group_ids_from_index`).
        scale_by_std: Divide by the group's unbiased standard deviation plus ``eps``.
        eps: Added to the standard deviation before dividing; must be >= 0.

    Returns:
        (N,) advantages in ``scores.dtype`` on ``scores.device``; exactly 0 for zero-spread groups of two
        or more responses.

    Raises:
        ValueError: if ``scores`` is not 1-D or holds NaN, the labels do not cover it, or ``eps`` < 0.

    Example:
        >>> group_advantages_by_index(torch.tensor([1.0, 0.0, 2.0, 2.0]), ["a", "a", "b", "b"], eps=0.0)
        tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    """
    scores = check_tensor("scores", scores, ndim=1, shape_doc="(N,)")
    check_float_dtype("scores", scores)
    check_finite("scores", scores, fix="Check the reward function; every response needs a finite score.")
    eps = check_number("eps", eps, minimum=0.0, fix=_EPS_FIX)
    group_ids, num_groups = group_ids_from_index(index, scores.shape[0])
    group_ids = group_ids.to(scores.device)
    dtype, scores = scores.dtype, scores.to(torch.promote_types(scores.dtype, torch.float64))

    count = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, group_ids, torch.ones_like(scores)
    )  # (num_groups,)
    mean = torch.zeros_like(count).index_add_(0, group_ids, scores) / count
    centred = scores - mean[group_ids]  # (N,)
    sq_dev = torch.zeros_like(count).index_add_(0, group_ids, centred * centred)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1))

    singleton = (count == 1)[group_ids]
    low = torch.full_like(count, float("inf")).scatter_reduce(0, group_ids, scores, reduce="amin")
    high = torch.full_like(count, float("-inf")).scatter_reduce(0, group_ids, scores, reduce="amax")
    spread = (high > low)[group_ids]

    # verl's convention for a group of one: mean 0, std 1.
    centred = torch.where(singleton, scores, centred)
    if scale_by_std:
        centred = centred / (torch.where(singleton, torch.ones_like(scores), std[group_ids]) + eps)
    return _finite_advantages(torch.where(spread | singleton, centred, torch.zeros_like(centred)), dtype)
