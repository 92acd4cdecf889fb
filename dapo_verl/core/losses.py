"""DAPO's decoupled-clip policy loss and its token-level aggregation (arXiv 2503.14476, Eq. 8 and 10).

    r_it = exp(logp_it - old_logp_it)
    l_it = -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)        (clip-higher, §3.1)
    L    = sum_{i,t} m_it * l_it / sum_{i,t} m_it                                (token-level loss, §3.3)

The mean runs over every valid token of the whole mini-batch, not over per-response means, so long
responses weigh in proportion to their length. Under micro-batching or data parallelism the divisor is
the token count of the whole mini-batch, passed in explicitly as ``num_valid_tokens``.

Departures from the paper, and why:
* Optional dual clip (``clip_ratio_c``, arXiv 1912.09729): for A < 0 the per-token loss is capped at
  ``-A * clip_ratio_c``. The published verl DAPO run uses 10; the paper's formula has none, so the default
  here is off.
* ``log_ratio`` is clamped to [-20, 20] before exponentiating, as verl's ``vanilla`` loss does, so the two
  agree value-for-value and gradient-for-gradient.
* The paper's normaliser can also be read per prompt group (verl#2776). ``token_mean_group`` offers that
  reading; the global token mean is the default.
* Inputs are validated, including a NaN check on valid positions; that reads one value back from the
  device per call (verl's own loss reads several metrics back per micro-batch).

Padded positions never reach ``exp``: they are masked first, so -inf or huge values there give a finite
loss and exactly zero gradient. Ratios are computed in float32, or float64 if any input is float64.

Shape legend: B responses, L padded response length, P prompt groups.
"""

from __future__ import annotations

from enum import StrEnum

import torch
from torch import Tensor

from dapo_verl.core._checks import (
    check_finite,
    check_no_nan,
    check_number,
    check_same_device,
    check_same_shape,
    check_tensor,
    compute_dtype,
)
from dapo_verl.core.advantages import group_ids_from_index

__all__ = [
    "LOG_RATIO_CLAMP",
    "LossAggregation",
    "aggregate_loss",
    "clip_diagnostics",
    "clipped_surrogate_loss_matrix",
    "dapo_loss",
    "group_token_mean_weights",
    "policy_ratio",
]

LOG_RATIO_CLAMP = 20.0
"""Bound on |logp - old_logp| before exponentiating; the same stability clamp as verl's vanilla loss."""


class LossAggregation(StrEnum):
    """How a (B, L) per-token loss becomes a scalar; each name says its divisor.

    * ``token_mean_global``: sum over valid tokens / valid tokens of the whole mini-batch (DAPO's
      token-level loss; verl ``token-mean``).
    * ``token_mean_group``: mean over prompt groups of (sum over the group's valid tokens / the group's
      valid tokens) -- the per-group reading of the paper's normaliser.
    * ``seq_mean_token_mean``: mean over responses of each response's token mean (GRPO's sample-level
      loss; verl ``seq-mean-token-mean``).
    * ``seq_mean_token_sum``: sum over valid tokens / number of responses (verl ``seq-mean-token-sum``).
    """

    TOKEN_MEAN_GLOBAL = "token_mean_global"
    TOKEN_MEAN_GROUP = "token_mean_group"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    SEQ_MEAN_TOKEN_SUM = "seq_mean_token_sum"


def _token_mask(mask: object, like: Tensor) -> Tensor:
    """Validate a (B, L) mask (bool or 0/1) against ``like`` and return it as bool."""
    mask = check_tensor("mask", mask, ndim=2, shape_doc="(B, L)")
    check_same_shape("logp", like, "mask", mask, hint="all per-token inputs must be (B, L). Slice the response "
                     "the same way for both.")
    check_same_device("logp", like, "mask", mask)
    if mask.dtype == torch.bool:
        return mask
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError(
            f"mask has values other than 0 and 1 (dtype {mask.dtype}); a token either counts or it does not. "
            f"Pass a bool mask or a 0/1 mask; put per-token weights into the loss, not the mask."
        )
    return mask != 0


