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
directly inside it.

One JSONL file is one run: verl's ``FileLogger`` opens its file anew for every process, one record per step with
steps increasing (verl >= 0.3 puts a step's validation in its record; older verl logged the final validation
separately, at the step of the last record), and a resumed local run rewrites its ``metrics.jsonl`` from the
checkpoint. So a JSONL step lower than the one before, or a training metric logged twice at one step, means two
runs in one file (appended, or written at once) and is an error naming the file, line and step; records of one
step with different metrics merge, and a validation metric logged again at its step keeps the later value. Any
line that is not a record is an error naming the file and line, except a last line cut short by a crash or a run
still writing, which is left out and listed in :attr:`RunLog.notes`. TensorBoard and console logs may repeat
steps (a resumed run appends to them); for a metric logged twice at one step the later value wins.

Logs are streamed: a reader never holds the file or its parsed lines, only one compact column (8-byte step,
8-byte value) per metric that the caller keeps (``keep``; :func:`load_run` keeps every metric by default,
``dapo-verl compare`` only those it reports), so a million-line log costs megabytes, not gigabytes. Every
metric name with a finite value is remembered (:attr:`RunLog.metrics`). In every format a record whose step is
not a whole number in [0, 2**63) -- NaN, Infinity, 1e300, 2.5 -- and an accuracy outside [0, 1] are errors naming
the record (:mod:`dapo_verl.report.runlog`).

Ratio metrics (:mod:`dapo_verl.report.derived`: the mean old-policy probability of the clipped tokens, the
share of positive-advantage tokens clipped) are added to a run that logged their parts but not them -- any
verl run with ``loss_mode=dapo`` -- so the same figures come from verl's logs and from local runs.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pandas as pd

from dapo_verl.report.derived import RATIO_METRICS
from dapo_verl.report.runlog import (
    LogFormat,
    MetricColumns,
    MetricFilter,
    RunLog,
    as_step,
    current_name,
    is_validation_metric,
    records_table,
    with_ratio_metrics,
)

__all__ = [
    "LogFormat",
    "MetricFilter",
    "NoMetricsLogError",
    "RunLog",
    "current_name",
    "find_log",
    "load_run",
    "read_console",
    "read_jsonl",
    "read_tensorboard",
    "records_table",
    "with_ratio_metrics",
]

logger = logging.getLogger(__name__)

JSONL_PREFERRED = "metrics.jsonl"
CONSOLE_SUFFIXES = (".log", ".txt", ".out")
TFEVENTS_GLOB = "events.out.tfevents.*"

_STEP = re.compile(r"(?:^|[\s)\]>|])step:(\d+)((?: - .*)?)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUMPY_REPR = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")


class NoMetricsLogError(ValueError):
    """A path holds no metrics log in any format this module reads."""


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


