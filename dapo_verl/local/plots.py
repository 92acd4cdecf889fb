"""Training curves of a local run as one PNG (accuracy, reward, entropy, length, keep rate, clipping).

Uses matplotlib's object API with the Agg canvas, so no global pyplot state and no display is touched.
Per-step series are drawn faintly with a moving average on top; evaluations are drawn with markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["PANELS", "plot_history"]

PANELS: dict[str, list[tuple[str, str]]] = {
    "held-out accuracy (greedy)": [("val-core/{task}/acc/mean@1", "answer correct"),
                                   ("val-aux/{task}/exact/mean@1", "answer + EOS"),
                                   ("dapo/sampler/prefilter_acc", "training samples (before filter)")],
    "reward": [("critic/score/mean", "trained batch (shaped)"),
               ("dapo/sampler/prefilter_score", "all generated (shaped)")],
    "policy entropy (nats/token)": [("actor/entropy", "entropy")],
    "response length (tokens)": [("response_length/mean", "mean length"),
                                 ("response_length/clip_ratio", "share truncated")],
    "dynamic sampling": [("dapo/sampler/keep_rate", "keep rate"),
                         ("dapo/sampler/gen_rounds", "generation rounds")],
    "clipping (share of tokens)": [("actor/dapo/clip_upper_fraction", "upper clip (1 + eps_high)"),
                                   ("actor/dapo/clip_lower_fraction", "lower clip (1 - eps_low)"),
                                   ("actor/dapo/clip_higher_kept_fraction", "kept trainable by clip-higher")],
}
"""Panel title -> [(metric key, legend label)]; ``{task}`` is replaced by the task name."""


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


def plot_history(history: Sequence[dict[str, Any]], path: Path, *, task: str, title: str = "") -> Path:
    """Draw :data:`PANELS` from ``metrics.jsonl`` records into ``path`` (PNG) and return it."""
    figure = Figure(figsize=(13, 7.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 3).ravel()
    window = max(1, len(history) // 30)
    for ax, (panel, lines) in zip(axes, PANELS.items()):
        for n, (key, label) in enumerate(lines):
            steps, values = _series(history, key.format(task=task))
            if not steps:
                continue
            color = f"C{n}"
            if key.startswith("val"):
                ax.plot(steps, values, "o-", color=color, label=label, markersize=3)
                continue
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps, _smooth(values, window), color=color, label=label)
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("training step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    if title:
        figure.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    return path
