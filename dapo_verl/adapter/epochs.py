"""Epoch labels for verl's trainers when dynamic sampling decides how many prompts a step consumes.

verl derives the epoch it logs (``training/epoch``) and resumes in from the step count: ``global_steps //
steps_per_epoch``, with one dataloader batch per step. With dynamic sampling a step consumes as many prompts
as it needs, so the sampler's passes over the data (``dapo/sampler/data_epoch``) and that quotient drift apart.
Both dapo_verl trainers keep them together by choosing the divisor verl uses.
"""

from __future__ import annotations

__all__ = ["epoch_divisor"]


def epoch_divisor(global_steps: int, data_epoch: int) -> int:
    """The smallest divisor L >= 1 with ``global_steps // L == data_epoch``, or the closest when none exists.

    Example:
        >>> epoch_divisor(10, 3), 10 // epoch_divisor(10, 3)
        (3, 3)
        >>> epoch_divisor(5, 0)
        6
    """
    if data_epoch <= 0:
        return global_steps + 1
    low = -(-(global_steps + 1) // (data_epoch + 1))  # ceil((g + 1) / (e + 1))
    return max(1, min(low, global_steps // data_epoch))  # below `low` only when data epochs are shorter than a step
