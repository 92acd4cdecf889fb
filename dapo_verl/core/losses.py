"""DAPO's decoupled-clip policy loss and its diagnostics (arXiv 2503.14476, Eq. 8 and 10).

    r_it = exp(logp_it - old_logp_it)
    l_it = -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)        (clip-higher, §3.1)
    L    = sum_{i,t} m_it * l_it / sum_{i,t} m_it                                (token-level loss, §3.3)

The mean runs over every valid token of the whole mini-batch, not over per-response means, so long
responses weigh in proportion to their length (see :mod:`dapo_verl.core.aggregation`, which also holds the
other aggregations). Under micro-batching or data parallelism the divisor is the token count of the whole
mini-batch, passed in explicitly as ``num_valid_tokens``.

One pass: the inputs are validated once and the ratio is computed once; the loss and every diagnostic are
derived from it, with no boolean indexing. The public functions are thin wrappers of one body (``_clipped``), which
holds no defaults: the paper's widths are the wrappers' (:data:`CLIP_LOW`, :data:`CLIP_HIGH`). Checks on values
(NaN, a non-0/1 mask, overflow, token counts) are computed on the device and read back together: one host
synchronisation per call. Inputs holding NaN or inf cost more: the readback finds them, further reads name
the argument and index, and if they sit only on padding the call is recomputed masking first
(:mod:`dapo_verl.core._ratio`).

Departures from the paper, and why:
* Optional dual clip (``clip_ratio_c``, arXiv 1912.09729): for A < 0 the per-token loss is capped at
  ``-A * clip_ratio_c``. The published verl DAPO run uses 10; the paper's formula has none, so the default
  here is off.
* ``log_ratio`` is clamped to [-20, 20] before exponentiating, as verl's ``vanilla`` loss does, so the two
  agree value-for-value and gradient-for-gradient.
* Losses that cannot be represented are refused, not returned as inf: when advantages times ratios, summed
  over the tokens, overflow the compute dtype (advantages near 1e38 in float32), the call raises a
  ``ValueError`` naming the advantages. Group-normalised advantages are of order 1, so such values point at
  a bug upstream; computing silently in float64 would hide it and still overflow float32 gradients. Pass
  float64 log-probs to compute in float64 deliberately.

Padded positions never reach the loss: their advantage is zeroed and their log-ratio clamped before
exponentiating, so -inf or huge values there give a finite loss and exactly zero gradient (NaN there is
selected away, see above). Ratios are computed in float32, or float64 if any input is float64.

Shape legend: B responses, L padded response length, P prompt groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dapo_verl.core._checks import DeviceCheck, check_number
from dapo_verl.core._clip_stats import Clip, clip_statistics
from dapo_verl.core._ratio import (
    LOG_RATIO_CLAMP,
    RatioTerms,
    TokenInputs,
    advantage_inputs,
    evaluate,
    has_nan_or_inf,
    ratio_terms,
    token_inputs,
)
from dapo_verl.core.aggregation import (
    LossAggregation,
    aggregate_loss,
    group_token_mean_weights,
    masked_aggregate,
)

__all__ = [
    "CLIP_HIGH",
    "CLIP_LOW",
    "LOG_RATIO_CLAMP",
    "ClippedSurrogate",
    "LossAggregation",
    "aggregate_loss",
    "clip_diagnostics",
    "clipped_surrogate_loss_matrix",
    "clipped_surrogate_with_diagnostics",
    "dapo_loss",
    "group_token_mean_weights",
    "policy_ratio",
]

CLIP_LOW = 0.2
"""eps_low, the paper's (§3.1): the default of every loss here and of ``actor_rollout_ref.actor.clip_ratio_low``."""

CLIP_HIGH = 0.28
"""eps_high, the paper's clip-higher (§3.1): the default of every loss here and of
``actor_rollout_ref.actor.clip_ratio_high``."""

_LARGEST_RATIO = math.exp(LOG_RATIO_CLAMP)  # no ratio exceeds it: the log-ratio is clamped first


