"""The clip diagnostics of :mod:`dapo_verl.core.losses`: clip fractions, ratio statistics and the old-policy
probability of the tokens clipped from above or kept by clip-higher, from the ratio the loss already computed.

Shape legend: B responses, L padded response length.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from dapo_verl.core._ratio import LOG_RATIO_CLAMP, RatioTerms, TokenInputs

__all__ = ["DIAGNOSTICS", "Clip", "clip_statistics"]

_ABOVE_EVERY_RATIO = 2 * math.exp(LOG_RATIO_CLAMP)  # added to padded ratios so that a min never picks one


class Clip(NamedTuple):
    """The checked clip widths (``low``, ``high``) and the dual-clip cap (``dual``, or None)."""

    low: float
    high: float
    dual: float | None


def clip_statistics(terms: RatioTerms, tok: TokenInputs, clip: Clip) -> dict[str, Tensor]:
    """The clip fractions, ratio statistics and clipped-token probabilities of :func:`clip_diagnostics`."""
    with torch.no_grad():
        ratio, log_ratio, mask_float = terms.ratio.detach(), terms.log_ratio.detach(), tok.mask_float
        if ratio.numel() == 0:  # reductions of an empty tensor are undefined; there are no tokens either way
            return dict(zip(DIAGNOSTICS, ratio.new_tensor([0.0, 0, 0, 0, 1, 1, 1, 0, *[0] * 7]).unbind()))
        # r * sign(-A): > 0 exactly where A < 0 and < 0 where A > 0; 0 at padding and where A = 0
        signed = ratio * terms.neg_advantages.sign()  # (B, L)
        upper_hit = signed < -(1 + clip.high)  # A > 0, r > 1 + eps_high
        kept_hit = (signed < -(1 + clip.low)) & ~upper_hit  # A > 0, 1 + eps_low < r <= 1 + eps_high
        upper, kept = torch.count_nonzero(upper_hit), torch.count_nonzero(kept_hit)
        lower = torch.count_nonzero(signed > 0) - torch.count_nonzero(signed >= 1 - clip.low)  # A < 0, r < 1 - eps_low
        dual = torch.count_nonzero(signed > clip.dual) if clip.dual is not None else torch.zeros_like(upper)
        count = torch.count_nonzero(tok.mask)
        per_token = count.clamp_min(1).to(ratio.dtype)
        fractions = torch.stack([upper, lower, dual, kept]) / per_token  # (4,)
        flat_mask = mask_float.reshape(-1)
        ratio_stats = torch.stack(
            [
                torch.dot(ratio.reshape(-1), flat_mask) / per_token,  # mean
                torch.add(ratio, 1 - mask_float, alpha=_ABOVE_EVERY_RATIO).amin(),  # min: padding lifted out of reach
                (ratio * mask_float).amax(),  # max: ratios are > 0, padding is 0
            ]
        )
        ratio_stats = torch.where(count > 0, ratio_stats, 1.0)  # (3,)
        approx_kl = -torch.dot(log_ratio.reshape(-1), flat_mask) / per_token
        probabilities = _clipped_probabilities(tok.old_logp, signed < 0, upper_hit, kept_hit)
        return dict(zip(DIAGNOSTICS, (*fractions.unbind(), *ratio_stats.unbind(), approx_kl, *probabilities)))


def _clipped_probabilities(old_logp: Tensor, positive: Tensor, upper_hit: Tensor, kept_hit: Tensor) -> list[Tensor]:
    """Token counts and old-policy probabilities of the tokens clipped from above and kept by clip-higher.

    ``torch.where`` selects, so whatever padding holds (NaN, inf) never reaches a sum; a log-prob above 0 is
    read as probability 1 (a probability cannot exceed it).
    """
    old_prob = old_logp.detach().clamp(max=0.0).exp()  # (B, L)
    zero = old_prob.new_zeros(())
    upper_prob, kept_prob = torch.where(upper_hit, old_prob, zero), torch.where(kept_hit, old_prob, zero)  # (B, L)
    counts = torch.stack(
        [torch.count_nonzero(positive), torch.count_nonzero(upper_hit), torch.count_nonzero(kept_hit)]
    ).to(old_prob.dtype)  # (3,)
    return [counts[0], counts[1], upper_prob.sum(), upper_prob.amax(), counts[2], kept_prob.sum(), kept_prob.amax()]


DIAGNOSTICS = (
    "clip_upper_fraction",
    "clip_lower_fraction",
    "dual_clip_fraction",
    "clip_higher_kept_fraction",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "approx_kl",
    "positive_advantage_tokens",
    "clip_upper_tokens",
    "clip_upper_old_prob_sum",
    "clip_upper_old_prob_max",
    "clip_higher_kept_tokens",
    "clip_higher_kept_old_prob_sum",
    "clip_higher_kept_old_prob_max",
)
