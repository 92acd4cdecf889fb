"""verl policy loss ``dapo``: verl's keyword signature in, ``dapo_verl.core`` for the math, verl's ``agg_loss`` out.

With the same actor config it equals verl's ``vanilla`` loss (and its gradient) exactly: both take the
clip widths ``clip_ratio_low``/``clip_ratio_high`` (falling back to ``clip_ratio``), dual clip
``clip_ratio_c``, multiply by ``rollout_is_weights`` and aggregate with
``agg_loss(..., **config.global_batch_info)``, so token-mean is the exact global mean of the mini-batch
under micro-batching, gradient accumulation and data parallelism. What it adds are the metrics, derived
from the same ratio as the loss in one core call (no second validation, no boolean indexing) and read back
in one transfer: two host synchronisations per call, against three for ``vanilla``'s three ``.item()``.

Metrics (averaged over micro-batches and data-parallel ranks by verl): verl's ``actor/pg_clipfrac``,
``actor/ppo_kl`` and ``actor/pg_clipfrac_lower`` (dual clip), plus ``actor/dapo/clip_upper_fraction``,
``actor/dapo/clip_lower_fraction``, ``actor/dapo/dual_clip_fraction``,
``actor/dapo/clip_higher_kept_fraction`` (tokens with A > 0 and 1 + eps_low < r <= 1 + eps_high: trainable
only because of clip-higher) and ``actor/dapo/ratio_mean|min|max`` (min and max are per micro-batch,
then averaged). Each name starts with ``actor/`` because verl prefixes every other loss metric with it
(``dapo/actor/x`` would be logged as ``actor/dapo/actor/x``); the local backend logs the same names.

The old-policy probability of the clipped tokens (paper §3.1, Fig. 3b) is logged as parts that verl's
equal-weight averaging keeps exact: ``actor/dapo/positive_advantage_tokens``, ``clip_upper_tokens``,
``clip_upper_old_prob_sum``, ``clip_higher_kept_tokens`` and ``clip_higher_kept_old_prob_sum`` (counts and
sums of the micro-batch; verl averages them, so each ratio of two of them is the step's exact mean), and
``clip_upper_old_prob_max`` / ``clip_higher_kept_old_prob_max`` (the micro-batch's largest, 0 when none,
averaged by verl like ``ratio_max``: a lower bound of the step's largest). A mean per micro-batch is not
logged: verl would average it with equal weights, which is wrong for micro-batches holding different
numbers of clipped tokens and undefined for one holding none. ``dapo-verl compare`` turns the parts into
``actor/dapo/clip_upper_old_prob_mean``, ``clip_higher_kept_old_prob_mean`` and ``clip_upper_positive_share``
(:mod:`dapo_verl.report.derived`); the local backend logs those too.
"""

from __future__ import annotations

from typing import Any

import torch

from dapo_verl.core import clipped_surrogate_with_diagnostics

__all__ = ["clip_settings", "compute_policy_loss_dapo"]


def clip_settings(config: Any) -> dict[str, float]:
    """``clip_low``, ``clip_high``, ``clip_ratio_c`` from a verl actor config, with verl's fallbacks."""
    if config is None:
        raise ValueError(
            "The dapo policy loss needs the actor config (clip_ratio_low/high/c, global_batch_info); verl passes "
            "it as config=. Call it the way verl.workers.utils.losses.ppo_loss does."
        )
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return {"clip_low": low, "clip_high": high, "clip_ratio_c": config.clip_ratio_c}


def compute_policy_loss_dapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO's decoupled-clip loss for verl (registered as ``dapo``); arguments are verl's, all (B, L)."""
    from verl.trainer.ppo.core_algos import agg_loss

    clip = clip_settings(config)
    loss_mat, diagnostics = clipped_surrogate_with_diagnostics(
        log_prob, old_log_prob, advantages, response_mask, **clip
    )  # (B, L), one ratio for both
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    loss = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    stats = dict(zip(diagnostics, torch.stack(list(diagnostics.values())).tolist()))  # one device sync
    metrics = {
        "actor/pg_clipfrac": stats["clip_upper_fraction"] + stats["clip_lower_fraction"],
        "actor/ppo_kl": stats.pop("approx_kl"),
        "actor/pg_clipfrac_lower": stats["dual_clip_fraction"],
        **{f"actor/dapo/{key}": value for key, value in stats.items()},
    }
    return loss, metrics