class ClippedSurrogate(NamedTuple):
    """The per-token loss and its diagnostics, from one ratio (see :func:`clipped_surrogate_with_diagnostics`)."""

    loss_matrix: Tensor
    """(B, L) per-token loss in the compute dtype; exactly 0 at padded positions."""
    diagnostics: dict[str, Tensor]
    """0-dim tensors without gradient, under the keys of :func:`clip_diagnostics`."""


def _check_clip(clip_low: float, clip_high: float, clip_ratio_c: float | None) -> Clip:
    clip_low = check_number(
        "clip_low",
        clip_low,
        minimum=0.0,
        maximum=1.0,
        fix="Use a width in [0, 1], e.g. 0.2 (paper §3.1, clip_ratio_low).",
    )
    clip_high = check_number(
        "clip_high", clip_high, minimum=0.0, fix="Use a non-negative width, e.g. 0.28 (paper §3.1, clip_ratio_high)."
    )
    if clip_ratio_c is not None:
        clip_ratio_c = check_number(
            "clip_ratio_c",
            clip_ratio_c,
            minimum=1.0,
            min_inclusive=False,
            fix="Dual clip needs clip_ratio_c > 1 (as in verl); the published DAPO run "
            "uses 10. Pass None to disable it.",
        )
        clip_ratio_c = min(clip_ratio_c, _LARGEST_RATIO)
    # A bound above the largest ratio the log-ratio clamp allows never binds; held there, it stays representable in
    # float32 (1 + 1e308 is not), and every loss and fraction is the same as with the bound as given.
    return Clip(clip_low, min(clip_high, _LARGEST_RATIO), clip_ratio_c)


def _surrogate(terms: RatioTerms, clip: Clip) -> Tensor:
    """The (B, L) clipped surrogate l = max(-A r, -A clip(r)), with verl's operations in verl's order.

    With dual clip, min(l, |A| c): for A < 0 that is verl's cap -A c, and for A >= 0 the cap never binds
    (l <= 0 <= |A| c), which saves verl's select on the sign of A. Padded positions give 0: their A is 0.
    """
    neg_advantages, ratio = terms.neg_advantages, terms.ratio
    loss = torch.maximum(neg_advantages * ratio, neg_advantages * ratio.clamp(1.0 - clip.low, 1.0 + clip.high))
    if clip.dual is None:
        return loss  # (B, L)
    return torch.minimum(loss, neg_advantages.abs() * clip.dual)  # (B, L)


def _loss_checks(tok: TokenInputs, terms: RatioTerms, loss_mat: Tensor) -> tuple[Tensor, list[DeviceCheck]]:
    """The flag "the loss is not finite" and the deferred checks that the loss and its gradient are representable.

    A NaN or inf among the inputs reaches the loss, so the one flag also covers :func:`has_nan_or_inf`.
    """
    not_finite = ~torch.isfinite(loss_mat.detach().sum())

    def overflow() -> None:
        largest = float(terms.neg_advantages.abs().amax())
        dtype = loss_mat.dtype
        raise ValueError(
            f"advantages reach {largest:.3g} in absolute value, and advantages times ratios summed over the tokens "
            f"overflow {str(dtype).removeprefix('torch.')} (largest finite value {torch.finfo(dtype).max:.3g}): the "
            f"loss would be inf or NaN. Group-normalised advantages are of order 1; check the reward and "
            f"advantage computation, or pass float64 log-probs to compute the loss in float64."
        )

    checks = [DeviceCheck(not_finite, overflow)]
    if tok.given_dtype == torch.float16 and loss_mat.numel():  # float16's range ends at 65504; bfloat16's does not
        limit = torch.finfo(torch.float16).max
        peak = (terms.neg_advantages.abs() * terms.ratio.detach()).amax()

        def float16_overflow() -> None:
            raise ValueError(
                f"logp is float16, and advantages times ratios reach {float(peak):.3g}, beyond float16's range "
                f"({limit:.0f}): the gradient would overflow to inf. Pass log-probs as bfloat16 or float32, or "
                f"check the advantages."
            )

        checks.append(DeviceCheck(peak > limit, float16_overflow))
    return not_finite, checks


