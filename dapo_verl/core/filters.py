"""Dynamic-sampling group filters (DAPO, arXiv 2503.14476, §3.2 "Dynamic Sampling", Eq. 11 constraint).

DAPO trains only on prompt groups whose G responses disagree: the constraint
``0 < |{o_i : is_equivalent(a, o_i)}| < G`` drops groups that are all correct or all wrong, because their
group-normalised advantage -- and so their gradient -- is exactly zero.

Departures from the paper, and why:
* The test is "the group's values are not all equal" (max > min). For 0/1, -1/1 and bool encodings this
  is exactly the paper's constraint; for a non-binary metric it is the natural generalisation (a group
  with zero spread has zero advantage whatever its values are).
* Every dropped group is given a reason (:class:`DropReason`), so callers can count drops by cause.

Shape legend: P prompts, G responses per prompt.
"""

from __future__ import annotations

from enum import IntEnum

import torch
from torch import Tensor

from dapo_verl.core._checks import check_finite, check_tensor

__all__ = ["DropReason", "dynamic_group_mask", "group_drop_reasons"]


class DropReason(IntEnum):
    """Why a prompt group is kept or dropped by dynamic sampling.

    ``KEEP`` groups are informative. A constant group is ``ALL_CORRECT`` when its value is 1 (or True),
    ``ALL_WRONG`` when it is 0, -1 (or False), and ``ZERO_SPREAD`` for any other constant value (a
    non-binary metric such as a shaped score).
    """

    KEEP = 0
    ALL_CORRECT = 1
    ALL_WRONG = 2
    ZERO_SPREAD = 3

    @property
    def label(self) -> str:
        """Lowercase name used in metric keys, e.g. ``dapo/sampler/dropped/all_correct``."""
        return self.name.lower()


def _grouped_values(rewards: object) -> Tensor:
    """Validate a (P, G) reward tensor and return it as floating point."""
    rewards = check_tensor("rewards", rewards, ndim=2, shape_doc="(P, G)")
    if rewards.shape[1] < 2:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}: G={rewards.shape[1]} responses per prompt, but dynamic "
            f"sampling needs G >= 2 to tell a mixed group from a uniform one. Set rollout.n >= 2."
        )
    if rewards.dtype == torch.bool or not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    # +-inf is no outcome either: a group [1, inf] would count as informative with an advantage of NaN
    check_finite("rewards", rewards, fix="Check the reward function; every response needs a finite score.")
    return rewards


def dynamic_group_mask(rewards: Tensor) -> Tensor:
    """Keep-mask of the prompt groups whose responses disagree.

    Args:
        rewards: (P, G) bool, integer or float (real, materialized). The filter metric of each response, normally raw
            correctness (``acc``) in 0/1, -1/1 or bool encoding; never the length-shaped reward.

    Returns:
        (P,) bool on ``rewards.device``; True for a group holding at least two different values.

    Raises:
        TypeError: if ``rewards`` is not a tensor, or is complex.
        ValueError: if ``rewards`` is a meta tensor, is not 2-D, has G < 2, or contains NaN or +-inf.

    Example:
        >>> dynamic_group_mask(torch.tensor([[0, 0, 0], [0, 1, 1], [1, 1, 1]]))
        tensor([False,  True, False])
        >>> dynamic_group_mask(torch.tensor([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0]]))
        tensor([False,  True, False])
    """
    values = _grouped_values(rewards)
    if values.shape[0] == 0:
        return torch.zeros(0, dtype=torch.bool, device=values.device)
    # amax/amin rather than aminmax: aminmax's parallel kernel costs milliseconds on a small (P, G) tensor
    return values.amax(dim=1) > values.amin(dim=1)


def group_drop_reasons(rewards: Tensor) -> Tensor:
    """Per-group :class:`DropReason` codes (``KEEP`` for informative groups).

    Args:
        rewards: (P, G) as for :func:`dynamic_group_mask`.

    Returns:
        (P,) int64 on ``rewards.device`` holding ``DropReason`` values.

    Example:
        >>> [DropReason(int(r)).label for r in group_drop_reasons(torch.tensor([[1, 1], [0, 1], [0, 0]]))]
        ['all_correct', 'keep', 'all_wrong']
    """
    values = _grouped_values(rewards)
    keep = dynamic_group_mask(values)
    first = values[:, 0] if values.shape[0] else values.new_zeros(0)
    reasons = torch.full(keep.shape, int(DropReason.ZERO_SPREAD), dtype=torch.int64, device=values.device)
    reasons = torch.where(first == 1, int(DropReason.ALL_CORRECT), reasons)
    reasons = torch.where((first == 0) | (first == -1), int(DropReason.ALL_WRONG), reasons)
    return torch.where(keep, int(DropReason.KEEP), reasons)
