"""Metric logging of a local run: verl's JSONL format, TensorBoard events and the in-memory history.

Every step's metrics go to ``metrics.jsonl`` as one line ``{"step": int, "data": {...}}`` (the format of
verl's ``FileLogger``, so tools that read verl's logs read these) and to TensorBoard through
``torch.utils.tensorboard.SummaryWriter`` (what verl's TensorBoard adapter uses). verl's ``Tracking``
class is not imported because the local backend must not import verl or ray (STYLE.md §2); the two
formats are reproduced instead.

On resume the JSONL file is cut back to the checkpoint's step (rewritten atomically) and TensorBoard is
told to purge later events, so a resumed run's logs read as one uninterrupted run; a log that lacks a step
before the checkpoint's (:func:`missing_steps`) is refused by the resume rather than continued with a gap. A
process killed while appending a line leaves that line cut short; :func:`read_history` drops such a last line
with a warning (its step is recomputed after the resume), while a damaged line before it is an error.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from dapo_verl.files import os_errors_named, write_text_atomically

__all__ = ["MetricsLog", "missing_steps", "read_history"]

logger = logging.getLogger(__name__)


def _record(line: str) -> dict[str, Any] | None:
    """The ``{"step", "data"}`` record of a line, or None if the line is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    ok = isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("data"), dict)
    return record if ok else None


def read_history(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order (empty if the file does not exist).

    A last line cut short by a crash is dropped with a warning.

    Raises:
        ValueError: if a line other than the last is not a ``{"step": int, "data": {...}}`` record.
    """
    source = Path(path)
    if not source.exists():
        return []
    lines = [(n, line) for n, line in enumerate(source.read_text(errors="replace").splitlines(), 1) if line.strip()]
    records = []
    for position, (number, line) in enumerate(lines):
        record = _record(line)
        if record is not None:
            records.append(record)
        elif position == len(lines) - 1:
            logger.warning(
                "%s line %d is cut short (the run was interrupted while writing it); dropping it: %.60s",
                source,
                number,
                line,
            )
        else:
            raise ValueError(
                f"{source} line {number} is not a metrics record ({line[:60]!r}); the file was edited or "
                f"damaged. Delete that line, or start over with trainer.resume_mode=disable."
            )
    return records


def missing_steps(path: str | os.PathLike[str], step: int) -> list[int]:
    """The training steps 1..``step`` that ``path`` (a run's ``metrics.jsonl``) holds no record of.

    Every training step logs one record before its checkpoint is written, so a checkpoint at ``step`` whose log
    lacks a step below it means the log was truncated or edited.
    """
    logged = {record["step"] for record in read_history(path)}
    return [s for s in range(1, step + 1) if s not in logged]


def _plain(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None  # JSON has no NaN; verl's orjson writes null too


class MetricsLog:
    """Writes each step's metrics to JSONL and TensorBoard and keeps them in memory.

    Args:
        run_dir: The run directory; writes ``metrics.jsonl`` and ``tensorboard/``.
        resume_step: The checkpoint step a resumed run continues from (records after it are dropped), or
            None for a fresh run (an existing ``metrics.jsonl`` is replaced).
    """

    def __init__(self, run_dir: Path, *, resume_step: int | None) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.tensorboard_dir = run_dir / "tensorboard"
        kept = [r for r in read_history(self.jsonl_path) if r["step"] <= resume_step] if resume_step is not None else []
        self.history: list[dict[str, Any]] = kept
        write_text_atomically(self.jsonl_path, "".join(json.dumps(r) + "\n" for r in kept))
        purge = resume_step + 1 if resume_step is not None else None
        self.writer = SummaryWriter(str(self.tensorboard_dir), purge_step=purge)
        self._file = self.jsonl_path.open("a")

    def log(self, data: dict[str, float], step: int) -> None:
        """Record ``data`` (metric name -> number) for ``step``."""
        values = {k: _plain(v) for k, v in data.items()}
        record: dict[str, Any] = {"step": int(step), "data": values}
        with os_errors_named(self.jsonl_path):  # a line cut short by a full disk is dropped when the run resumes
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        for key, value in values.items():
            if value is not None:
                self.writer.add_scalar(key, value, step)
        self.history.append(record)

    def close(self) -> None:
        """Flush and close both outputs."""
        self._file.close()
        self.writer.close()