_Aggregate = Callable[[Tensor, Tensor], tuple[Tensor, list[DeviceCheck]]]


def _clipped(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None,
    *,
    loss: bool,
    diagnostics: bool,
    aggregate: _Aggregate | None,
) -> Any:
    """The one body of the public functions below: the inputs validated once, one ratio, one readback.

    Returns, by what is asked: ``aggregate(loss_matrix, mask)`` when ``aggregate`` is given; a
    :class:`ClippedSurrogate` when ``loss`` (its diagnostics empty unless ``diagnostics``); or, when not ``loss``,
    the diagnostics alone, computed without gradient and without the loss's overflow checks.
    """
    tok = token_inputs(logp, old_logp, mask)
    clip = _check_clip(clip_low, clip_high, clip_ratio_c)
    adv = advantage_inputs(advantages, tok)

    def compute(mask_first: bool) -> tuple[Any, Tensor, list[DeviceCheck]]:
        if not loss:
            with torch.no_grad():
                terms = ratio_terms(tok, adv, mask_first=mask_first)
                return clip_statistics(terms, tok, clip), has_nan_or_inf(terms), []
        terms = ratio_terms(tok, adv, mask_first=mask_first)
        loss_mat = _surrogate(terms, clip)  # (B, L)
        not_finite, checks = _loss_checks(tok, terms, loss_mat)
        if aggregate is not None:
            value, count_checks = aggregate(loss_mat, tok.mask_float)
            return value, not_finite, checks + count_checks
        stats = clip_statistics(terms, tok, clip) if diagnostics else {}
        return ClippedSurrogate(loss_mat, stats), not_finite, checks

    return evaluate(tok, advantages, compute)


def policy_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Importance ratio pi_theta / pi_old per token, masked before exponentiating.

    Args:
        logp: (B, L) float. Log-probs of the sampled tokens under the current policy (requires grad).
        old_logp: (B, L) float. Log-probs under the policy that generated them (a constant).
        mask: (B, L) bool or 0/1. True where a token counts.

    Returns:
        (B, L) ratio in float32 (float64 if an input is float64); exactly 1 at padded positions.

    Raises:
        ValueError: on mismatched shapes or devices, a non-0/1 mask, or NaN at a valid position.
    """
    tok = token_inputs(logp, old_logp, mask)
    no_advantages = torch.zeros(tok.logp.shape[0], 1, dtype=tok.logp.dtype, device=tok.logp.device)  # (B, 1)

    def compute(_fast: bool) -> tuple[Tensor, Tensor, list[DeviceCheck]]:
        terms = ratio_terms(tok, no_advantages, mask_first=True)  # the contract says 1 at padding: always select
        return terms.ratio, has_nan_or_inf(terms), []

    return evaluate(tok, None, compute)


def clipped_surrogate_loss_matrix(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
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
        clip_ratio_c: Dual-clip constant (> 1), or None for no dual clip.

    Returns:
        (B, L) loss in the compute dtype; exactly 0 at padded positions.

    Raises:
        TypeError, ValueError: as :func:`dapo_loss`.
    """
    return _clipped(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low,
        clip_high,
        clip_ratio_c,
        loss=True,
        diagnostics=False,
        aggregate=None,
    ).loss_matrix


def clipped_surrogate_with_diagnostics(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
    clip_ratio_c: float | None = None,
    diagnostics: bool = True,
) -> ClippedSurrogate:
    """The per-token loss and the clip diagnostics in one pass: one validation, one ratio, one readback.

    Equal to :func:`clipped_surrogate_loss_matrix` and :func:`clip_diagnostics` called separately, but the two
    share the validation, the ratio and the readback. This is what a trainer that logs the clip fractions
    should call (verl's ``dapo`` policy loss does).

    Args:
        logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c: As for
            :func:`clipped_surrogate_loss_matrix`.
        diagnostics: Compute the diagnostics (False leaves the dict empty).

    Returns:
        :class:`ClippedSurrogate`: ``loss_matrix`` (B, L), exactly 0 at padded positions, and ``diagnostics``.

    Raises:
        TypeError, ValueError: as :func:`dapo_loss`.
    """
    return _clipped(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low,
        clip_high,
        clip_ratio_c,
        loss=True,
        diagnostics=diagnostics,
        aggregate=None,
    )


