"""Token-level aggregation of a per-token loss (arXiv 2503.14476, Eq. 10, §3.3) and its variants.

    L = sum_{i,t} m_it * l_it / N,    N = the valid tokens of the whole mini-batch      (token-level loss)

The divisor is the token count of the whole mini-batch, not of the micro-batch a call sees, so that
micro-batching, gradient accumulation and data parallelism give the loss of one device with one batch; the
caller passes it as ``num_valid_tokens``. It is validated: a finite whole number no smaller than the valid
tokens of the call's own mask (the whole mini-batch includes them). A wrong count scales every gradient
silently, so it is refused with the value and the fix rather than clamped.

Departure from the paper: its normaliser can also be read per prompt group (verl#2776);
``token_mean_group`` offers that reading. The global token mean is the default.

Shape legend: B responses, L padded response length, P prompt groups.
"""

from __future__ import annotations

from enum import StrEnum

import torch
from torch import Tensor

from dapo_verl.core._checks import (
    DeviceCheck,
    check_number,
    check_real_data,
    check_same_device,
    check_same_shape,
    check_tensor,
    run_device_checks,
)
from dapo_verl.core.advantages import group_ids_from_index

__all__ = ["LossAggregation", "aggregate_loss", "group_token_mean_weights"]


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


def token_mask(mask: object, like: Tensor, *, dtype: torch.dtype) -> tuple[Tensor, Tensor, list[DeviceCheck]]:
    """Validate a (B, L) mask (bool or 0/1) against ``like``; nothing is read back from the device here.

    Args:
        mask: (B, L) bool, integer or float; True / 1 where a token counts.
        like: (B, L) the per-token tensor the mask belongs to (named ``logp`` in messages).
        dtype: Floating dtype of the 0/1 copy.

    Returns:
        ``(mask_bool, mask_float, checks)``: the mask as bool and as 0/1 in ``dtype``, both (B, L), and the
        deferred check that a non-bool mask holds only 0 and 1 (run it with the caller's other checks).
    """
    mask = check_tensor("mask", mask, ndim=2, shape_doc="(B, L)")
    check_same_shape(
        "logp",
        like,
        "mask",
        mask,
        hint="all per-token inputs must be (B, L). Slice the response the same way for both.",
    )
    check_same_device("logp", like, "mask", mask)
    mask_float = mask.to(dtype)  # (B, L)
    if mask.dtype == torch.bool:
        return mask, mask_float, []

    def fail() -> None:
        raise ValueError(
            f"mask has values other than 0 and 1 (dtype {mask.dtype}); a token either counts or it does not. "
            f"Pass a bool mask or a 0/1 mask; put per-token weights into the loss, not the mask."
        )

    not_binary = torch.count_nonzero(mask_float * (1 - mask_float)) > 0  # x (1 - x) = 0 only for 0 and 1
    return mask != 0, mask_float, [DeviceCheck(not_binary, fail)]


