"""Read one run's logged metrics, whatever logger wrote them, into a table of steps x metrics.

Three formats, detected from the path (a file or a run directory):

* ``jsonl`` -- verl's ``FileLogger`` (``trainer.logger=[...,file]``): one JSON object per line,
  ``{"step": int, "data": {metric: value}}``. The local backend writes the same format to
  ``<run>/metrics.jsonl``. ``null`` values (verl's orjson writes NaN as null) count as not logged.
* ``tensorboard`` -- ``events.out.tfevents.*`` files (verl's ``trainer.logger=[...,tensorboard]``, the
  local backend's ``<run>/tensorboard/``); every scalar tag is a metric, read with tensorboard's
  ``EventAccumulator``. The files may sit anywhere below the directory given, but in one directory only.
* ``console`` -- verl's console logger captured to a text file: lines ``step:12 - actor/entropy:0.52 - ...``
  (``verl.utils.logger.aggregate_logger.concat_dict_to_str``), possibly behind a Ray prefix such as
  ``(TaskRunner pid=7)``, ANSI colours or progress bars, and interleaved with any other output. Values
  written as ``np.float64(0.5)`` (numpy >= 2 reprs), ``nan``, ``inf`` and ``True``/``False`` are understood;
  items that are not ``key:number`` are skipped.

A directory is searched in that order of preference: ``*.jsonl`` logs directly inside it (``metrics.jsonl``
first), then TensorBoard event files anywhere below it, then console logs (``*.log``, ``*.txt``, ``*.out``)
directly inside it. A step logged more than once (a resumed run, or verl's separate validation call) keeps
every metric, and for a metric logged twice at one step the later value wins.

Logs are streamed: a reader never holds the file or its parsed lines, only one compact column (8-byte step,
8-byte value) per metric that the caller keeps (``keep``; :func:`load_run` keeps every metric by default,
``dapo-verl compare`` only those it reports), so a million-line log costs megabytes, not gigabytes. Every
metric name with a finite value is remembered (:attr:`RunLog.metrics`). A record whose step is not a whole
number in [0, 2**63) -- NaN, Infinity, 1e300, 2.5 -- is an error naming the file and line; a line that is
not a record at all (cut short by a crash, or nested too deep to parse) is skipped with a warning.

Ratio metrics (:mod:`dapo_verl.report.derived`: the mean old-policy probability of the clipped tokens, the
share of positive-advantage tokens clipped) are added to a run that logged their parts but not them -- any
verl run with ``loss_mode=dapo`` -- so the same figures come from verl's logs and from local runs.
"""

from __future__ import annotations

import json
import logging
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

__all__ = ["LogFormat", "MetricFilter", "NoMetricsLogError", "RunLog", "find_log", "load_run", "read_console",
           "read_jsonl", "read_tensorboard"]

logger = logging.getLogger(__name__)

JSONL_PREFERRED = "metrics.jsonl"
CONSOLE_SUFFIXES = (".log", ".txt", ".out")
TFEVENTS_GLOB = "events.out.tfevents.*"

_STEP = re.compile(r"(?:^|[\s)\]>|])step:(\d+)((?: - .*)?)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUMPY_REPR = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")
_MAX_STEP = 2**63 - 1

MetricFilter = Callable[[str], bool]
"""Whether a reader keeps a metric's values (every name is still counted in :attr:`RunLog.metrics`)."""


class LogFormat(StrEnum):
    """The logger that wrote a run's metrics (the order is the order of preference in a directory)."""

    JSONL = "jsonl"
    TENSORBOARD = "tensorboard"
    CONSOLE = "console"


class NoMetricsLogError(ValueError):
    """A path holds no metrics log in any format this module reads."""


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
    """

    path: Path
    source: Path
    format: LogFormat
    table: pd.DataFrame
    logged: frozenset[str] | None = None
    nonfinite: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

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
            return new + key[len(old):]
    return key


class _Columns:
    """Collects ``(step, {metric: value})`` records as one compact column per kept metric."""

    def __init__(self, keep: MetricFilter | None) -> None:
        self.keep = keep or _keep_all
        self.record_steps = array("q")
        self.steps: dict[str, array] = {}
        self.values: dict[str, array] = {}
        self.logged: set[str] = set()
        self.nonfinite_steps: dict[str, array] = {}
        self._kept: dict[str, bool] = {}

    def add(self, step: int, data: Mapping[str, Any]) -> None:
        self.record_steps.append(step)
        for name, raw in data.items():
            key, value = current_name(str(name)), _as_float(raw)
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
        return {key: tuple(sorted({int(s) for s in steps if math.isnan(table.at[int(s), key])}))
                for key, steps in self.nonfinite_steps.items() if key in table.columns}

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
    """
    columns = _Columns(None)
    for step, data in records:
        columns.add(int(step), data)
    return columns.table()


