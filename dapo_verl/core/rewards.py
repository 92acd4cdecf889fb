"""Overlong reward shaping (DAPO, arXiv 2503.14476, §3.4, Eq. 13) and truncation masks.

Soft overlong punishment, with L_max = max_response_length and L_buf = overlong_tokens:

    R_length(y) = 0                                          if |y| <= L_max - L_buf
                = -factor * s((|y| - (L_max - L_buf)) / L_buf)   if L_max - L_buf < |y| < L_max
                = -factor                                    if |y| >= L_max

where ``s`` is a penalty schedule mapping the buffer fraction in [0, 1] to [0, 1]; the paper's is
linear, ``s(x) = x``. The penalty is added to the sequence reward -- never to log-probabilities.

Overlong filtering (§3.4) instead gives truncated responses no loss: :func:`truncated_response_mask`
finds them and :func:`mask_truncated_responses` zeroes their tokens in the loss mask.

Departures, and why:
* Past L_max the penalty stays at -factor (the paper's case). verl's ``dapo`` reward manager keeps
  decreasing linearly there; with generation truncated at L_max the two never differ.
* Schedules other than linear come from a small registry (``quadratic`` ships), not from subclassing.

Shape legend: N responses in a flat list, B responses, L padded response length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dapo_verl.core._checks import check_finite, check_float_dtype, check_number, check_tensor
from dapo_verl.core.registry import Registry

__all__ = [
    "OVERLONG_SCHEDULES",
    "OverlongSchedule",
    "get_overlong_schedule",
    "mask_truncated_responses",
    "overlong_penalty",
    "register_overlong_schedule",
    "reward_overlong_penalty",
    "truncated_response_mask",
]

OverlongSchedule = Callable[[Tensor], Tensor]
"""Maps the buffer fraction x in [0, 1] (elementwise) to a penalty fraction in [0, 1], with s(0)=0, s(1)=1.
Every call is checked: a value that is not finite, lies outside [0, 1], or is not 0 at x=0 raises ValueError."""

OVERLONG_SCHEDULES: Registry[OverlongSchedule] = Registry(
    "overlong schedule",
    "Register new schedules with @register_overlong_schedule(name) in dapo_verl/core/rewards.py.",
)


def register_overlong_schedule(name: str) -> Callable[[OverlongSchedule], OverlongSchedule]:
    """Decorator registering a penalty schedule under ``name`` (see :data:`OverlongSchedule`).

    Example:
        >>> get_overlong_schedule("quadratic")(torch.tensor([0.0, 0.5, 1.0]))
        tensor([0.0000, 0.2500, 1.0000])
    """
    return OVERLONG_SCHEDULES.decorator(name)


def get_overlong_schedule(name: str) -> OverlongSchedule:
    """The schedule registered under ``name``; ValueError listing the known names otherwise."""
    return OVERLONG_SCHEDULES.get(name)


@register_overlong_schedule("linear")
def _linear(x: Tensor) -> Tensor:
    """The paper's ramp: the penalty grows in proportion to how far into the buffer the response goes."""
    return x


@register_overlong_schedule("quadratic")
def _quadratic(x: Tensor) -> Tensor:
    """Gentle at the start of the buffer, steep near the limit."""
    return x * x


