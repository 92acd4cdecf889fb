"""Tiny local-backend runs for the reliability checks, and exact comparison of what two runs produced.

:func:`tiny_overrides` is the configuration :mod:`.faults` and :mod:`.determinism` train: a 132k-parameter
model, 4 groups of 4 responses per step, two gradient steps per update, a checkpoint every 2 steps, and
the sampler's stateful options on (surplus groups carried to the next step, uninformative prompts
skipped) so that a checkpoint holds carried groups and prompt history. One step takes about 0.15 s on
one CPU thread.

Comparisons are exact: metrics record by record (every key but ``timing_s/*``, which is wall-clock time),
checkpoint states tensor by tensor and value by value.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "comparable_history",
    "history_differences",
    "metric_values",
    "quiet_run_logs",
    "state_differences",
    "tiny_overrides",
    "work_directory",
]

_TINY = (
    "data.train_batch_size=4",
    "data.gen_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
    "local.task.heldout_size=50",
    "algorithm.filter_groups.surplus=carry",
    "algorithm.filter_groups.max_staleness_steps=2",
    "algorithm.filter_groups.skip_uninformative=true",
)


def tiny_overrides(
    *, steps: int, seed: int, cache_dir: str | Path, save_freq: int = 2, test_freq: int = 4
) -> list[str]:
    """Hydra overrides of the tiny run (see the module docstring) for ``dapo_verl.local.train.run``."""
    return [
        *_TINY,
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={save_freq}",
        f"trainer.test_freq={test_freq}",
        f"data.seed={seed}",
        f"local.cache_dir={cache_dir}",
    ]


def comparable_history(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``metrics.jsonl`` records without the ``timing_s/*`` keys (wall-clock times differ between runs)."""
    return [
        {"step": r["step"], "data": {k: v for k, v in r["data"].items() if not k.startswith("timing_s/")}}
        for r in records
    ]


def metric_values(records: Sequence[dict[str, Any]]) -> int:
    """Number of metric values (step x key) in comparable records."""
    return sum(len(r["data"]) for r in comparable_history(records))


def history_differences(expected: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]]) -> list[str]:
    """One line per step whose comparable metrics differ (missing, extra or any value not bit-identical)."""
    want = {r["step"]: r["data"] for r in comparable_history(expected)}
    got = {r["step"]: r["data"] for r in comparable_history(actual)}
    out = []
    if [r["step"] for r in expected] != [r["step"] for r in actual]:
        out.append(f"steps {[r['step'] for r in actual]} instead of {[r['step'] for r in expected]}")
    for step in sorted(set(want) | set(got)):
        a, b = want.get(step, {}), got.get(step, {})
        keys = sorted(k for k in set(a) | set(b) if a.get(k, "missing") != b.get(k, "missing"))
        if keys:
            shown = ", ".join(f"{k}: {a.get(k, 'missing')} != {b.get(k, 'missing')}" for k in keys[:3])
            out.append(f"step {step}: {len(keys)} metric(s) differ ({shown})")
    return out


def state_differences(
    expected: Any, actual: Any, where: str = "state", skip: tuple[str, ...] = ("config",)
) -> tuple[float, list[str]]:
    """Compare two checkpoint states: the largest absolute difference of any float tensor, and what differs.

    Returns:
        ``(max_abs_diff, differences)``; ``differences`` names every value that is not identical.
    """
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        if expected.shape != actual.shape or expected.dtype != actual.dtype:
            return 0.0, [f"{where}: {tuple(actual.shape)} {actual.dtype} != {tuple(expected.shape)} {expected.dtype}"]
        same = torch.equal(expected, actual)
        diff = (
            (expected.double() - actual.double()).abs().max().item()
            if expected.is_floating_point() and expected.numel() and not same
            else 0.0
        )
        return diff, [] if same else [f"{where} differs (max abs diff {diff:.3g})"]
    if isinstance(expected, dict) and isinstance(actual, dict):
        worst, out = 0.0, []
        if set(expected) != set(actual):
            out.append(f"{where}: keys {sorted(set(expected) ^ set(actual))} differ")
        for key in sorted(set(expected) & set(actual)):
            if key not in skip:
                diff, more = state_differences(expected[key], actual[key], f"{where}.{key}", skip)
                worst, out = max(worst, diff), out + more
        return worst, out
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        worst, out = 0.0, []
        for i, (a, b) in enumerate(zip(expected, actual)):
            diff, more = state_differences(a, b, f"{where}[{i}]", skip)
            worst, out = max(worst, diff), out + more
        return worst, out
    return 0.0, [] if expected == actual else [f"{where}: {actual!r} != {expected!r}"]


class _Capture(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.INFO)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def quiet_run_logs(records: list[logging.LogRecord]) -> Iterator[None]:
    """Collect the runs' ``dapo_verl`` log records (INFO and up) into ``records`` instead of showing them.

    Injected crashes make the runs log errors on purpose; the checks read them from ``records``.
    """
    package = logging.getLogger("dapo_verl")
    handler = _Capture(records)
    saved = package.level, package.propagate
    # A module logger raised above INFO earlier in the process (``dapo-verl ablate`` quietens some) would
    # drop the records the checks read: they inherit from the package here and get their levels back after.
    children = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith("dapo_verl.") and isinstance(logger, logging.Logger)
    }
    disabled = logging.root.manager.disable  # a process-wide logging.disable() would drop them too
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False
    for name in children:
        logging.getLogger(name).setLevel(logging.NOTSET)
    logging.disable(logging.NOTSET)
    try:
        yield
    finally:
        logging.disable(disabled)
        package.removeHandler(handler)
        package.setLevel(saved[0])
        package.propagate = saved[1]
        for name, level in children.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def work_directory(work_dir: str | Path | None, *, prefix: str, stale: Sequence[str] = ()) -> Iterator[Path]:
    """A directory for a check's runs: a temporary one (removed after) or ``work_dir``, cleared of ``stale``.

    Args:
        work_dir: Where to run, or None for a fresh temporary directory.
        prefix: Name prefix of the temporary directory.
        stale: Glob patterns of earlier runs to delete from ``work_dir`` first.
    """
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)
        return
    root = Path(work_dir)
    for pattern in stale:
        for old in root.glob(pattern):
            shutil.rmtree(old, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    yield root