def _token_inputs(logp: object, old_logp: object, mask: object) -> tuple[Tensor, Tensor, Tensor]:
    """Validate (logp, old_logp, mask) and return them with the mask as bool."""
    logp = check_tensor("logp", logp, ndim=2, shape_doc="(B, L)")
    old_logp = check_tensor("old_logp", old_logp, ndim=2, shape_doc="(B, L)")
    for name, tensor in (("logp", logp), ("old_logp", old_logp)):
        if not tensor.is_floating_point():
            raise TypeError(f"{name} has dtype {tensor.dtype} but must be floating point. Convert it with .float().")
    check_same_shape("logp", logp, "old_logp", old_logp, hint="both must be (B, L) log-probs of the same tokens.")
    check_same_device("logp", logp, "old_logp", old_logp)
    bool_mask = _token_mask(mask, logp)
    fix = "A valid token's log-prob must be a number; check the model's forward pass for overflow."
    check_no_nan("logp", logp.detach(), where=bool_mask, fix=fix)
    check_no_nan("old_logp", old_logp, where=bool_mask, fix=fix)
    return logp, old_logp, bool_mask


def _per_token_advantages(advantages: object, like: Tensor, mask: Tensor) -> Tensor:
    """Validate advantages ((B,) or (B, L)) and return them broadcastable to (B, L)."""
    advantages = check_tensor("advantages", advantages, ndim=(1, 2), shape_doc="(B,) or (B, L)")
    if advantages.ndim == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(
                f"advantages has shape {tuple(advantages.shape)} but logp has {like.shape[0]} rows; pass one "
                f"advantage per response, shape (B,) = ({like.shape[0]},)."
            )
        advantages = advantages.unsqueeze(-1)  # (B, 1)
        valid = mask.any(dim=1, keepdim=True)  # (B, 1)
    else:
        check_same_shape("logp", like, "advantages", advantages, hint="per-token advantages must be (B, L).")
        valid = mask
    check_same_device("logp", like, "advantages", advantages)
    check_finite("advantages", advantages.detach(), where=valid, fix="Check the reward and advantage computation.")
    return advantages


