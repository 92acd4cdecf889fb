"""verl advantage estimator ``dapo``: group-normalised outcome advantage through ``dapo_verl.core``.

verl passes registered estimators only ``token_level_rewards``, ``response_mask``, ``config`` (the
``algorithm`` section) and ``index`` (the ``uid`` of each row), so the settings are read from ``config``:
``norm_adv_by_std_in_grpo``, ``adv_epsilon`` and ``group_token_mean`` (see ``dapo_verl.config``). Equal to
verl's ``grpo`` on the same input; zero on padding and for zero-spread groups.
"""

from __future__ import annotations

from typing import Any

import torch

from dapo_verl.config import AdvantageConfig, read_verl_section
from dapo_verl.core import group_advantages_by_index, group_token_mean_weights

__all__ = ["compute_dapo_outcome_advantage"]


def compute_dapo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, both (B, L); the sequence reward is the row sum of ``token_level_rewards``."""
    if index is None:
        raise ValueError(
            "adv_estimator=dapo groups responses by prompt and needs the per-row uid; verl passes it as index= "
            "when the batch has non_tensor_batch['uid'] (the PPO trainers set it)."
        )
    settings = read_verl_section(AdvantageConfig, {"algorithm": config or {}})
    scores = token_level_rewards.sum(dim=-1)  # (B,)
    advantages = group_advantages_by_index(
        scores, index, scale_by_std=settings.norm_adv_by_std_in_grpo, eps=settings.adv_epsilon
    )
    if settings.group_token_mean:
        advantages = advantages * group_token_mean_weights(response_mask, index, dtype=advantages.dtype)
    advantages = advantages.unsqueeze(-1) * response_mask  # (B, L)
    return advantages, advantages