def _check_overlong_args(max_response_length: int, overlong_tokens: int, overlong_penalty_factor: float) -> None:
    for name, value in (("max_response_length", max_response_length), ("overlong_tokens", overlong_tokens)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer number of tokens, got {type(value).__name__} {value!r}.")
    if max_response_length <= 0:
        raise ValueError(
            f"max_response_length={max_response_length} must be positive; it is the generation budget in tokens. "
            f"Set data.max_response_length (the paper uses 20480)."
        )
    if overlong_tokens <= 0:
        raise ValueError(
            f"overlong_tokens={overlong_tokens} must be positive; it is the length of the penalty ramp. "
            f"Set overlong_tokens > 0 (the paper uses 4096), or disable overlong_reward_penalty."
        )
    if overlong_tokens > max_response_length:
        raise ValueError(
            f"overlong_tokens={overlong_tokens} exceeds max_response_length={max_response_length}; the penalty ramp "
            f"must fit inside the response budget. Set overlong_tokens <= {max_response_length} (the paper uses "
            f"4096 of 20480)."
        )
    check_number(
        "overlong_penalty_factor",
        overlong_penalty_factor,
        minimum=0.0,
        fix="Use a non-negative factor (the paper uses 1.0); 0 disables the penalty.",
    )


def _check_lengths(response_lengths: object) -> Tensor:
    lengths = check_tensor("response_lengths", response_lengths, ndim=1, shape_doc="(N,)")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(
            f"response_lengths has dtype {lengths.dtype} but must be an integer dtype (int64, int32, ...); lengths "
            f"are whole token counts, and a fractional one would shift the penalty. Count the valid response tokens "
            f"(response_mask.sum(-1)), or convert whole-valued lengths with .long()."
        )
    if bool((lengths < 0).any()):
        raise ValueError(
            f"response_lengths holds a negative length ({int(lengths.min())}); lengths are token counts. "
            f"Count the valid response tokens (response_mask.sum(-1))."
        )
    return lengths


def overlong_penalty(
    response_lengths: Tensor,
    max_response_length: int,
    overlong_tokens: int,
    overlong_penalty_factor: float,
    *,
    schedule: str = "linear",
) -> Tensor:
    """The soft overlong punishment alone (the module formula).

    Args:
        response_lengths: (N,) integer. Valid tokens of each response.
        max_response_length: L_max, the generation budget in tokens.
        overlong_tokens: L_buf, the length of the penalty ramp before L_max.
        overlong_penalty_factor: The penalty at and beyond L_max (paper 1.0).
        schedule: A name registered with :func:`register_overlong_schedule`.

    Returns:
        (N,) float32 penalties in [-factor, 0] on the lengths' device.

    Raises:
        ValueError: if overlong_tokens <= 0, overlong_tokens > max_response_length, the factor is negative,
            a length is negative, the schedule is unknown, or it returned a value outside [0, 1], a non-finite
            one, or a penalty below the buffer.
        TypeError: if the lengths are not an integer tensor (a float, bool, complex or meta tensor is refused), or
            the schedule returned something other than one value per response.

    Example:
        >>> overlong_penalty(torch.tensor([10, 16, 18, 20, 25]), 20, 4, 1.0)
        tensor([ 0.0000,  0.0000, -0.5000, -1.0000, -1.0000])
    """
    lengths = _check_lengths(response_lengths)
    _check_overlong_args(max_response_length, overlong_tokens, overlong_penalty_factor)
    ramp = get_overlong_schedule(schedule)
    start = max_response_length - overlong_tokens
    fraction = ((lengths.to(torch.float32) - start) / overlong_tokens).clamp(0.0, 1.0)  # (N,)
    shares = _checked_schedule(schedule, fraction, ramp(fraction))  # (N,)
    return 0.0 - float(overlong_penalty_factor) * shares  # 0 - x keeps +0.0


def _checked_schedule(name: str, fraction: Tensor, shares: object) -> Tensor:
    """``shares`` if schedule ``name`` kept its contract on ``fraction``: one finite value in [0, 1] per response,
    0 where the response ends before the buffer (fraction 0). One readback.

    Raises:
        TypeError, ValueError: naming the schedule, the offending value and the buffer fraction it came from.
    """
    fix = f"Fix the function registered with @register_overlong_schedule({name!r})."
    if not isinstance(shares, Tensor) or shares.shape != fraction.shape:
        shape = tuple(shares.shape) if isinstance(shares, Tensor) else type(shares).__name__
        raise TypeError(
            f"overlong schedule {name!r} returned {shape} for buffer fractions of shape "
            f"{tuple(fraction.shape)}; a schedule maps each fraction to one value, elementwise. {fix}"
        )
    bad = ~torch.isfinite(shares) | (shares < 0) | (shares > 1) | ((fraction == 0) & (shares != 0))  # (N,)
    if bool(bad.any()):
        index = int(bad.nonzero()[0])
        raise ValueError(
            f"overlong schedule {name!r} returned {shares[index].item()} for buffer fraction "
            f"{fraction[index].item():g} (response {index}); a schedule must map [0, 1] to finite values in [0, 1] "
            f"with 0 at 0 -- no penalty before the buffer -- or it changes every shaped reward. {fix}"
        )
    return shares


def reward_overlong_penalty(
    rewards: Tensor,
    response_lengths: Tensor,
    max_response_length: int,
    overlong_tokens: int,
    overlong_penalty_factor: float,
    *,
    schedule: str = "linear",
) -> Tensor:
    """Sequence rewards plus the soft overlong punishment; the input is not modified.

    Args:
        rewards: (N,) float. Sequence rewards (e.g. +1 correct / -1 wrong).
        response_lengths: (N,) integer. Valid tokens of each response.
        max_response_length, overlong_tokens, overlong_penalty_factor, schedule: As for
            :func:`overlong_penalty`.

    Returns:
        (N,) shaped rewards in ``rewards.dtype``; never above the input reward.

    Raises:
        ValueError: as :func:`overlong_penalty`, plus mismatched shapes or non-finite rewards.
        TypeError: as :func:`overlong_penalty`, plus rewards that are not floating point.

    Example:
        >>> reward_overlong_penalty(torch.tensor([1.0, 1.0, -1.0]), torch.tensor([5, 19, 30]), 20, 4, 1.0)
        tensor([ 1.0000,  0.2500, -2.0000])
    """
    rewards = check_tensor("rewards", rewards, ndim=1, shape_doc="(N,)")
    check_float_dtype("rewards", rewards)
    check_finite("rewards", rewards, fix="Check the reward function; every response needs a finite score.")
    lengths = _check_lengths(response_lengths)
    if lengths.shape != rewards.shape:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)} but response_lengths has shape {tuple(lengths.shape)}; "
            f"pass one length per reward."
        )
    penalty = overlong_penalty(
        lengths, max_response_length, overlong_tokens, overlong_penalty_factor, schedule=schedule
    )
    return rewards + penalty.to(device=rewards.device, dtype=rewards.dtype)