def policy_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Importance ratio pi_theta / pi_old per token, masked before exponentiating.

    Args:
        logp: (B, L) float. Log-probs of the sampled tokens under the current policy (requires grad).
        old_logp: (B, L) float. Log-probs under the policy that generated them (a constant).
        mask: (B, L) bool or 0/1. True where a token counts.

    Returns:
        (B, L) ratio in float32 (float64 if an input is float64); exactly 1 at padded positions.
    """
    logp, old_logp, bool_mask = _token_inputs(logp, old_logp, mask)
    return _ratio(logp, old_logp, bool_mask)


def _ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    dtype = compute_dtype(logp, old_logp)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    log_ratio = torch.where(mask, logp.to(dtype), zero) - torch.where(mask, old_logp.detach().to(dtype), zero)
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, L)


def _check_clip(clip_low: float, clip_high: float, clip_ratio_c: float | None) -> tuple[float, float, float | None]:
    clip_low = check_number("clip_low", clip_low, minimum=0.0, maximum=1.0,
                            fix="Use a width in [0, 1], e.g. 0.2 (paper §3.1, clip_ratio_low).")
    clip_high = check_number("clip_high", clip_high, minimum=0.0,
                             fix="Use a non-negative width, e.g. 0.28 (paper §3.1, clip_ratio_high).")
    if clip_ratio_c is not None:
        clip_ratio_c = check_number("clip_ratio_c", clip_ratio_c, minimum=1.0, min_inclusive=False,
                                    fix="Dual clip needs clip_ratio_c > 1 (as in verl); the published DAPO run "
                                        "uses 10. Pass None to disable it.")
    return clip_low, clip_high, clip_ratio_c


def clipped_surrogate_loss_matrix(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_ratio_c: float | None = None,
) -> Tensor:
    """Per-token clipped-surrogate loss before aggregation; the one implementation every variant uses.

    l_it = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with dual clip, for A < 0,
    l_it = min(l_it, -A * clip_ratio_c).

    Args:
        logp: (B, L) float. Current-policy log-probs (gradient flows here only).
        old_logp: (B, L) float. Behaviour-policy log-probs; treated as a constant.
        advantages: (B,) or (B, L) float. Per-response (or per-token) advantages; treated as a constant.
        mask: (B, L) bool or 0/1. True where a token counts.
        clip_low: eps_low, the ratio's lower clip width (paper 0.2).
        clip_high: eps_high, the ratio's upper clip width (paper 0.28).
        clip_ratio_c: Dual-clip constant (> 1 + clip_high), or None for no dual clip.

    Returns:
        (B, L) loss in the compute dtype; exactly 0 at padded positions.
    """
    logp, old_logp, bool_mask = _token_inputs(logp, old_logp, mask)
    clip_low, clip_high, clip_ratio_c = _check_clip(clip_low, clip_high, clip_ratio_c)
    adv = _per_token_advantages(advantages, logp, bool_mask).detach()
    ratio = _ratio(logp, old_logp, bool_mask)
    adv = torch.where(bool_mask, adv.to(ratio.dtype), torch.zeros((), dtype=ratio.dtype, device=ratio.device))
    if logp.dtype == torch.float16:
        _check_float16_gradient_range(adv, ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)  # (B, L)
    if clip_ratio_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    return torch.where(bool_mask, loss, torch.zeros_like(loss))


def _check_float16_gradient_range(adv: Tensor, ratio: Tensor) -> None:
    """The gradient reaches ``logp`` in its own dtype; float16 overflows past 65504 (bfloat16 does not)."""
    peak = float((adv.abs() * ratio).detach().amax()) if adv.numel() else 0.0
    limit = torch.finfo(torch.float16).max
    if peak > limit:
        raise ValueError(
            f"logp is float16, and advantages times ratios reach {peak:.3g}, beyond float16's range ({limit:.0f}): "
            f"the gradient would overflow to inf. Pass log-probs as bfloat16 or float32, or check the advantages."
        )


def _count(value: int | Tensor | None, name: str, fallback: Tensor) -> Tensor:
    """A normaliser: the caller's global count if given, else the local one; never below 1."""
    if value is None:
        return fallback.clamp_min(1)
    if isinstance(value, Tensor):
        return value.to(fallback.dtype).clamp_min(1)
    check_number(name, value, minimum=0, fix=f"Pass the number of {name.removeprefix('num_')} of the whole "
                                             f"mini-batch across micro-batches and ranks.")
    return fallback.new_tensor(max(float(value), 1.0))


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: LossAggregation | str = LossAggregation.TOKEN_MEAN_GLOBAL,
    *,
    group_index: Tensor | None = None,
    num_valid_tokens: int | Tensor | None = None,
    num_sequences: int | Tensor | None = None,
) -> Tensor:
    """Reduce a (B, L) per-token loss to a scalar (see :class:`LossAggregation`).

    Args:
        loss_mat: (B, L) float. Per-token loss, e.g. from :func:`clipped_surrogate_loss_matrix`.
        mask: (B, L) bool or 0/1. True where a token counts.
        mode: The aggregation.
        group_index: (B,) integer group label of each row; required for ``token_mean_group``.
        num_valid_tokens: Valid tokens of the whole mini-batch (``token_mean_global``) when this call sees
            one micro-batch of it; defaults to this call's count.
        num_sequences: Responses of the whole mini-batch (``seq_mean_*``); defaults to this call's
            non-empty responses.

    Returns:
        0-dim tensor; a differentiable zero when no token is valid.
    """
    loss_mat = check_tensor("loss_mat", loss_mat, ndim=2, shape_doc="(B, L)")
    bool_mask = _token_mask(mask, loss_mat)
    mode = _aggregation(mode)
    masked = torch.where(bool_mask, loss_mat, torch.zeros_like(loss_mat))  # (B, L)
    tokens_per_row = bool_mask.sum(dim=1).to(loss_mat.dtype)  # (B,)
    if mode is LossAggregation.TOKEN_MEAN_GLOBAL:
        return masked.sum() / _count(num_valid_tokens, "num_valid_tokens", tokens_per_row.sum())
    if mode is LossAggregation.TOKEN_MEAN_GROUP:
        return _group_token_mean(masked, tokens_per_row, group_index)
    rows = _count(num_sequences, "num_sequences", (tokens_per_row > 0).sum().to(loss_mat.dtype))
    if mode is LossAggregation.SEQ_MEAN_TOKEN_SUM:
        return masked.sum() / rows
    return (masked.sum(dim=1) / tokens_per_row.clamp_min(1)).sum() / rows


