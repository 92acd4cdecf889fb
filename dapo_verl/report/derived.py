"""Step metrics that are ratios of two logged metrics, so that they are exact whatever the batching.

verl logs each loss metric once per micro-batch and averages the values with equal weights over
micro-batches, data-parallel ranks and mini-batches (``verl.utils.metric.Metric``, ``reduce_metrics``). A
per-micro-batch *mean over some tokens* averaged that way is wrong whenever micro-batches hold different
numbers of those tokens, and undefined (NaN) in a micro-batch that has none. So the dapo loss logs sums and
counts instead (:func:`dapo_verl.core.clip_diagnostics`): both are averaged with the same weights, so their
ratio is the exact mean over the step's tokens -- ``(sum / k) / (count / k) = sum / count`` (exact when every
mini-batch of a step has as many micro-batches per rank, as with a fixed micro-batch size).

:data:`RATIO_METRICS` names each ratio and its two parts; :func:`derive_ratios` computes them for one step.
The local backend logs the ratios itself; ``dapo-verl compare`` adds them to any log holding the parts
(:func:`dapo_verl.report.readers.load_run`). When the count is 0 -- no token was clipped in the step -- the
mean is undefined and the step has no value (NaN, written as null), never 0: a run's average then runs over the
steps where tokens were clipped, and the count, logged beside it, says how often that was.

Pure Python: no numpy, pandas or torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["RATIO_METRICS", "RATIO_PARTS", "derive_ratios"]

_DAPO = "actor/dapo/"

RATIO_METRICS: dict[str, tuple[str, str]] = {
    f"{_DAPO}clip_upper_old_prob_mean": (f"{_DAPO}clip_upper_old_prob_sum", f"{_DAPO}clip_upper_tokens"),
    f"{_DAPO}clip_higher_kept_old_prob_mean": (
        f"{_DAPO}clip_higher_kept_old_prob_sum",
        f"{_DAPO}clip_higher_kept_tokens",
    ),
    f"{_DAPO}clip_upper_positive_share": (f"{_DAPO}clip_upper_tokens", f"{_DAPO}positive_advantage_tokens"),
}
"""Ratio metric -> (numerator, denominator), all logged per step under verl's ``actor/`` prefix:

* ``clip_upper_old_prob_mean``: mean old-policy probability of the tokens clipped at 1 + eps_high (A > 0);
* ``clip_higher_kept_old_prob_mean``: the same for the tokens only clip-higher keeps trainable
  (A > 0, 1 + eps_low < r <= 1 + eps_high; none when eps_high = eps_low);
* ``clip_upper_positive_share``: share of the positive-advantage tokens clipped at the upper bound -- how
  much of what the upper clip can act on it does act on.
"""

RATIO_PARTS = frozenset(part for parts in RATIO_METRICS.values() for part in parts)
"""Every metric a ratio is made of (a report reader must keep them)."""


def derive_ratios(data: Mapping[str, float | None]) -> dict[str, float]:
    """The ratio metrics of one step's metrics ``data``: every ratio whose two parts are logged (finite).

    Returns:
        Ratio key -> numerator / denominator, NaN where the denominator is 0 (undefined: nothing was counted).

    Example:
        >>> derive_ratios({"actor/dapo/clip_upper_old_prob_sum": 0.3, "actor/dapo/clip_upper_tokens": 2.0,
        ...                "actor/dapo/positive_advantage_tokens": 0.0})
        {'actor/dapo/clip_upper_old_prob_mean': 0.15, 'actor/dapo/clip_upper_positive_share': nan}
    """
    ratios = {}
    for key, (top, bottom) in RATIO_METRICS.items():
        numerator, denominator = data.get(top), data.get(bottom)
        if numerator is None or denominator is None or not (math.isfinite(numerator) and math.isfinite(denominator)):
            continue
        ratios[key] = numerator / denominator if denominator > 0 else math.nan
    return ratios
