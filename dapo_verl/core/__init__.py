"""DAPO's math in pure torch: losses, advantages, reward shaping and group filters.

Nothing here imports verl, ray, hydra, omegaconf, transformers or any other part of ``dapo_verl``.
"""

from dapo_verl.core.advantages import group_advantages, group_advantages_by_index, group_ids_from_index
from dapo_verl.core.correction import truncated_importance_weights
from dapo_verl.core.filters import DropReason, dynamic_group_mask, group_drop_reasons
from dapo_verl.core.losses import (
    LOG_RATIO_CLAMP,
    ClippedSurrogate,
    LossAggregation,
    aggregate_loss,
    clip_diagnostics,
    clipped_surrogate_loss_matrix,
    clipped_surrogate_with_diagnostics,
    dapo_loss,
    group_token_mean_weights,
    policy_ratio,
)
from dapo_verl.core.pass_at_k import pass_at_k, pass_at_k_sizes
from dapo_verl.core.registry import Registry
from dapo_verl.core.rewards import (
    OVERLONG_SCHEDULES,
    get_overlong_schedule,
    mask_truncated_responses,
    overlong_penalty,
    register_overlong_schedule,
    reward_overlong_penalty,
    truncated_response_mask,
)

__all__ = [
    "LOG_RATIO_CLAMP",
    "OVERLONG_SCHEDULES",
    "ClippedSurrogate",
    "DropReason",
    "LossAggregation",
    "Registry",
    "aggregate_loss",
    "clip_diagnostics",
    "clipped_surrogate_loss_matrix",
    "clipped_surrogate_with_diagnostics",
    "dapo_loss",
    "dynamic_group_mask",
    "get_overlong_schedule",
    "group_advantages",
    "group_advantages_by_index",
    "group_drop_reasons",
    "group_ids_from_index",
    "group_token_mean_weights",
    "mask_truncated_responses",
    "overlong_penalty",
    "pass_at_k",
    "pass_at_k_sizes",
    "policy_ratio",
    "register_overlong_schedule",
    "reward_overlong_penalty",
    "truncated_importance_weights",
    "truncated_response_mask",
]
