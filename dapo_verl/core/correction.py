"""Truncated importance sampling against the policy that sampled the tokens (verl's token-level rollout correction).

A response trained at a later step than it was sampled -- a group carried to the next step -- was drawn from an older
policy ``pi_rollout`` than the one the loss takes as its old policy ``pi_old`` (the current weights before the
update; its log-probs are recomputed, as verl does). Token-level truncated importance sampling (TIS) multiplies each
token's loss term by

    w = min(pi_old(token) / pi_rollout(token), threshold)

detached (the weight changes the measure, not the objective), and 0 on padding. verl computes the same weights in
``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights`` with ``rollout_is="token"`` and a single
float ``rollout_is_threshold`` (its log-ratio clamped at +-20 before the exponential, as here);
``tests/unit/test_core_correction.py`` checks the two agree. For a response sampled by the current weights the
weights are 1 up to floating-point noise.

Shape legend: B responses, L padded response length.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dapo_verl.core._checks import (
    check_finite,
    check_same_device,
    check_same_shape,
    check_tensor,
    run_device_checks,
)
from dapo_verl.core._ratio import LOG_RATIO_CLAMP, token_inputs

__all__ = ["truncated_importance_weights"]


def truncated_importance_weights(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, threshold: float = 2.0
) -> Tensor:
    """Token-level TIS weights ``min(exp(old_logp - rollout_logp), threshold)``, 0 on padding (module docstring).

    Args:
        old_logp: (B, L) log-probs of the response tokens under the policy before this update.
        rollout_logp: (B, L) log-probs of the same tokens under the policy that sampled them.
        mask: (B, L) bool or 0/1, True on response tokens.
        threshold: The upper bound of a weight (verl's ``rollout_is_threshold``), > 0.

    Returns:
        (B, L) detached weights in the compute dtype of the log-probs.

    Raises:
        TypeError, ValueError: for inputs that are not (B, L) tensors of the same shape and device, a mask that is
        not 0/1, a non-finite log-prob on a response token, or a threshold that is not a positive finite number.
    """
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not (math.isfinite(threshold) and threshold > 0)
    ):
        raise ValueError(
            f"threshold={threshold!r}: the upper bound of the importance weights must be a positive "
            f"finite number; verl's default rollout_is_threshold is 2.0."
        )
    old_logp = check_tensor("old_logp", old_logp, ndim=2, shape_doc="(B, L)")
    rollout_logp = check_tensor("rollout_logp", rollout_logp, ndim=2, shape_doc="(B, L)")
    check_same_shape(
        "old_logp",
        old_logp,
        "rollout_logp",
        rollout_logp,
        hint="both must be (B, L) log-probs of the same response tokens.",
    )
    check_same_device("old_logp", old_logp, "rollout_logp", rollout_logp)
    tok = token_inputs(old_logp, rollout_logp, mask)  # dtypes and the mask; old_logp plays logp's part
    run_device_checks(tok.checks)  # the mask holds only 0 and 1
    for name, tensor in (("old_logp", tok.logp), ("rollout_logp", tok.old_logp)):
        check_finite(
            name, tensor, where=tok.mask, fix="log-probs of response tokens must be finite; padding may hold anything."
        )
    log_ratio = torch.where(tok.mask, tok.logp.detach() - tok.old_logp, 0.0).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weights = torch.exp(log_ratio) * tok.mask_float
    return weights.clamp(max=float(threshold)).detach()