def divisor(
    value: int | float | Tensor | None, name: str, local: Tensor, *, dtype: torch.dtype, counted: str, whole: str
) -> tuple[Tensor, list[DeviceCheck]]:
    """A loss divisor: the caller's count of the whole mini-batch, else this call's own; never below 1.

    Args:
        value: The caller's count (a Python number or a one-element tensor), or None.
        name: Its argument name, for messages (``num_valid_tokens``, ``num_sequences``).
        local: 0-dim int64 count of what this call's mask holds (a floor for ``value``).
        dtype: The loss's dtype, the divisor's.
        counted: What ``local`` counts, for messages (e.g. "valid tokens").
        whole: What ``value`` counts over the whole mini-batch, for the fix (e.g. "valid tokens").

    Returns:
        ``(divisor, checks)``: a 0-dim tensor in ``dtype``, and deferred checks that ``value`` is a finite
        whole number no smaller than ``local`` (compared exactly, in float64).

    Raises:
        TypeError: if ``value`` is neither a real number nor a real tensor.
        ValueError: for what can be seen without reading the device: a negative, non-finite or fractional
            Python number, or a tensor with more than one element.
    """
    if value is None:
        return local.clamp_min(1).to(dtype), []
    fix = (
        f"Pass the number of {whole} of the whole mini-batch (every micro-batch and data-parallel rank), or "
        f"None to divide by this call's own count."
    )
    if isinstance(value, Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} has dtype {value.dtype} but must be a real number. {fix}")
        check_real_data(name, value)  # a meta tensor: no count to read
        if value.numel() != 1:
            raise ValueError(
                f"{name} has shape {tuple(value.shape)} but must be a single number (an int or a "
                f"one-element tensor). {fix}"
            )
        count = value.reshape(()).to(device=local.device, dtype=torch.float64)
        shown = count
    else:
        number = check_number(name, value, minimum=0, fix=fix)
        if not number.is_integer():
            raise ValueError(f"{name}={value!r} is not a whole number; it counts {whole}. {fix}")
        count = local.new_tensor(number, dtype=torch.float64)
        shown = None
    result = count.to(dtype)

    def show() -> str:
        return repr(value) if shown is None else f"{shown.item():g}"

    def not_finite() -> None:
        raise ValueError(f"{name}={show()} is not a finite number in {dtype}; it divides the loss. {fix}")

    def fractional() -> None:
        raise ValueError(f"{name}={show()} is not a whole number; it counts {whole}. {fix}")

    def too_small() -> None:
        have = int(local.item())
        raise ValueError(
            f"{name}={show()} is smaller than the {have} {counted} in this call's mask; it must count those of the "
            f"whole mini-batch, this call's included, and a smaller count inflates the loss and its gradient. {fix}"
        )

    checks = [DeviceCheck(~torch.isfinite(result), not_finite)]
    if shown is not None:
        checks.append(DeviceCheck(count != count.round(), fractional))
    checks.append(DeviceCheck(count < local, too_small))
    return result.clamp_min(1), checks


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
        loss_mat: (B, L) float. Per-token loss, e.g. from :func:`~dapo_verl.core.clipped_surrogate_loss_matrix`;
            its padded positions are ignored, whatever they hold.
        mask: (B, L) bool or 0/1. True where a token counts.
        mode: The aggregation.
        group_index: (B,) integer group label of each row; required for ``token_mean_group``.
        num_valid_tokens: Valid tokens of the whole mini-batch (``token_mean_global``) when this call sees
            one micro-batch of it; defaults to this call's count. A finite whole number >= this call's count.
        num_sequences: Responses of the whole mini-batch (``seq_mean_*``); defaults to this call's
            non-empty responses. A finite whole number >= this call's non-empty responses.

    Returns:
        0-dim tensor; a differentiable zero when no token is valid.

    Raises:
        ValueError: for a non-0/1 mask, an unknown mode, or a count that is not a finite whole number at least
            this call's own (the message names the count and what to pass).

    Example:
        >>> loss_mat = torch.tensor([[1.0, 3.0, 9.0], [5.0, 9.0, 9.0]])
        >>> mask = torch.tensor([[True, True, False], [True, False, False]])
        >>> aggregate_loss(loss_mat, mask)  # (1 + 3 + 5) / 3 valid tokens
        tensor(3.)
        >>> aggregate_loss(loss_mat, mask, num_valid_tokens=6)  # this micro-batch holds 3 of the batch's 6
        tensor(1.5000)
    """
    loss_mat = check_tensor("loss_mat", loss_mat, ndim=2, shape_doc="(B, L)")
    dtype = loss_mat.dtype if loss_mat.is_floating_point() else torch.float32
    mask_bool, mask_float, checks = token_mask(mask, loss_mat, dtype=dtype)
    masked = torch.where(mask_bool, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    loss, count_checks = masked_aggregate(
        masked,
        mask_float,
        mode,
        group_index=group_index,
        num_valid_tokens=num_valid_tokens,
        num_sequences=num_sequences,
    )
    run_device_checks(checks + count_checks)
    return loss


def masked_aggregate(
    masked: Tensor,
    mask_float: Tensor,
    mode: LossAggregation | str,
    *,
    group_index: Tensor | None,
    num_valid_tokens: int | Tensor | None,
    num_sequences: int | Tensor | None,
) -> tuple[Tensor, list[DeviceCheck]]:
    """:func:`aggregate_loss` for a loss already exactly 0 at padded positions; its checks are deferred.

    Args:
        masked: (B, L) float loss, 0 where ``mask_float`` is 0.
        mask_float: (B, L) 0/1 in ``masked``'s dtype.
        mode, group_index, num_valid_tokens, num_sequences: As for :func:`aggregate_loss`.

    Returns:
        ``(loss, checks)``: the 0-dim loss and the deferred checks of the counts.
    """
    mode = _aggregation(mode)
    if mode is LossAggregation.TOKEN_MEAN_GLOBAL:
        local = torch.count_nonzero(mask_float)
        tokens, checks = divisor(
            num_valid_tokens,
            "num_valid_tokens",
            local,
            dtype=masked.dtype,
            counted="valid tokens",
            whole="valid tokens",
        )
        return masked.sum() / tokens, checks
    tokens_per_row = mask_float.sum(dim=1)  # (B,)
    if mode is LossAggregation.TOKEN_MEAN_GROUP:
        return _group_token_mean(masked, tokens_per_row, group_index), []
    local = torch.count_nonzero(tokens_per_row)
    rows, checks = divisor(
        num_sequences, "num_sequences", local, dtype=masked.dtype, counted="non-empty responses", whole="responses"
    )
    if mode is LossAggregation.SEQ_MEAN_TOKEN_SUM:
        return masked.sum() / rows, checks
    return (masked.sum(dim=1) / tokens_per_row.clamp_min(1)).sum() / rows, checks


def _aggregation(mode: LossAggregation | str) -> LossAggregation:
    try:
        return LossAggregation(mode)
    except ValueError:
        raise ValueError(f"Unknown loss aggregation {mode!r}. Known: {[m.value for m in LossAggregation]}.") from None


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
