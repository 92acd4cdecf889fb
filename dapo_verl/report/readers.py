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
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["LogFormat", "NoMetricsLogError", "RunLog", "find_log", "load_run", "read_console", "read_jsonl",
           "read_tensorboard"]

logger = logging.getLogger(__name__)

JSONL_PREFERRED = "metrics.jsonl"
CONSOLE_SUFFIXES = (".log", ".txt", ".out")
TFEVENTS_GLOB = "events.out.tfevents.*"

_STEP = re.compile(r"(?:^|[\s)\]>|])step:(\d+)((?: - .*)?)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUMPY_REPR = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")


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
        table: Float table indexed by step (int, ascending, unique), one column per metric; NaN where a
            metric was not logged at that step.
    """

    path: Path
    source: Path
    format: LogFormat
    table: pd.DataFrame

    @property
    def metrics(self) -> list[str]:
        """The metric names this run logged at least once, sorted."""
        return sorted(str(c) for c in self.table.columns if self.table[c].notna().any())

    def series(self, key: str) -> pd.Series:
        """The logged values of ``key`` (index: step), NaN-free; empty when the run never logged it."""
        if key not in self.table.columns:
            return pd.Series(dtype=float, index=pd.Index([], dtype="int64", name="step"), name=key)
        return self.table[key].dropna()


def records_table(records: Iterable[tuple[int, Mapping[str, Any]]]) -> pd.DataFrame:
    """Merge ``(step, {metric: value})`` records into a step x metric float table (later values win).

    Values that are not finite numbers become NaN (not logged).
    """
    merged: dict[int, dict[str, float]] = {}
    for step, data in records:
        row = merged.setdefault(int(step), {})
        row.update({str(k): _as_float(v) for k, v in data.items()})
    table = pd.DataFrame.from_dict(merged, orient="index", dtype=float)
    table.index = pd.Index(table.index, dtype="int64", name="step")
    return table.sort_index()


def _as_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


# -- JSONL ---------------------------------------------------------------------------------------------

def _jsonl_record(line: str) -> tuple[int, dict[str, Any]] | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int | float):
        return None
    return int(step), record["data"]


def _is_metrics_jsonl(path: Path) -> bool:
    with path.open(errors="replace") as handle:
        for line in handle:
            if line.strip():
                return _jsonl_record(line) is not None
    return False


def read_jsonl(path: Path) -> pd.DataFrame:
    """Read a verl ``FileLogger`` JSONL file into a step x metric table.

    Raises:
        NoMetricsLogError: if no line is a ``{"step": ..., "data": {...}}`` record.
    """
    records, bad = [], 0
    with path.open(errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = _jsonl_record(line)
            if record is None:
                bad += 1  # a line cut short by a crash mid-write
                continue
            records.append(record)
    if not records:
        raise NoMetricsLogError(f"{path} has no verl FileLogger records ({{'step': int, 'data': {{...}}}} lines).")
    if bad:
        logger.warning("%s: skipped %d line(s) that are not {'step', 'data'} records", path, bad)
    return records_table(records)


# -- TensorBoard ---------------------------------------------------------------------------------------

def read_tensorboard(directory: Path) -> pd.DataFrame:
    """Read every scalar tag of the event files directly inside ``directory`` into a step x metric table.

    Raises:
        NoMetricsLogError: if the event files hold no scalars.
    """
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={SCALARS: 0})  # 0: keep every event
    accumulator.Reload()
    records: list[tuple[int, dict[str, float]]] = []
    for tag in accumulator.Tags()[SCALARS]:
        records.extend((event.step, {tag: event.value}) for event in accumulator.Scalars(tag))
    if not records:
        raise NoMetricsLogError(f"the TensorBoard event files in {directory} hold no scalars.")
    return records_table(records)


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
    """Parse one line of verl's console logger; None when the line holds no ``step:N`` record."""
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


def read_console(path: Path) -> pd.DataFrame:
    """Read verl console-logger lines (``step:N - key:value - ...``) from a text file into a table.

    Raises:
        NoMetricsLogError: if no line is a console-logger record with at least one metric.
    """
    with path.open(errors="replace") as handle:
        records = [r for r in (console_record(line) for line in handle.read().splitlines()) if r and r[1]]
    if not records:
        raise NoMetricsLogError(f"{path} has no verl console-logger lines ('step:N - key:value - ...').")
    return records_table(records)


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


_READERS = {LogFormat.JSONL: read_jsonl, LogFormat.TENSORBOARD: read_tensorboard, LogFormat.CONSOLE: read_console}


def load_run(path: str | Path) -> RunLog:
    """Find and read one run's metrics log (see :func:`find_log`)."""
    source, fmt = find_log(path)
    table = _READERS[fmt](source)
    logger.info("read %s (%s): %d steps, %d metrics", source, fmt.value, len(table), table.shape[1])
    return RunLog(path=Path(path), source=source, format=fmt, table=table)
