"""One run's metrics as a table (:class:`RunLog`), and the compact columns a log reader streams records into.

Every reader of :mod:`dapo_verl.report.readers` hands each ``(step, {metric: value})`` record to
:class:`MetricColumns`, which checks what holds in any log, whatever wrote it:

* the step is a whole number in [0, 2**63) -- NaN, Infinity, 1e300 or 2.5 belong to no training step;
* an accuracy (:func:`is_accuracy_metric`: a key with an ``acc`` part, such as ``val-core/aime/acc/mean@32``,
  ``val-aux/aime/acc/best@4/mean`` or ``dapo/sampler/prefilter_acc``) lies in [0, 1]: it is a share of correct
  answers, so 7.5 means a damaged log or a misnamed metric, never a result to report.

Either failure is an error naming the record (file and line, or TensorBoard tag). Values that are not finite
numbers (null, NaN, inf, text) count as not logged. Metric names an older dapo_verl logged are renamed to today's
(:func:`current_name`), and a log holding the parts of a ratio metric gets the ratio (:func:`with_ratio_metrics`).
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dapo_verl.report.derived import RATIO_METRICS

__all__ = [
    "LogFormat",
    "MetricColumns",
    "MetricFilter",
    "RunLog",
    "as_step",
    "current_name",
    "is_accuracy_metric",
    "is_validation_metric",
    "records_table",
    "with_ratio_metrics",
]

_MAX_STEP = 2**63 - 1
_ACCURACY_PART = re.compile(r"(?:^|/)acc(?:/|$)|_acc$")

MetricFilter = Callable[[str], bool]
"""Whether a reader keeps a metric's values (every name is still counted in :attr:`RunLog.metrics`)."""


class LogFormat(StrEnum):
    """The logger that wrote a run's metrics (the order is the order of preference in a directory)."""

    JSONL = "jsonl"
    TENSORBOARD = "tensorboard"
    CONSOLE = "console"


@dataclass(frozen=True)
class RunLog:
    """One run's metrics.

    Attributes:
        path: The path the user gave (file or directory).
        source: The file or directory the metrics were read from.
        format: The logger format of ``source``.
        table: Float table indexed by step (int, ascending, unique), one column per kept metric; NaN where
            a metric was not logged at that step.
        logged: Every metric name the run logged with a finite value at least once, kept in ``table`` or
            not; None means the columns of ``table``.
        nonfinite: Kept metric -> the steps at which it was logged as NaN, inf or null (verl writes NaN as
            null) and no finite value replaced it; ``table`` holds NaN there, as where it was not logged.
        notes: What the reader left out of ``table`` and why, one sentence each (a last line cut short by a
            crash); reports list them as warnings.
    """

    path: Path
    source: Path
    format: LogFormat
    table: pd.DataFrame
    logged: frozenset[str] | None = None
    nonfinite: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def metrics(self) -> list[str]:
        """The metric names this run logged at least once, sorted."""
        if self.logged is not None:
            return sorted(self.logged)
        return sorted(str(c) for c in self.table.columns if self.table[c].notna().any())

    def series(self, key: str) -> pd.Series:
        """The logged values of ``key`` (index: step), NaN-free; empty when the run never logged it."""
        if key not in self.table.columns:
            return pd.Series(dtype=float, index=pd.Index([], dtype="int64", name="step"), name=key)
        return self.table[key].dropna()


def is_validation_metric(key: str) -> bool:
    """True for verl's validation metrics (``val-core/...``, ``val-aux/...``): their final value is the last one."""
    return key.startswith("val-")


def is_accuracy_metric(key: str) -> bool:
    """True for a share of correct answers, which lies in [0, 1]: a key with an ``acc`` part or an ``_acc`` end.

    Example:
        >>> [is_accuracy_metric(k) for k in ("val-core/aime/acc/mean@32", "dapo/sampler/prefilter_acc",
        ...                                  "val-aux/aime/acc/best@4/mean", "val-core/aime/reward/mean@32")]
        [True, True, True, False]
    """
    return bool(_ACCURACY_PART.search(key))


def _keep_all(key: str) -> bool:
    return True


_RENAMED_PREFIXES = (("dapo/actor/", "actor/dapo/"),)
"""Metric prefixes older dapo_verl runs logged, and today's names (verl's ``actor/`` prefix turned the loss
metrics ``dapo/actor/x`` into ``actor/dapo/actor/x``, so they became ``actor/dapo/x`` everywhere)."""