def truncated_response_mask(
    response_lengths: Tensor, max_response_length: int, *, eos_emitted: Tensor | None = None
) -> Tensor:
    """Which responses were cut off at the generation budget (the target of overlong filtering).

    Args:
        response_lengths: (N,) integer. Valid tokens of each response.
        max_response_length: The generation budget in tokens.
        eos_emitted: (N,) bool, optional. True if the response ended with an end-of-sequence token; a
            response that fills the budget exactly with EOS as its last token is complete, not truncated.

    Returns:
        (N,) bool; True for truncated responses.

    Example:
        >>> truncated_response_mask(torch.tensor([3, 8, 8]), 8, eos_emitted=torch.tensor([True, False, True]))
        tensor([False,  True, False])
    """
    lengths = _check_lengths(response_lengths)
    if isinstance(max_response_length, bool) or not isinstance(max_response_length, int) or max_response_length <= 0:
        raise ValueError(
            f"max_response_length={max_response_length!r} must be a positive integer number of tokens. "
            f"Set data.max_response_length."
        )
    truncated = lengths >= max_response_length
    if eos_emitted is not None:
        eos_emitted = check_tensor("eos_emitted", eos_emitted, ndim=1, shape_doc="(N,)")
        if eos_emitted.shape != lengths.shape:
            raise ValueError(
                f"eos_emitted has shape {tuple(eos_emitted.shape)} but response_lengths has shape "
                f"{tuple(lengths.shape)}; pass one flag per response."
            )
        truncated = truncated & ~eos_emitted.to(torch.bool)
    return truncated


def mask_truncated_responses(mask: Tensor, truncated: Tensor) -> Tensor:
    """Overlong filtering: a copy of the loss mask with every token of a truncated response switched off.

    Args:
        mask: (B, L) bool or 0/1. Loss mask.
        truncated: (B,) bool. From :func:`truncated_response_mask`.

    Returns:
        (B, L) mask of the same dtype; the input is not modified.
    """
    mask = check_tensor("mask", mask, ndim=2, shape_doc="(B, L)")
    truncated = check_tensor("truncated", truncated, ndim=1, shape_doc="(B,)")
    if truncated.shape[0] != mask.shape[0]:
        raise ValueError(
            f"truncated has {truncated.shape[0]} entries but mask has {mask.shape[0]} rows; pass one flag per response."
        )
    keep = ~truncated.to(device=mask.device, dtype=torch.bool)
    return mask * keep.unsqueeze(-1).to(mask.dtype)  # (B, L)
