"""Group run paths into arms (labels): explicit labels, or labels derived from the directory layout.

Derivation rule for a run path without an explicit label:

1. The run's name is the directory's name; for a file it is the file's stem (``clip028.jsonl`` ->
   ``clip028``), unless the stem is a generic log name (``metrics``, ``log``, ``train``, ``stdout``,
   ``output``, ``console``), or the file is an ``events.out.tfevents.*`` file or sits in a directory named
   ``tensorboard``: then the name comes from the enclosing directory (``runs/clip028/metrics.jsonl`` ->
   ``clip028``; ``runs/clip028/tensorboard`` -> ``clip028``).
2. A name that is only a seed (``seed1``, ``seed_1``, ``seed-1``, ``s1``) takes its arm from the parent
   directory: ``runs/clip028/seed1`` -> ``clip028`` (the ``arm/seedN`` layout).
3. A trailing seed suffix is removed: ``clip028_seed1``, ``clip028-seed-1``, ``clip028.seed1`` -> ``clip028``.

Runs with the same label are the seeds of one arm. Arms keep the order in which they are first seen.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["derive_label", "group_runs"]

GENERIC_STEMS = frozenset({"metrics", "log", "train", "stdout", "output", "console"})
GENERIC_DIRS = frozenset({"tensorboard", "tensorboard_log", "logs"})
_SEED_ONLY = re.compile(r"^(?:seed[_-]?|s)\d+$", re.IGNORECASE)
_SEED_SUFFIX = re.compile(r"[_.-]seed[_-]?\d+$", re.IGNORECASE)


def _run_name_parts(path: Path) -> list[str]:
    """The path's components from the run's own name upwards (generic file and directory names skipped)."""
    parts = list(Path(os.path.abspath(path)).parts)[::-1]  # innermost first; symlinks keep their own names
    if path.is_file() or path.suffix in (".jsonl", ".log", ".txt", ".out"):
        head = parts.pop(0)
        stem = head.rsplit(".", 1)[0] if "." in head else head
        if stem not in GENERIC_STEMS and not head.startswith("events.out.tfevents."):
            parts.insert(0, stem)
    while len(parts) > 1 and parts[0] in GENERIC_DIRS:
        parts.pop(0)
    return parts


def derive_label(path: str | Path) -> str:
    """The arm label of one run path, by the rule in the module docstring.

    Example:
        >>> derive_label("runs/clip028/seed1")
        'clip028'
        >>> derive_label("logs/clip020_seed3.jsonl")
        'clip020'
        >>> derive_label("runs/clip028/metrics.jsonl")
        'clip028'
    """
    parts = _run_name_parts(Path(path))
    name = parts[0]
    if _SEED_ONLY.match(name) and len(parts) > 1:
        name = parts[1]
    return _SEED_SUFFIX.sub("", name) or name


def group_runs(paths: Sequence[str | Path], labels: Sequence[str] | None = None) -> dict[str, list[Path]]:
    """Group run paths by arm label.

    Args:
        paths: One path per run (directory or log file).
        labels: One label per path, in the same order; None derives each label with :func:`derive_label`.

    Returns:
        label -> that arm's run paths, arms in order of first appearance.

    Raises:
        ValueError: if no path is given, a path is given twice, a label is empty, or the number of labels is
            not the number of paths.
    """
    if not paths:
        raise ValueError("no run given; pass at least one run directory or log file.")
    if labels is not None and len(labels) != len(paths):
        raise ValueError(
            f"got {len(labels)} --label value(s) for {len(paths)} run(s); give one --label per run, "
            "in the same order, or none to derive labels from the directory names."
        )
    duplicates = sorted({str(p) for p in paths if sum(Path(q) == Path(p) for q in paths) > 1})
    if duplicates:
        raise ValueError(f"run path(s) given more than once: {', '.join(duplicates)}; give each run once.")
    names = list(labels) if labels is not None else [derive_label(p) for p in paths]
    if any(not name.strip() for name in names):
        raise ValueError("a --label is empty; give every run a non-empty label.")
    arms: dict[str, list[Path]] = {}
    for name, path in zip(names, paths, strict=True):
        arms.setdefault(name.strip(), []).append(Path(path))
    return arms