def current_name(key: str) -> str:
    """Today's name of a metric an older run logged under an earlier name.

    Example:
        >>> current_name("dapo/actor/clip_upper_fraction")
        'actor/dapo/clip_upper_fraction'
    """
    for old, new in _RENAMED_PREFIXES:
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def as_step(value: Any, where: str) -> int:
    """A logged step as an int.

    Raises:
        ValueError: naming ``where`` unless ``value`` is a whole number in [0, 2**63).
    """
    whole = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value, whole = int(value), True
    if whole and 0 <= value <= _MAX_STEP:
        return int(value)
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    raise ValueError(
        f"{where}: step {shown} is not a whole number between 0 and 2**63 - 1, so its metrics belong to "
        f"no training step. Fix or delete that line."
    )


def _as_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


def _check_accuracy(key: str, value: float, where: str) -> None:
    if not math.isnan(value) and not 0.0 <= value <= 1.0 and is_accuracy_metric(key):
        raise ValueError(
            f"{where}: {key} = {value:g} is outside [0, 1]; an accuracy is a share of correct answers, so "
            "the log is damaged or the metric misnamed. Fix or delete that record, or leave this run out."
        )


class MetricColumns:
    """Collects ``(step, {metric: value})`` records as one compact column (8-byte step, 8-byte value) per kept metric.

    Args:
        keep: Which metrics to keep values of (None: every one); every name counts in ``logged``.
    """

    def __init__(self, keep: MetricFilter | None) -> None:
        self.keep = keep or _keep_all
        self.record_steps = array("q")
        self.steps: dict[str, array] = {}
        self.values: dict[str, array] = {}
        self.logged: set[str] = set()
        self.nonfinite_steps: dict[str, array] = {}
        self.notes: list[str] = []  # what the reader left out, and why (RunLog.notes)
        self._kept: dict[str, bool] = {}

    def add(self, step: int, data: Mapping[str, Any], where: str | None = None) -> None:
        """Add one record.

        Raises:
            ValueError: naming ``where`` (default: the step) for an accuracy outside [0, 1].
        """
        self.record_steps.append(step)
        for name, raw in data.items():
            key, value = current_name(str(name)), _as_float(raw)
            _check_accuracy(key, value, where or f"the record of step {step}")
            if not math.isnan(value):
                self.logged.add(key)
            kept = self._kept.get(key)
            if kept is None:
                kept = self._kept[key] = bool(self.keep(key))
            if kept:
                self.steps.setdefault(key, array("q")).append(step)
                self.values.setdefault(key, array("d")).append(value)
                if math.isnan(value):
                    self.nonfinite_steps.setdefault(key, array("q")).append(step)

    def __len__(self) -> int:
        return len(self.record_steps)

    def nonfinite(self, table: pd.DataFrame) -> dict[str, tuple[int, ...]]:
        """Per kept metric, the steps whose final value (later values win) is not finite."""
        return {
            key: tuple(sorted({int(s) for s in steps if math.isnan(table.at[int(s), key])}))
            for key, steps in self.nonfinite_steps.items()
            if key in table.columns
        }

    def table(self) -> pd.DataFrame:
        """The step x metric float table: later values win, steps ascending and unique."""
        index = pd.Index(np.unique(np.frombuffer(self.record_steps, dtype=np.int64)), dtype="int64", name="step")
        columns = {}
        for key in sorted(self.values):
            steps = pd.Index(np.frombuffer(self.steps[key], dtype=np.int64), name="step")
            series = pd.Series(np.frombuffer(self.values[key], dtype=np.float64), index=steps)
            columns[key] = series[~steps.duplicated(keep="last")].reindex(index)
        return pd.DataFrame(columns, index=index, dtype=float)


def with_ratio_metrics(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` plus each ratio of :data:`~dapo_verl.report.derived.RATIO_METRICS` it lacks but holds the parts of.

    A verl log holds the parts (sums and counts, exact under verl's averaging), the local backend's log the
    ratios too; a ratio is NaN (not logged) at a step whose denominator is 0 or missing.
    """
    added = {}
    for key, (top, bottom) in RATIO_METRICS.items():
        if key not in table.columns and top in table.columns and bottom in table.columns:
            denominator = table[bottom].where(table[bottom] > 0)
            added[key] = table[top] / denominator
    return table.assign(**added) if added else table


def records_table(records: Iterable[tuple[int, Mapping[str, Any]]]) -> pd.DataFrame:
    """Merge ``(step, {metric: value})`` records into a step x metric float table (later values win).

    Values that are not finite numbers become NaN (not logged).

    Raises:
        ValueError: for an accuracy outside [0, 1].
    """
    columns = MetricColumns(None)
    for step, data in records:
        columns.add(int(step), data)
    return columns.table()