def _step(value: Any, where: str) -> int:
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
    raise ValueError(f"{where}: step {shown} is not a whole number between 0 and 2**63 - 1, so its metrics belong to "
                     f"no training step. Fix or delete that line.")


def _as_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


# -- JSONL ---------------------------------------------------------------------------------------------

def _jsonl_record(line: str) -> tuple[Any, dict[str, Any]] | None:
    """The raw ``(step, data)`` of a ``{"step": number, "data": {...}}`` line, or None for any other line."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):  # cut short by a crash, or nested too deep to be a record
        return None
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int | float):
        return None
    return step, record["data"]


def _is_metrics_jsonl(path: Path) -> bool:
    with path.open(errors="replace") as handle:
        for line in handle:
            if line.strip():
                return _jsonl_record(line) is not None
    return False


def read_jsonl(path: Path, keep: MetricFilter | None = None) -> pd.DataFrame:
    """Read a verl ``FileLogger`` JSONL file into a step x metric table (see :func:`stream_jsonl`)."""
    return stream_jsonl(path, keep).table()


def stream_jsonl(path: Path, keep: MetricFilter | None = None) -> _Columns:
    """Stream a verl ``FileLogger`` JSONL file line by line into compact columns of the metrics ``keep`` accepts.

    Raises:
        NoMetricsLogError: if no line is a ``{"step": ..., "data": {...}}`` record.
        ValueError: for a record whose step is not a whole number in [0, 2**63), naming the file and line.
    """
    columns, bad = _Columns(keep), 0
    with path.open(errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            record = _jsonl_record(line)
            if record is None:
                bad += 1  # a line cut short by a crash mid-write
                continue
            columns.add(_step(record[0], f"{path} line {number}"), record[1])
    if not len(columns):
        raise NoMetricsLogError(f"{path} has no verl FileLogger records ({{'step': int, 'data': {{...}}}} lines).")
    if bad:
        logger.warning("%s: skipped %d line(s) that are not {'step', 'data'} records", path, bad)
    return columns


# -- TensorBoard ---------------------------------------------------------------------------------------

def read_tensorboard(directory: Path, keep: MetricFilter | None = None) -> pd.DataFrame:
    """Read every scalar tag of the event files directly inside ``directory`` into a step x metric table."""
    return stream_tensorboard(directory, keep).table()


def stream_tensorboard(directory: Path, keep: MetricFilter | None = None) -> _Columns:
    """Read the scalar tags of the event files directly inside ``directory`` into compact columns.

    Raises:
        NoMetricsLogError: if the event files hold no scalars.
    """
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={SCALARS: 0})  # 0: keep every event
    accumulator.Reload()
    columns = _Columns(keep)
    for tag in accumulator.Tags()[SCALARS]:
        for event in accumulator.Scalars(tag):
            columns.add(_step(event.step, f"{directory} tag {tag}"), {tag: event.value})
    if not len(columns):
        raise NoMetricsLogError(f"the TensorBoard event files in {directory} hold no scalars.")
    return columns


def _event_dirs(directory: Path) -> list[Path]:
    return sorted({p.parent for p in directory.rglob(TFEVENTS_GLOB) if p.is_file()})


# -- console -------------------------------------------------------------------------------------------

def _console_value(text: str) -> float | None:
    text = text.strip()
    wrapped = _NUMPY_REPR.match(text)
    if wrapped:
        text = wrapped.group(1)
    if text in ("True", "False"):
        return float(text == "True")
    try:
        return float(text)
    except ValueError:
        return None


def console_record(line: str) -> tuple[int, dict[str, float]] | None:
    """Parse one line of verl's console logger; None when the line holds no ``step:N`` record.

    The step is returned as written; :func:`read_console` checks that it fits a step.
    """
    match = _STEP.search(_ANSI.sub("", line).rstrip())
    if match is None:
        return None
    data: dict[str, float] = {}
    for item in match.group(2).split(" - ")[1:]:
        key, sep, text = item.rpartition(":")
        value = _console_value(text) if sep and key.strip() else None
        if value is not None:
            data[key.strip()] = value
    return int(match.group(1)), data


def read_console(path: Path, keep: MetricFilter | None = None) -> pd.DataFrame:
    """Read verl console-logger lines (``step:N - key:value - ...``) from a text file into a table."""
    return stream_console(path, keep).table()


def stream_console(path: Path, keep: MetricFilter | None = None) -> _Columns:
    """Stream verl console-logger lines of a text file into compact columns.

    Raises:
        NoMetricsLogError: if no line is a console-logger record with at least one metric.
        ValueError: for a step beyond 2**63 - 1, naming the file and line.
    """
    columns = _Columns(keep)
    with path.open(errors="replace") as handle:
        for number, physical in enumerate(handle, 1):
            for line in physical.splitlines():
                record = console_record(line)
                if record and record[1]:
                    columns.add(_step(record[0], f"{path} line {number}"), record[1])
    if not len(columns):
        raise NoMetricsLogError(f"{path} has no verl console-logger lines ('step:N - key:value - ...').")
    return columns


def _has_console_lines(path: Path) -> bool:
    with path.open(errors="replace") as handle:
        return any((r := console_record(line)) is not None and r[1] for line in handle)


# -- detection -----------------------------------------------------------------------------------------

_LOOKED_FOR = ("verl FileLogger JSONL (*.jsonl with {'step', 'data'} lines), TensorBoard event files "
               f"({TFEVENTS_GLOB}, searched recursively) and verl console-logger output "
               f"({', '.join('*' + s for s in CONSOLE_SUFFIXES)} with 'step:N - key:value' lines)")


def _find_in_directory(directory: Path) -> tuple[Path, LogFormat]:
    jsonl = sorted(p for p in directory.glob("*.jsonl") if p.is_file() and _is_metrics_jsonl(p))
    preferred = [p for p in jsonl if p.name == JSONL_PREFERRED]
    if preferred or len(jsonl) == 1:
        return (preferred or jsonl)[0], LogFormat.JSONL
    if jsonl:
        raise NoMetricsLogError(f"{directory} holds several metrics logs ({', '.join(p.name for p in jsonl)}); "
                                "pass one file per run.")
    event_dirs = _event_dirs(directory)
    if len(event_dirs) == 1:
        return event_dirs[0], LogFormat.TENSORBOARD
    if event_dirs:
        raise NoMetricsLogError(f"{directory} holds TensorBoard event files in several directories "
                                f"({', '.join(str(d) for d in event_dirs)}); pass one directory per run (a shell glob "
                                "such as runs/ablation/*/seed* gives every run).")
    console = sorted(p for p in directory.iterdir() if p.suffix in CONSOLE_SUFFIXES and p.is_file()
                     and _has_console_lines(p))
    if len(console) == 1:
        return console[0], LogFormat.CONSOLE
    if console:
        raise NoMetricsLogError(f"{directory} holds several console logs ({', '.join(p.name for p in console)}); "
                                "pass one file per run.")
    raise NoMetricsLogError(f"no metrics log found in {directory}; looked for {_LOOKED_FOR}.")


def find_log(path: str | Path) -> tuple[Path, LogFormat]:
    """Find the metrics log of one run and its format.

    Args:
        path: A log file, or a run directory (searched as described in the module docstring).

    Returns:
        ``(source, format)``: the file (or, for TensorBoard, the directory of the event files) to read.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        NoMetricsLogError: if no recognised log is there, or a directory holds several of one format.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run path {path} does not exist; give a run directory or a log file.")
    if path.is_dir():
        return _find_in_directory(path)
    if path.name.startswith("events.out.tfevents."):
        return path.parent, LogFormat.TENSORBOARD
    if _is_metrics_jsonl(path):
        return path, LogFormat.JSONL
    if _has_console_lines(path):
        return path, LogFormat.CONSOLE
    raise NoMetricsLogError(f"{path} is not a metrics log; looked for {_LOOKED_FOR}.")


_READERS = {LogFormat.JSONL: stream_jsonl, LogFormat.TENSORBOARD: stream_tensorboard,
            LogFormat.CONSOLE: stream_console}


def load_run(path: str | Path, keep: MetricFilter | None = None) -> RunLog:
    """Find and read one run's metrics log (see :func:`find_log`).

    Args:
        path: A log file or run directory.
        keep: Which metrics to keep values of (None: every one); all names count in :attr:`RunLog.metrics`.

    Raises:
        FileNotFoundError, NoMetricsLogError: as :func:`find_log`.
        ValueError: for a record whose step is not a whole number in [0, 2**63), naming the file and line.
    """
    source, fmt = find_log(path)
    columns = _READERS[fmt](source, keep)
    table = with_ratio_metrics(columns.table())
    columns.logged.update(str(c) for c in table.columns if str(c) in RATIO_METRICS and table[c].notna().any())
    logger.info("read %s (%s): %d steps, %d metrics (%d kept)", source, fmt.value, len(table), len(columns.logged),
                table.shape[1])
    return RunLog(path=Path(path), source=source, format=fmt, table=table, logged=frozenset(columns.logged),
                  nonfinite=columns.nonfinite(table))