def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
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
        num_valid_tokens: Valid tokens of the whole mini-batch when this call sees a micro-batch: a finite
            whole number (int or one-element tensor), at least the valid tokens of ``mask``.

    Returns:
        0-dim loss; a differentiable zero when the mask is empty.

    Raises:
        TypeError: if an input is not a tensor or has a non-float dtype.
        ValueError: on mismatched shapes or devices, a non-0/1 mask, NaN at a valid position, a clip width
            out of range, a bad ``num_valid_tokens``, or a loss that overflows the compute dtype.

    Example:
        >>> logp = torch.zeros(2, 3, requires_grad=True)
        >>> loss = dapo_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.ones(2, 3))
        >>> float(loss)
        0.0
    """

    def aggregate(loss_mat: Tensor, mask_float: Tensor) -> tuple[Tensor, list[DeviceCheck]]:
        return masked_aggregate(
            loss_mat,
            mask_float,
            aggregation,
            group_index=group_index,
            num_valid_tokens=num_valid_tokens,
            num_sequences=None,
        )

    return _clipped(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low,
        clip_high,
        clip_ratio_c,
        loss=True,
        diagnostics=False,
        aggregate=aggregate,
    )


def clip_diagnostics(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
    clip_ratio_c: float | None = None,
) -> dict[str, Tensor]:
    """Where the clip acts, as fractions of the valid tokens, plus ratio statistics.

    A trainer that also needs the loss gets both from one pass with :func:`clipped_surrogate_with_diagnostics`.

    Args:
        logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c: As for
            :func:`clipped_surrogate_loss_matrix`.

    Returns:
        0-dim tensors (no gradient) under these keys:

        * ``clip_upper_fraction``: A > 0 and r > 1 + clip_high (clipped from above: no gradient).
        * ``clip_lower_fraction``: A < 0 and r < 1 - clip_low (clipped from below). The two sum to verl's
          ``actor/pg_clipfrac``.
        * ``dual_clip_fraction``: A < 0 and max(r, clip(r)) > clip_ratio_c, i.e. r > clip_ratio_c (verl's
          ``actor/pg_clipfrac_lower``); 0 without dual clip.
        * ``clip_higher_kept_fraction``: A > 0 and 1 + clip_low < r <= 1 + clip_high: tokens a symmetric
          clip would have frozen that clip-higher keeps trainable.
        * ``ratio_mean``, ``ratio_min``, ``ratio_max``: over valid tokens (1 when there is none).
        * ``approx_kl``: mean of ``old_logp - logp`` over valid tokens, with the log-ratio clamped as for the
          ratio (verl's ``actor/ppo_kl``); 0 when there is no valid token.

        The old-policy probability p = exp(old_logp) of the tokens where the clip acts (paper §3.1, Fig. 3b:
        the upper clip holds back low-probability tokens), as sums and counts, so that they add up across
        micro-batches and ranks; their mean over a training step is ``sum / tokens`` over the step
        (:data:`dapo_verl.report.derived.RATIO_METRICS`):

        * ``positive_advantage_tokens``: valid tokens with A > 0 (what the upper clip can act on).
        * ``clip_upper_tokens``, ``clip_upper_old_prob_sum``, ``clip_upper_old_prob_max``: count of the tokens
          of ``clip_upper_fraction``, sum and max of their p; the max is 0 when there is none.
        * ``clip_higher_kept_tokens``, ``clip_higher_kept_old_prob_sum``, ``clip_higher_kept_old_prob_max``:
          the same for the tokens of ``clip_higher_kept_fraction``.

        p is read with ``old_logp`` capped at 0 (probability at most 1).

    Raises:
        TypeError, ValueError: as :func:`dapo_loss` (the loss itself is not computed, so no overflow check).
    """
    return _clipped(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low,
        clip_high,
        clip_ratio_c,
        loss=False,
        diagnostics=True,
        aggregate=None,
    )