class _StepOrder:
    """Checks that a JSONL log's steps only grow, as they do in a file one run wrote (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step: int | None = None
        self.lines: dict[str, int] = {}  # metric -> the line that logged it at ``step``

    def check(self, step: int, data: dict[str, Any], number: int) -> None:
        if self.step is None or step > self.step:
            self.step, self.lines = step, dict.fromkeys(map(str, data), number)
            return
        where = f"{self.path} line {number}: step {step}"
        fix = (
            "Give each run its own log file (verl: one trainer.experiment_name or VERL_FILE_LOGGER_PATH per run), "
            "or split this one."
        )
        if step < self.step:
            raise ValueError(
                f"{where} follows step {self.step} (line {max(self.lines.values())}); one run logs its "
                f"steps in increasing order, so this file holds two runs. {fix}"
            )
        again = next((key for key in map(str, data) if key in self.lines and not is_validation_metric(key)), None)
        if again is not None:
            raise ValueError(
                f"{where} logs {again} again (first at line {self.lines[again]}); one run logs a training "
                f"metric once per step, so this file holds two runs. {fix}"
            )
        self.lines.update(dict.fromkeys(map(str, data), number))


def stream_jsonl(path: Path, keep: MetricFilter | None = None) -> MetricColumns:
    """Stream a verl ``FileLogger`` JSONL file line by line into compact columns of the metrics ``keep`` accepts.

    A last line cut short (no line end, not JSON) is left out and noted in ``notes``.

    Raises:
        NoMetricsLogError: if no line is a ``{"step": ..., "data": {...}}`` record.
        ValueError: naming the file and line, for any other line that is not a record, a step that is not a whole
            number in [0, 2**63), steps of two runs, or an accuracy outside [0, 1].
    """
    columns, order = MetricColumns(keep), _StepOrder(path)
    with path.open(errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            record = _jsonl_record(line)
            if record is None and not line.endswith("\n"):  # only the last line can lack its line end
                columns.notes.append(
                    f"line {number} is cut short (the run stopped while writing it, or is still "
                    "running), so its metrics are left out."
                )
                break
            if record is None:
                shown = line.strip()[:60]
                raise ValueError(
                    f"{path} line {number} is not a {{'step': int, 'data': {{...}}}} record ({shown!r}); "
                    "every line of a verl FileLogger log is one. Fix or delete that line."
                )
            where = f"{path} line {number}"
            step = as_step(record[0], where)
            order.check(step, record[1], number)
            columns.add(step, record[1], where)
    if not len(columns):
        raise NoMetricsLogError(f"{path} has no verl FileLogger records ({{'step': int, 'data': {{...}}}} lines).")
    return columns


# -- TensorBoard ---------------------------------------------------------------------------------------


def read_tensorboard(directory: Path, keep: MetricFilter | None = None) -> pd.DataFrame:
    """Read every scalar tag of the event files directly inside ``directory`` into a step x metric table."""
    return stream_tensorboard(directory, keep).table()


def stream_tensorboard(directory: Path, keep: MetricFilter | None = None) -> MetricColumns:
    """Read the scalar tags of the event files directly inside ``directory`` into compact columns.

    Raises:
        NoMetricsLogError: if the event files hold no scalars.
    """
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={SCALARS: 0})  # 0: keep every event
    accumulator.Reload()
    columns = MetricColumns(keep)
    for tag in accumulator.Tags()[SCALARS]:
        for event in accumulator.Scalars(tag):
            where = f"{directory} tag {tag} step {event.step}"
            columns.add(as_step(event.step, where), {tag: event.value}, where)
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


def stream_console(path: Path, keep: MetricFilter | None = None) -> MetricColumns:
    """Stream verl console-logger lines of a text file into compact columns.

    Raises:
        NoMetricsLogError: if no line is a console-logger record with at least one metric.
        ValueError: for a step beyond 2**63 - 1, naming the file and line.
    """
    columns = MetricColumns(keep)
    with path.open(errors="replace") as handle:
        for number, physical in enumerate(handle, 1):
            for line in physical.splitlines():
                record = console_record(line)
                if record and record[1]:
                    where = f"{path} line {number}"
                    columns.add(as_step(record[0], where), record[1], where)
    if not len(columns):
        raise NoMetricsLogError(f"{path} has no verl console-logger lines ('step:N - key:value - ...').")
    return columns


def _has_console_lines(path: Path) -> bool:
    with path.open(errors="replace") as handle:
        return any((r := console_record(line)) is not None and r[1] for line in handle)


# -- detection -----------------------------------------------------------------------------------------

_LOOKED_FOR = (
    "verl FileLogger JSONL (*.jsonl with {'step', 'data'} lines), TensorBoard event files "
    f"({TFEVENTS_GLOB}, searched recursively) and verl console-logger output "
    f"({', '.join('*' + s for s in CONSOLE_SUFFIXES)} with 'step:N - key:value' lines)"
)


def _find_in_directory(directory: Path) -> tuple[Path, LogFormat]:
    jsonl = sorted(p for p in directory.glob("*.jsonl") if p.is_file() and _is_metrics_jsonl(p))
    preferred = [p for p in jsonl if p.name == JSONL_PREFERRED]
    if preferred or len(jsonl) == 1:
        return (preferred or jsonl)[0], LogFormat.JSONL
    if jsonl:
        raise NoMetricsLogError(
            f"{directory} holds several metrics logs ({', '.join(p.name for p in jsonl)}); pass one file per run."
        )
    event_dirs = _event_dirs(directory)
    if len(event_dirs) == 1:
        return event_dirs[0], LogFormat.TENSORBOARD
    if event_dirs:
        raise NoMetricsLogError(
            f"{directory} holds TensorBoard event files in several directories "
            f"({', '.join(str(d) for d in event_dirs)}); pass one directory per run (a shell glob "
            "such as runs/ablation/*/seed* gives every run)."
        )
    console = sorted(
        p for p in directory.iterdir() if p.suffix in CONSOLE_SUFFIXES and p.is_file() and _has_console_lines(p)
    )
    if len(console) == 1:
        return console[0], LogFormat.CONSOLE
    if console:
        raise NoMetricsLogError(
            f"{directory} holds several console logs ({', '.join(p.name for p in console)}); pass one file per run."
        )
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


_READERS = {LogFormat.JSONL: stream_jsonl, LogFormat.TENSORBOARD: stream_tensorboard, LogFormat.CONSOLE: stream_console}


def load_run(path: str | Path, keep: MetricFilter | None = None) -> RunLog:
    """Find and read one run's metrics log (see :func:`find_log`).

    Args:
        path: A log file or run directory.
        keep: Which metrics to keep values of (None: every one); all names count in :attr:`RunLog.metrics`.

    Raises:
        FileNotFoundError, NoMetricsLogError: as :func:`find_log`.
        ValueError: naming the file and line (or tag), for a step that is not a whole number in [0, 2**63), an
            accuracy outside [0, 1], and in a JSONL log a line that is not a record or the steps of two runs.
    """
    source, fmt = find_log(path)
    columns = _READERS[fmt](source, keep)
    table = with_ratio_metrics(columns.table())
    columns.logged.update(str(c) for c in table.columns if str(c) in RATIO_METRICS and table[c].notna().any())
    logger.info(
        "read %s (%s): %d steps, %d metrics (%d kept)",
        source,
        fmt.value,
        len(table),
        len(columns.logged),
        table.shape[1],
    )
    return RunLog(
        path=Path(path),
        source=source,
        format=fmt,
        table=table,
        logged=frozenset(columns.logged),
        nonfinite=columns.nonfinite(table),
        notes=tuple(columns.notes),
    )
