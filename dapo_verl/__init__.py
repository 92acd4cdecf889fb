"""dapo_verl: DAPO (arXiv 2503.14476) for verl, plus a local backend that runs it on one machine.

``import dapo_verl`` gives the pure-torch core API and imports neither verl, ray nor transformers.
Registration into verl happens in :mod:`dapo_verl.adapter.register`, reached through the
``verl.plugins`` entry point on every ``import verl``.
"""

from dapo_verl.core import (
    DropReason,
    LossAggregation,
    aggregate_loss,
    clip_diagnostics,
    clipped_surrogate_loss_matrix,
    clipped_surrogate_with_diagnostics,
    dapo_loss,
    dynamic_group_mask,
    get_overlong_schedule,
    group_advantages,
    group_advantages_by_index,
    group_drop_reasons,
    group_token_mean_weights,
    mask_truncated_responses,
    overlong_penalty,
    register_overlong_schedule,
    reward_overlong_penalty,
    truncated_response_mask,
)

__version__ = "0.1.0"

__all__ = [
    "DropReason",
    "LossAggregation",
    "__version__",
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
    "group_token_mean_weights",
    "mask_truncated_responses",
    "overlong_penalty",
    "register_overlong_schedule",
    "reward_overlong_penalty",
    "truncated_response_mask",
]
