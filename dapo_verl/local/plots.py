"""Training curves of a local run as one PNG (accuracy, reward, entropy, length, dynamic sampling, clipping).

Uses matplotlib's object API with the Agg canvas, so no global pyplot state and no display is touched.
Per-step series are drawn faintly with a moving average on top; evaluations are drawn with markers. Each axis
carries one unit: a panel that shows two quantities of different units draws the second on its own right-hand
axis, labelled in its colour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dapo_verl.files import atomic_write

__all__ = ["PANELS", "Panel", "plot_history", "training_figure"]


@dataclass(frozen=True)
class Panel:
    """One panel: series sharing the left axis's unit, and optionally series of another unit on a right axis.

    Attributes:
        title: The panel's heading.
        unit: The left axis's label.
        lines: ``(metric key, legend label)`` drawn on the left axis; ``{task}`` is replaced by the task name.
        right_unit: The right axis's label, when :attr:`right` is given.
        right: ``(metric key, legend label)`` drawn on the right axis.
    """

    title: str
    unit: str
    lines: tuple[tuple[str, str], ...]
    right_unit: str = ""
    right: tuple[tuple[str, str], ...] = ()


PANELS = (
    Panel(
        "accuracy",
        "share of prompts correct",
        (
            ("val-core/{task}/acc/mean@1", "held out, greedy: answer correct"),
            ("val-aux/{task}/exact/mean@1", "held out, greedy: answer + EOS"),
            ("dapo/sampler/prefilter_acc", "training samples (before filter)"),
        ),
    ),
    Panel(
        "reward",
        "reward (shaped)",
        (("critic/score/mean", "trained batch"), ("dapo/sampler/prefilter_score", "all generated")),
    ),
    Panel("policy entropy", "nats / token", (("actor/entropy", "entropy"),)),
    Panel(
        "response length",
        "tokens",
        (("response_length/mean", "mean length"),),
        "share of responses",
        (("response_length/clip_ratio", "share truncated"),),
    ),
    Panel(
        "dynamic sampling",
        "share of groups",
        (("dapo/sampler/keep_rate", "keep rate"),),
        "rounds per step",
        (("dapo/sampler/gen_rounds", "generation rounds"),),
    ),
    Panel(
        "clipping",
        "share of tokens",
        (
            ("actor/dapo/clip_upper_fraction", "upper clip (1 + eps_high)"),
            ("actor/dapo/clip_lower_fraction", "lower clip (1 - eps_low)"),
            ("actor/dapo/clip_higher_kept_fraction", "kept trainable by clip-higher"),
        ),
    ),
)
"""The six panels, in reading order (two rows of three)."""


def _series(history: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for record in history:
        value = record["data"].get(key)
        if value is not None:
            steps.append(record["step"])
            values.append(value)
    return steps, values


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _draw(
    ax: Axes,
    history: Sequence[dict[str, Any]],
    lines: Sequence[tuple[str, str]],
    *,
    task: str,
    window: int,
    first_color: int,
) -> None:
    for n, (key, label) in enumerate(lines, start=first_color):
        steps, values = _series(history, key.format(task=task))
        if not steps:
            continue
        if key.startswith("val"):
            ax.plot(steps, values, "o-", color=f"C{n}", label=label, markersize=3)
            continue
        ax.plot(steps, values, color=f"C{n}", alpha=0.25, linewidth=0.8)
        ax.plot(steps, _smooth(values, window), color=f"C{n}", label=label)


def plot_history(history: Sequence[dict[str, Any]], path: Path, *, task: str, title: str = "") -> Path:
    """Draw :data:`PANELS` from ``metrics.jsonl`` records into ``path`` (PNG) and return it."""
    figure = training_figure(history, task=task, title=title)
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=80))


def training_figure(history: Sequence[dict[str, Any]], *, task: str, title: str = "") -> Figure:
    """:data:`PANELS` drawn from ``metrics.jsonl`` records, on an Agg canvas."""
    figure = Figure(figsize=(14, 7.5), layout="constrained")
    FigureCanvasAgg(figure)
    window = max(1, len(history) // 30)
    for ax, panel in zip(figure.subplots(2, 3).ravel(), PANELS):
        _draw(ax, history, panel.lines, task=task, window=window, first_color=0)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("training step", fontsize=8)
        ax.set_ylabel(panel.unit, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if panel.right:
            twin = ax.twinx()
            _draw(twin, history, panel.right, task=task, window=window, first_color=len(panel.lines))
            color = f"C{len(panel.lines)}"
            twin.set_ylabel(panel.right_unit, fontsize=8, color=color)
            twin.tick_params(labelsize=8, colors=color, axis="y")
            more_handles, more_labels = twin.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        if handles:
            ax.legend(handles, labels, fontsize=7)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure
