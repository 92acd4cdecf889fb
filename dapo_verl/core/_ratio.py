"""The policy loss's per-token inputs and their ratio, computed once and checked in one readback.

Shared by every function of :mod:`dapo_verl.core.losses`: :func:`token_inputs` and :func:`advantage_inputs`
check what the host can see (types, shapes, devices); :func:`ratio_terms` computes the log-ratio, the ratio
and the negated advantages that the loss and every diagnostic are derived from; :func:`evaluate` runs a
computation and reads all its value checks back in one host synchronisation.

Fast path and fallback. Padded positions may hold anything. With every value finite, a padded log-ratio
clamps to a finite ratio and a zeroed advantage makes its loss and gradient exactly zero, so the mask can
be applied by multiplication, several times cheaper on CPU than ``torch.where``. A NaN (or an inf
advantage) would survive that; it is detected by the same readback, then located (an error naming the
argument and index if it sits on a valid token), and if it sits only on padding the computation is redone
selecting the padding away first.

Infinite log-probs on valid tokens are refused (:func:`_infinite_log_probs`): clamping would make them a finite
ratio and a meaningless loss.

Shape legend: B responses, L padded response length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor

from dapo_verl.core._checks import (
    DeviceCheck,
    check_finite,
    check_no_nan,
    check_same_device,
    check_same_shape,
    check_tensor,
    compute_dtype,
    read_flags,
    run_device_checks,
)
from dapo_verl.core.aggregation import token_mask

__all__ = [
    "LOG_RATIO_CLAMP",
    "RatioTerms",
    "TokenInputs",
    "advantage_inputs",
    "evaluate",
    "has_nan_or_inf",
    "ratio_terms",
    "token_inputs",
]

LOG_RATIO_CLAMP = 20.0
"""Bound on |logp - old_logp| before exponentiating; the same stability clamp as verl's vanilla loss."""

_T = TypeVar("_T")


class TokenInputs(NamedTuple):
    """Per-token inputs that passed the checks the host can make, in the compute dtype."""

    logp: Tensor  # (B, L), the only input with gradient
    old_logp: Tensor  # (B, L), detached
    mask: Tensor  # (B, L) bool
    mask_float: Tensor  # (B, L) 0/1
    checks: list[DeviceCheck]  # the mask holds only 0 and 1 (deferred)
    given_dtype: torch.dtype  # logp's own dtype, the one its gradient arrives in


class RatioTerms(NamedTuple):
    """What the loss and every diagnostic are made of, computed once per call."""

    log_ratio: Tensor  # (B, L) clamped; finite, but arbitrary at padded positions unless masked first
    ratio: Tensor  # (B, L) exp(log_ratio)
    neg_advantages: Tensor  # (B, L) -A at valid positions, exactly 0 at padded ones; detached


def token_inputs(logp: object, old_logp: object, mask: object) -> TokenInputs:
    """Check types, shapes and devices of (logp, old_logp, mask); values are checked later, on the device."""
    logp = check_tensor("logp", logp, ndim=2, shape_doc="(B, L)")
    old_logp = check_tensor("old_logp", old_logp, ndim=2, shape_doc="(B, L)")
    for name, tensor in (("logp", logp), ("old_logp", old_logp)):
        if not tensor.is_floating_point():
            raise TypeError(f"{name} has dtype {tensor.dtype} but must be floating point. Convert it with .float().")
    check_same_shape("logp", logp, "old_logp", old_logp, hint="both must be (B, L) log-probs of the same tokens.")
    check_same_device("logp", logp, "old_logp", old_logp)
    dtype = compute_dtype(logp, old_logp)
    mask_bool, mask_float, checks = token_mask(mask, logp, dtype=dtype)
    return TokenInputs(logp.to(dtype), old_logp.detach().to(dtype), mask_bool, mask_float, checks, logp.dtype)


def advantage_inputs(advantages: object, tok: TokenInputs) -> Tensor:
    """Check advantages ((B,) or (B, L)) and return them detached, broadcastable to (B, L), in the compute dtype."""
    advantages = check_tensor("advantages", advantages, ndim=(1, 2), shape_doc="(B,) or (B, L)")
    if advantages.ndim == 1 and advantages.shape[0] != tok.logp.shape[0]:
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)} but logp has {tok.logp.shape[0]} rows; pass one "
            f"advantage per response, shape (B,) = ({tok.logp.shape[0]},)."
        )
    if advantages.ndim == 2:
        check_same_shape("logp", tok.logp, "advantages", advantages, hint="per-token advantages must be (B, L).")
    check_same_device("logp", tok.logp, "advantages", advantages)
    advantages = advantages.detach().to(tok.logp.dtype)
    return advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages  # (B, 1) or (B, L)


def ratio_terms(tok: TokenInputs, advantages: Tensor, *, mask_first: bool) -> RatioTerms:
    """Log-ratio, ratio and negated advantages; ``mask_first`` selects the padding away (see the module docstring).

    Args:
        tok: The checked per-token inputs.
        advantages: (B, 1) or (B, L) advantages from :func:`advantage_inputs`.
        mask_first: Select with ``torch.where`` before any arithmetic (for NaN or inf on padding), instead of
            multiplying by the 0/1 mask.

    Returns:
        :class:`RatioTerms`; ``neg_advantages`` is exactly 0 at padded positions either way.
    """
    if mask_first:  # a NaN or inf sits on padding: select it away before any arithmetic touches it
        zero = torch.zeros((), dtype=tok.logp.dtype, device=tok.logp.device)
        log_ratio = torch.where(tok.mask, tok.logp - tok.old_logp, zero)
        neg_advantages = torch.where(tok.mask, -advantages, zero)  # (B, L)
    else:
        # Every value is finite (the readback confirms it): a padded log-ratio clamps to a finite ratio and the
        # zeroed advantage there zeroes its loss and gradient. On CPU, multiplying by the 0/1 mask is several
        # times faster than torch.where.
        log_ratio = tok.logp - tok.old_logp
        neg_advantages = torch.mul(advantages, tok.mask_float).neg_()  # (B, L)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, L)
    return RatioTerms(log_ratio, torch.exp(log_ratio), neg_advantages)


def has_nan_or_inf(terms: RatioTerms) -> Tensor:
    """0-dim flag: a NaN reached the (clamped) log-ratio, or a NaN or inf the advantages, valid or padded."""
    return torch.isnan(terms.log_ratio.detach().sum()) | ~torch.isfinite(terms.neg_advantages.sum())


def _raise_for_invalid_values(tok: TokenInputs, advantages: Tensor | None) -> None:
    """Name the argument holding a NaN (or an inf advantage) at a valid position; return if all sit on padding.

    Runs only after a flag saw a NaN or inf somewhere; it reads the device several times.
    """
    fix = "A valid token's log-prob must be a number; check the model's forward pass for overflow."
    logp = tok.logp.detach()
    check_no_nan("logp", logp, where=tok.mask, fix=fix)
    check_no_nan("old_logp", tok.old_logp, where=tok.mask, fix=fix)  # an inf on a valid token was refused before
    if advantages is None:
        return
    valid = tok.mask.any(dim=1) if advantages.ndim == 1 else tok.mask
    check_finite("advantages", advantages.detach(), where=valid, fix="Check the reward and advantage computation.")


def evaluate(
    tok: TokenInputs, advantages: Tensor | None, compute: Callable[[bool], tuple[_T, Tensor, list[DeviceCheck]]]
) -> _T:
    """Run ``compute(mask_first=False)`` and check it in one readback; redo it masking first if padding holds NaN.

    ``compute`` returns its result, a flag set when a NaN or inf reached it (:func:`has_nan_or_inf`, or the
    loss's own finiteness), and its deferred checks. ``advantages`` is the caller's tensor (for messages),
    or None. When the flag is set, the inputs are searched for the NaN or inf; if it sits only on padding,
    the result is recomputed masking first and its checks (overflow among them) decide.
    """
    result, nan_or_inf, checks = compute(False)
    first = [*tok.checks, _infinite_log_probs(tok)]
    hits = read_flags([*(check.flag for check in first), nan_or_inf, *(check.flag for check in checks)])
    for hit, check in zip(hits, first):  # a non-0/1 mask first: it makes every other check meaningless
        if hit:
            check.fail()
    if hits[len(first)]:
        _raise_for_invalid_values(tok, advantages)
        result, _, checks = compute(True)
        run_device_checks(checks)
        return result
    for hit, check in zip(hits[len(first) + 1 :], checks):
        if hit:
            check.fail()
    return result


def _infinite_log_probs(tok: TokenInputs) -> DeviceCheck:
    """Refuse +-inf log-probs on valid tokens (padding may hold anything).

    The log-ratio clamp would turn them into a finite ratio and a loss that means nothing: ``-inf`` is the
    log-prob of a token the policy cannot produce, which cannot have been sampled, and ``+inf`` is no log-prob.
    The flag is two sums (an inf or a NaN anywhere makes one non-finite); only when it is set are the valid
    positions searched, and an inf or a sum that overflowed on padding alone passes.
    """
    logp = tok.logp.detach()
    flag = ~torch.isfinite(logp.sum() + tok.old_logp.sum())

    def fail() -> None:
        for name, values in (("logp", logp), ("old_logp", tok.old_logp)):
            infinite = torch.isinf(values) & tok.mask
            if bool(infinite.any()):
                index = tuple(int(i) for i in infinite.nonzero()[0])
                raise ValueError(
                    f"{name} is {values[index].item()} at index {index}, a valid token; a log-prob there must be "
                    f"finite (-inf is a token the policy cannot produce, so it cannot have been sampled; +inf is no "
                    f"log-prob), and the clamped ratio would hide it. Check the forward pass and the log-prob gather, "
                    f"or mask the token out."
                )

    return DeviceCheck(flag, fail)