def _aggregation(mode: LossAggregation | str) -> LossAggregation:
    try:
        return LossAggregation(mode)
    except ValueError:
        raise ValueError(
            f"Unknown loss aggregation {mode!r}. Known: {[m.value for m in LossAggregation]}."
        ) from None


def _group_token_mean(masked: Tensor, tokens_per_row: Tensor, group_index: Tensor | None) -> Tensor:
    if group_index is None:
        raise ValueError(
            "aggregation 'token_mean_group' needs group_index, the (B,) prompt-group label of each row. "
            "Pass group_index, or use 'token_mean_global'."
        )
    ids, num_groups = group_ids_from_index(group_index, masked.shape[0])
    ids = ids.to(masked.device)
    group_sum = masked.new_zeros(num_groups).index_add(0, ids, masked.sum(dim=1))  # (P,)
    group_tokens = tokens_per_row.new_zeros(num_groups).index_add(0, ids, tokens_per_row)  # (P,)
    nonempty = group_tokens > 0
    per_group = torch.where(nonempty, group_sum / group_tokens.clamp_min(1), torch.zeros_like(group_sum))
    return per_group.sum() / nonempty.sum().clamp_min(1).to(masked.dtype)


def group_token_mean_weights(mask: Tensor, group_index: Tensor, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """Per-response weights that turn ``seq_mean_token_sum`` into ``token_mean_group``.

    With w_i = (B / P) / T_p(i) -- B responses, P groups with a valid token, T_p the valid tokens of
    response i's group -- ``sum_i w_i sum_t l_it / B`` equals the per-group token mean. Because the
    clipped surrogate is linear in a positive scale of A, multiplying the advantages by w gives that loss
    through any trainer whose loss divides by the number of responses (verl ``seq-mean-token-sum``).

    Args:
        mask: (B, L) bool or 0/1. Valid tokens.
        group_index: (B,) group labels (see :func:`~dapo_verl.core.advantages.group_ids_from_index`).
        dtype: Floating dtype of the result (use the advantages' dtype).

    Returns:
        (B,) weights; 0 for responses of a group with no valid token. Pair them with a
        ``seq_mean_token_sum`` divisor of B, all responses (verl's ``global_batch_size``).
    """
    mask = check_tensor("mask", mask, ndim=2, shape_doc="(B, L)")
    bool_mask = mask if mask.dtype == torch.bool else mask != 0
    ids, num_groups_seen = group_ids_from_index(group_index, bool_mask.shape[0])
    ids = ids.to(bool_mask.device)
    tokens_per_row = bool_mask.sum(dim=1).to(dtype)  # (B,)
    group_tokens = tokens_per_row.new_zeros(num_groups_seen).index_add(0, ids, tokens_per_row)  # (P,)
    num_groups = (group_tokens > 0).sum().clamp_min(1)
    per_group = torch.where(group_tokens > 0, 1.0 / group_tokens.clamp_min(1), torch.zeros_like(group_tokens))
    return per_group[ids] * (bool_mask.shape[0] / num_groups)


def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    *,
    clip_ratio_c: float | None = None,
    aggregation: LossAggregation | str = LossAggregation.TOKEN_MEAN_GLOBAL,
    group_index: Tensor | None = None,
    num_valid_tokens: int | Tensor | None = None,
) -> Tensor:
    """DAPO's decoupled-clip, token-level policy loss (the module formula).

    Args:
        logp: (B, L) float. Current-policy log-probs of the sampled tokens; the only input with gradient.
        old_logp: (B, L) float. Behaviour-policy log-probs (constant).
        advantages: (B,) float. One advantage per response (constant); (B, L) is accepted too.
        mask: (B, L) bool or 0/1. True where a token counts.
        clip_low: eps_low (paper 0.2).
        clip_high: eps_high (paper 0.28).
        clip_ratio_c: Optional dual-clip constant.
        aggregation: See :class:`LossAggregation`; default the global token mean.
        group_index: (B,) group labels, needed by ``token_mean_group``.
        num_valid_tokens: Valid tokens of the whole mini-batch when this call sees a micro-batch.

    Returns:
        0-dim loss; a differentiable zero when the mask is empty.

    Raises:
        TypeError: if an input is not a tensor or has a non-float dtype.
        ValueError: on mismatched shapes or devices, a non-0/1 mask, NaN at a valid position, or a clip
            width out of range.

    Example:
        >>> logp = torch.zeros(2, 3, requires_grad=True)
        >>> loss = dapo_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.ones(2, 3))
        >>> float(loss)
        0.0
    """
    loss_mat = clipped_surrogate_loss_matrix(
        logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high, clip_ratio_c=clip_ratio_c
    )
    return aggregate_loss(
        loss_mat, mask, aggregation, group_index=group_index, num_valid_tokens=num_valid_tokens
    )


