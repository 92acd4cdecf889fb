"""Curves of an ablation over training steps: one line per arm (mean over its runs) in a min-max band.

Runs are aligned on the step numbers they logged (outer join); at each step the line is the mean and the
band the min and max over the runs that logged that step. Per-step training metrics are first smoothed per
run with a trailing moving average over ``max(1, steps // 30)`` logged values (named in the axis title);
validation metrics are drawn unsmoothed, with markers. A curve longer than :data:`MAX_PLOT_POINTS` is
drawn from that many consecutive bins (mean of the means, min of the mins, max of the maxes), so a
million-step log plots as fast as a short one and never overflows the renderer. Uses matplotlib's object
API with the Agg canvas, so no pyplot state and no display are touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dapo_verl.files import atomic_write
from dapo_verl.report.readers import RunLog
from dapo_verl.report.summary import CLIP_METRICS, CLIPPED_PROBABILITY_METRICS, is_validation_metric, pass_at_k_keys

__all__ = ["MAX_PLOT_POINTS", "SMOOTHING_POINTS", "arm_curve", "plot_arms", "thin_curve", "write_plots"]

SMOOTHING_POINTS = 30
"""A training curve is smoothed over ``len // SMOOTHING_POINTS`` values, so about this many windows."""

MAX_PLOT_POINTS = 2000
"""Most points drawn per curve; longer curves are binned (:func:`thin_curve`)."""


def _window(runs: Sequence[RunLog], key: str) -> int:
    if is_validation_metric(key):
        return 1
    return max(1, max((len(run.series(key)) for run in runs), default=0) // SMOOTHING_POINTS)


def arm_curve(runs: Sequence[RunLog], key: str, *, window: int = 1) -> pd.DataFrame:
    """Mean, min and max of ``key`` over an arm's runs at each logged step.

    Args:
        runs: The arm's runs.
        key: Metric key.
        window: Trailing moving-average length applied to each run's values before aggregating (1: none).

    Returns:
        DataFrame indexed by step with columns ``mean``, ``min``, ``max``, ``n`` (runs logged at that step);
        empty when no run logged ``key``.
    """
    columns = [run.series(key).rolling(window, min_periods=1).mean() for run in runs]
    columns = [c.rename(i) for i, c in enumerate(columns) if not c.empty]
    if not columns:
        return pd.DataFrame(columns=["mean", "min", "max", "n"])
    joined = pd.concat(columns, axis=1, join="outer").sort_index()
    return pd.DataFrame(
        {
            "mean": joined.mean(axis=1),
            "min": joined.min(axis=1),
            "max": joined.max(axis=1),
            "n": joined.notna().sum(axis=1),
        }
    )


def thin_curve(curve: pd.DataFrame, limit: int = MAX_PLOT_POINTS) -> pd.DataFrame:
    """``curve`` (from :func:`arm_curve`) in at most ``limit`` consecutive bins, each at its last step.

    Example:
        >>> curve = pd.DataFrame({"mean": [1.0, 3.0, 5.0, 7.0], "min": [0.0, 2.0, 4.0, 6.0],
        ...                       "max": [2.0, 4.0, 6.0, 8.0], "n": [1, 1, 1, 1]}, index=[1, 2, 3, 4])
        >>> thin_curve(curve, 2).to_dict("list")
        {'mean': [2.0, 6.0], 'min': [0.0, 4.0], 'max': [4.0, 8.0], 'n': [1, 1]}
    """
    if len(curve) <= limit:
        return curve
    bins = np.arange(len(curve)) * limit // len(curve)
    grouped = curve.groupby(bins)
    thinned = grouped.agg({"mean": "mean", "min": "min", "max": "max", "n": "max"})
    thinned.index = pd.Index([group.index[-1] for _, group in grouped], name=curve.index.name)
    return thinned


def plot_arms(arms: Mapping[str, Sequence[RunLog]], keys: Sequence[str], path: Path, *, title: str) -> Path:
    """Draw one panel per metric in ``keys`` (one coloured line and band per arm) into ``path`` (PNG)."""
    columns = 2 if len(keys) == 4 else min(len(keys), 3)
    rows = -(-len(keys) // columns)
    figure = Figure(figsize=(5.5 * columns, 4.0 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, key in zip(axes, keys):
        window = max(_window(runs, key) for runs in arms.values())
        for n, (label, runs) in enumerate(arms.items()):
            curve = thin_curve(arm_curve(runs, key, window=window))
            if curve.empty:
                continue
            style = "o-" if is_validation_metric(key) else "-"
            ax.plot(curve.index, curve["mean"], style, color=f"C{n}", markersize=3, label=f"{label} (n={len(runs)})")
            ax.fill_between(curve.index, curve["min"], curve["max"], color=f"C{n}", alpha=0.2, linewidth=0)
        smoothing = f", moving average of {window}" if window > 1 else ""
        ax.set_title(f"{key}{smoothing}", fontsize=9)
        ax.set_xlabel("training step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    figure.suptitle(f"{title} (line: mean over runs; band: min-max)", fontsize=10)
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=80))


def write_plots(arms: Mapping[str, Sequence[RunLog]], accuracy: Sequence[str], out_dir: Path) -> dict[str, Path]:
    """Write ``accuracy.png``, ``entropy.png``, ``clip_fractions.png``, ``pass_at_k.png`` and
    ``clipped_probability.png`` for the metrics some run logged.

    Args:
        arms: label -> runs.
        accuracy: The held-out accuracy keys to draw.
        out_dir: Output directory.

    Returns:
        Plot name (``accuracy``, ``entropy``, ``clip_fractions``, ``pass_at_k``, ``clipped_probability``) ->
        file written; a plot none of whose metrics was logged is not written.
    """
    logged = {key for runs in arms.values() for run in runs for key in run.metrics}
    groups = {
        "accuracy": [k for k in accuracy if k in logged],
        "entropy": [k for k in ("actor/entropy",) if k in logged],
        "clip_fractions": [k for k in CLIP_METRICS if k in logged],
        "pass_at_k": pass_at_k_keys(sorted(logged)),
        "clipped_probability": [k for k in CLIPPED_PROBABILITY_METRICS if k in logged],
    }
    titles = {
        "accuracy": "held-out accuracy",
        "entropy": "policy entropy",
        "clip_fractions": "clip fractions",
        "pass_at_k": "held-out pass@k",
        "clipped_probability": "old-policy probability of the clipped tokens",
    }
    return {
        name: plot_arms(arms, keys, out_dir / f"{name}.png", title=titles[name])
        for name, keys in groups.items()
        if keys
    }
