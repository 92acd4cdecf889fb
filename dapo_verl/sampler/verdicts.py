"""Which finished groups the sampler keeps: one rule for the replenisher and every backend that asks ahead of it.

The rule is :func:`~dapo_verl.core.group_drop_reasons` on each group's filter metric (DAPO, arXiv 2503.14476, §3.2:
a group whose responses all score the same carries no gradient); with dynamic sampling off every group is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo_verl.core import DropReason, group_drop_reasons
from dapo_verl.sampler.types import GroupResult

__all__ = ["drop_reasons", "is_kept"]


def drop_reasons(groups: Sequence[GroupResult]) -> list[DropReason]:
    """The :class:`~dapo_verl.core.DropReason` of each group (``KEEP`` for an informative one)."""
    metric = torch.stack([g.metric.detach().to("cpu", torch.float32) for g in groups])  # (P, G)
    return [DropReason(int(code)) for code in group_drop_reasons(metric)]


def is_kept(group: GroupResult, *, filtering: bool) -> bool:
    """Whether the sampler would keep ``group`` (every group when ``algorithm.filter_groups.enable=false``)."""
    return not filtering or drop_reasons([group])[0] == DropReason.KEEP
