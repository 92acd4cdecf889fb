"""Per-run and per-arm statistics of the key metrics of a DAPO ablation.

Per run and metric (only the steps where the run logged the metric count):

* ``final`` -- for a validation metric (key starting ``val-``), the last logged value (the evaluation of
  the final policy); for a training metric, the mean of the last ``ceil(last_frac * n)`` of its ``n``
  logged values (at least one), because per-step training metrics are noisy. When that value, or one in
  that window, was logged as NaN, inf or null, ``final`` is None and ``nonfinite_step`` names the step: an
  earlier finite value is never presented as the final one.
* ``run_mean`` -- the mean of every logged value over the whole run (for validation metrics this includes
  an evaluation of the initial policy at step 0 when one was logged).

Per arm (the runs sharing a label, e.g. seeds), for ``final`` and ``run_mean`` separately: the mean, the
sample standard deviation (ddof=1; None for a single run), the min and max, and ``n``, the number of the
arm's runs that logged the metric. A metric missing in every run of an arm gives ``n = 0`` and None
everywhere (rendered "n/a").

Default metrics (:func:`select_metrics` with no request): held-out accuracy ``val-core/<source>/acc/mean@<N>``
(every data source present, the largest N of each; verl's ``val-core/<source>/reward/mean@<N>`` when no run
logs ``acc``), pass@k ``val-*/<source>/acc/best@<k>/mean`` (:func:`pass_at_k_keys`), then :data:`DEFAULT_METRICS`
that at least one run logged.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dapo_verl.report.derived import RATIO_METRICS, RATIO_PARTS
from dapo_verl.report.runlog import RunLog, is_validation_metric

__all__ = [
    "CLIPPED_PROBABILITY_METRICS",
    "CLIP_METRICS",
    "DEFAULT_LAST_FRAC",
    "DEFAULT_METRICS",
    "ArmMetric",
    "RunValue",
    "Spread",
    "UnknownMetricError",
    "accuracy_keys",
    "arm_metric",
    "is_validation_metric",
    "kept_metric",
    "pass_at_k_keys",
    "run_value",
    "select_metrics",
]

DEFAULT_LAST_FRAC = 0.2
"""Share of a training metric's logged values (the last ones) averaged into its final value."""

CLIP_METRICS = (
    "actor/pg_clipfrac",
    "actor/dapo/clip_upper_fraction",
    "actor/dapo/clip_lower_fraction",
    "actor/dapo/clip_higher_kept_fraction",
)
"""verl's clip fraction and the dapo loss's upper/lower split and clip-higher share (adapter/losses.py)."""

CLIPPED_PROBABILITY_METRICS = (
    *RATIO_METRICS,
    "actor/dapo/clip_upper_old_prob_max",
    "actor/dapo/clip_higher_kept_old_prob_max",
)
"""The old-policy probability of the clipped tokens (mean, max) and the upper clip's share of the positive-advantage
tokens (:mod:`dapo_verl.report.derived`; paper §3.1, Fig. 3b)."""

DEFAULT_METRICS = (
    "actor/entropy",
    "response_length/mean",
    *CLIP_METRICS,
    *CLIPPED_PROBABILITY_METRICS,
    "dapo/sampler/prefilter_acc",
    "dapo/sampler/generated_per_trained",
)
"""The training metrics reported after the accuracy and pass@k keys, in this order, when some run logged them."""

_ACCURACY = re.compile(r"^val-core/(?P<source>.+)/(?P<var>acc|reward)/mean@(?P<n>\d+)$")
_PASS_AT_K = re.compile(r"^val-(?:core|aux)/(?P<source>.+)/acc/best@(?P<k>\d+)/mean$")
_GLOB_CHARS = frozenset("*?[")


class UnknownMetricError(ValueError):
    """A requested metric (or pattern) matches no metric any run logged."""


