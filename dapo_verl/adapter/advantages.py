"""verl advantage estimator ``dapo``: group-normalised outcome advantage through ``dapo_verl.core``.

verl passes registered estimators only ``token_level_rewards``, ``response_mask``, ``config`` (the
``algorithm`` section) and ``index`` (the ``uid`` of each row), so the settings are read from ``config``:
``norm_adv_by_std_in_grpo``, ``adv_epsilon`` and ``group_token_mean`` (see ``dapo_verl.config``). Equal to
verl's ``grpo`` on the same input; zero on padding and for zero-spread groups.

One documented difference: verl's v1 trainer special-cases its own ``grpo`` when an agent loop emits several
outputs for one sampled response (multi-turn sessions): only each session's final output enters the group's
mean and std, and its advantage is copied to the session's other outputs
(``verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories``). A registered estimator sees rows and
uids, not sessions, so ``dapo`` normalises over every output. With one output per sampled response (single-turn
rollouts, every dapo_verl recipe) the two are equal; for multi-turn agent loops on v1 use ``adv_estimator=grpo``.
Tested in ``tests/integration/test_advantage_estimator.py``.
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