def clip_diagnostics(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_ratio_c: float | None = None,
) -> dict[str, Tensor]:
    """Where the clip acts, as fractions of the valid tokens, plus ratio statistics.

    Args:
        logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c: As for
            :func:`clipped_surrogate_loss_matrix`.

    Returns:
        0-dim tensors (no gradient) under these keys:

        * ``clip_upper_fraction``: A > 0 and r > 1 + clip_high (clipped from above: no gradient).
        * ``clip_lower_fraction``: A < 0 and r < 1 - clip_low (clipped from below). The two sum to verl's
          ``actor/pg_clipfrac``.
        * ``dual_clip_fraction``: A < 0 and max(r, clip(r)) > clip_ratio_c (verl's
          ``actor/pg_clipfrac_lower``); 0 without dual clip.
        * ``clip_higher_kept_fraction``: A > 0 and 1 + clip_low < r <= 1 + clip_high: tokens a symmetric
          clip would have frozen that clip-higher keeps trainable.
        * ``ratio_mean``, ``ratio_min``, ``ratio_max``: over valid tokens (1 when there is none).
        * ``approx_kl``: mean of ``old_logp - logp`` over valid tokens, with the log-ratio clamped as for the
          ratio (verl's ``actor/ppo_kl``); 0 when there is no valid token.
    """
    logp, old_logp, bool_mask = _token_inputs(logp, old_logp, mask)
    clip_low, clip_high, clip_ratio_c = _check_clip(clip_low, clip_high, clip_ratio_c)
    adv = _per_token_advantages(advantages, logp, bool_mask).detach()
    with torch.no_grad():
        ratio = _ratio(logp.detach(), old_logp, bool_mask)
        adv = adv.to(ratio.dtype).expand_as(ratio)
        positive, negative = bool_mask & (adv > 0), bool_mask & (adv < 0)
        count = bool_mask.sum().clamp_min(1).to(ratio.dtype)

        def fraction(hit: Tensor) -> Tensor:
            return hit.sum().to(ratio.dtype) / count

        dual = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        if clip_ratio_c is not None:
            dual = fraction(negative & (torch.maximum(ratio, ratio.clamp(1 - clip_low, 1 + clip_high)) > clip_ratio_c))
        has_tokens = bool_mask.any()
        one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
        if ratio.numel() == 0:  # reductions of an empty tensor are undefined; there are no tokens either way
            ratio, bool_mask = one.reshape(1, 1), torch.ones(1, 1, dtype=torch.bool, device=ratio.device)
        return {
            "clip_upper_fraction": fraction(positive & (ratio > 1 + clip_high)),
            "clip_lower_fraction": fraction(negative & (ratio < 1 - clip_low)),
            "dual_clip_fraction": dual,
            "clip_higher_kept_fraction": fraction(positive & (ratio > 1 + clip_low) & (ratio <= 1 + clip_high)),
            "ratio_mean": torch.where(has_tokens, ratio[bool_mask].sum() / count, one),
            "ratio_min": torch.where(has_tokens, torch.where(bool_mask, ratio, torch.inf).amin(), one),
            "ratio_max": torch.where(has_tokens, torch.where(bool_mask, ratio, -torch.inf).amax(), one),
            "approx_kl": -torch.where(bool_mask, ratio.log(), torch.zeros_like(ratio)).sum() / count,
        }