def accuracy_keys(available: Sequence[str]) -> list[str]:
    """The held-out accuracy keys among ``available``: per data source, ``acc/mean@N`` with the largest N.

    Example:
        >>> accuracy_keys(["val-core/aime/acc/mean@32", "val-core/aime/acc/mean@4", "val-aux/aime/score/mean@32",
        ...                "val-core/math/acc/mean@1", "actor/entropy"])
        ['val-core/aime/acc/mean@32', 'val-core/math/acc/mean@1']
    """
    best: dict[tuple[str, str], tuple[int, str]] = {}
    for key in available:
        match = _ACCURACY.match(key)
        if match:
            slot = (match["var"], match["source"])
            best[slot] = max(best.get(slot, (-1, "")), (int(match["n"]), key))
    var = "acc" if any(v == "acc" for v, _ in best) else "reward"
    return [key for (v, _), (_, key) in sorted(best.items()) if v == var]


def pass_at_k_keys(available: Sequence[str]) -> list[str]:
    """The pass@k keys among ``available`` (verl's ``val-*/<source>/acc/best@<k>/mean``), by source, then k.

    Example:
        >>> pass_at_k_keys(["val-core/x/acc/best@8/mean", "val-aux/x/acc/best@2/mean", "val-aux/x/acc/best@2/std"])
        ['val-aux/x/acc/best@2/mean', 'val-core/x/acc/best@8/mean']
    """
    found = [(m["source"], int(m["k"]), key) for key in available if (m := _PASS_AT_K.match(key))]
    return [key for _, _, key in sorted(found)]


def select_metrics(available: Sequence[str], requested: Sequence[str] | None = None) -> list[str]:
    """The metrics to report.

    Args:
        available: Every metric logged by at least one run.
        requested: Metric names or glob patterns (``val-core/*/acc/mean@*``), in report order; None for the
            defaults described in the module docstring.

    Returns:
        Metric keys, without duplicates.

    Raises:
        UnknownMetricError: if a requested name or pattern matches no available metric; the message lists
            close matches.
    """
    if requested is None:
        chosen = (
            accuracy_keys(available) + pass_at_k_keys(available) + [k for k in DEFAULT_METRICS if k in set(available)]
        )
        return list(dict.fromkeys(chosen))
    chosen = []
    for item in requested:
        if _GLOB_CHARS & set(item):
            matches = sorted(fnmatch.filter(available, item))
        else:
            matches = [item] if item in available else []
        if not matches:
            raise UnknownMetricError(_unknown_metric_message(item, available))
        chosen.extend(matches)
    return list(dict.fromkeys(chosen))


def kept_metric(requested: Sequence[str] | None = None) -> Callable[[str], bool]:
    """Whether a reader must keep a metric's values for a report of ``requested`` (as :func:`select_metrics`).

    Keeps what the report may need: the requested names and patterns, every held-out accuracy and pass@k key,
    :data:`DEFAULT_METRICS` (the plots draw them whatever is requested) and the parts of the ratio metrics.

    Example:
        >>> keep = kept_metric(["dapo/sampler/*"])
        >>> [keep(k) for k in ("dapo/sampler/keep_rate", "actor/entropy", "val-core/x/acc/mean@1", "perf/mfu")]
        [True, True, True, False]
    """
    items = list(requested or ())

    def keep(key: str) -> bool:
        if key in DEFAULT_METRICS or key in RATIO_PARTS or _ACCURACY.match(key) or _PASS_AT_K.match(key):
            return True
        return any(key == item or (bool(_GLOB_CHARS & set(item)) and fnmatch.fnmatch(key, item)) for item in items)

    return keep


def _unknown_metric_message(item: str, available: Sequence[str]) -> str:
    close = difflib.get_close_matches(item, available, n=5, cutoff=0.5)
    prefix = item.split("/")[0] + "/"
    close += [k for k in sorted(available) if k.startswith(prefix) and k not in close][: max(0, 5 - len(close))]
    hint = f"close matches: {', '.join(close)}" if close else f"{len(available)} metrics were logged"
    return f"no run logged the metric {item!r}; {hint}. Check --metrics (glob patterns such as 'val-core/*' work)."


@dataclass(frozen=True)
class RunValue:
    """One run's summary of one metric; None fields when the run never logged it.

    Attributes:
        final: The final value (see the module docstring); None when it is not finite.
        run_mean: The mean over the whole run (of the finite values).
        last_step: The last step at which the metric was logged with a finite value.
        points: How many finite values were logged.
        nonfinite_step: The step of a NaN, inf or null value that makes the final value undefined (the last
            value of a validation metric, or one in a training metric's final window), else None. The report
            flags it rather than presenting an earlier finite value as the final one.
    """

    final: float | None
    run_mean: float | None
    last_step: int | None
    points: int
    nonfinite_step: int | None = None


def run_value(run: RunLog, key: str, *, last_frac: float = DEFAULT_LAST_FRAC) -> RunValue:
    """Summarise metric ``key`` of one run (see the module docstring for ``final`` and ``run_mean``).

    Raises:
        ValueError: if ``last_frac`` is not in (0, 1].
    """
    if not 0.0 < last_frac <= 1.0:
        raise ValueError(f"last_frac (--last-frac) must be in (0, 1], got {last_frac}.")
    values = run.series(key)
    bad = run.nonfinite.get(key, ())
    logged = sorted({*(int(step) for step in values.index), *bad})  # every step that logged it, finite or not
    tail = 1 if is_validation_metric(key) else max(1, math.ceil(last_frac * len(logged) - 1e-9))
    spoiled = [step for step in logged[-tail:] if step in set(bad)]
    if values.empty:
        return RunValue(
            final=None, run_mean=None, last_step=None, points=0, nonfinite_step=spoiled[-1] if spoiled else None
        )
    final = None if spoiled else float(values.loc[logged[-tail] :].mean())
    return RunValue(
        final=final,
        run_mean=float(values.mean()),
        last_step=int(values.index[-1]),
        points=len(values),
        nonfinite_step=spoiled[-1] if spoiled else None,
    )


@dataclass(frozen=True)
class Spread:
    """Mean and spread of one number across an arm's runs (None fields when no run has it).

    Attributes:
        mean: Mean over the runs that logged the metric.
        std: Sample standard deviation (ddof=1); None when fewer than 2 runs logged it.
        min: Smallest value.
        max: Largest value.
        n: Number of runs that logged the metric.
    """

    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        """The spread of the non-None ``values``."""
        present = [v for v in values if v is not None]
        if not present:
            return cls(mean=None, std=None, min=None, max=None, n=0)
        std = statistics.stdev(present) if len(present) > 1 else None
        return cls(mean=statistics.fmean(present), std=std, min=min(present), max=max(present), n=len(present))


@dataclass(frozen=True)
class ArmMetric:
    """One metric of one arm.

    Attributes:
        arm: The arm's label.
        metric: The metric key.
        final: Spread of the runs' final values.
        run_mean: Spread of the runs' whole-run means.
        runs: Number of runs in the arm (``final.n`` of them logged the metric).
        per_run: Each run's :class:`RunValue`, keyed by the run's path as given.
    """

    arm: str
    metric: str
    final: Spread
    run_mean: Spread
    runs: int
    per_run: Mapping[str, RunValue]


def arm_metric(arm: str, runs: Sequence[RunLog], key: str, *, last_frac: float = DEFAULT_LAST_FRAC) -> ArmMetric:
    """Summarise metric ``key`` over the runs of one arm."""
    values = {str(run.path): run_value(run, key, last_frac=last_frac) for run in runs}
    return ArmMetric(
        arm=arm,
        metric=key,
        final=Spread.of([v.final for v in values.values()]),
        run_mean=Spread.of([v.run_mean for v in values.values()]),
        runs=len(runs),
        per_run=values,
    )
