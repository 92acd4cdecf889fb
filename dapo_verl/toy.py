"""The paper's exercises, run on the real core functions: ``dapo-verl toy``.

(a) Dynamic sampling keeps only the mixed group, in 0/1 and -1/1 reward encodings.
(b) Clip-higher: the clipped objective and its gradient as the ratio sweeps 0.5..1.5, for A = +1 and
    A = -1, under eps_low/eps_high = 0.2/0.2 and 0.2/0.28 (ratio 1.25 with A > 0 still has gradient under
    0.28, not under 0.2).
(c) Token-level loss: with unequal response lengths every token weighs the same, so a long response
    counts in proportion to its length; the sample-level mean gives each response the same weight.

Every number comes from :mod:`dapo_verl.core` through autograd; nothing here re-implements the math.
Writes ``toy.json`` and ``toy.png`` into the output directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dapo_verl.core import LossAggregation, clipped_surrogate_loss_matrix, dapo_loss, dynamic_group_mask
from dapo_verl.files import atomic_write, write_text_atomically

__all__ = ["CLIP_SETTINGS", "run_toy"]

CLIP_SETTINGS = {"symmetric 0.2/0.2": (0.2, 0.2), "clip-higher 0.2/0.28": (0.2, 0.28)}


def filter_exercise() -> dict[str, Any]:
    """(a): which of the three groups dynamic sampling keeps, per encoding."""
    groups = {"all-fail": [0, 0, 0, 0], "mixed": [0, 1, 0, 1], "all-success": [1, 1, 1, 1]}
    result: dict[str, Any] = {}
    for encoding, to_reward in (("0/1", lambda v: float(v)), ("-1/1", lambda v: 2.0 * v - 1.0)):
        rewards = torch.tensor([[to_reward(v) for v in values] for values in groups.values()])  # (3, 4)
        kept = dynamic_group_mask(rewards).tolist()
        result[encoding] = {
            name: {"rewards": row, "kept": keep} for name, row, keep in zip(groups, rewards.tolist(), kept)
        }
    return result


def objective_and_gradient(ratio: float, advantage: float, clip_low: float, clip_high: float) -> tuple[float, float]:
    """J(r) = min(r A, clip(r) A) and dJ/dr, via autograd through the core loss (logp = log r, old = 0)."""
    logp = torch.tensor(
        [[torch.log(torch.tensor(ratio, dtype=torch.float64))]], dtype=torch.float64, requires_grad=True
    )
    loss = clipped_surrogate_loss_matrix(
        logp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool),
        clip_low=clip_low,
        clip_high=clip_high,
    ).sum()
    (grad_logp,) = torch.autograd.grad(loss, logp)
    # d(-J)/d(log r) = -r dJ/dr; adding 0.0 turns -0.0 into 0.0 for the report.
    return -float(loss.detach()) + 0.0, -float(grad_logp) / ratio + 0.0


def clip_sweep(num_points: int = 101) -> dict[str, Any]:
    """(b): objective and gradient for each ratio, advantage sign and clip setting."""
    ratios = torch.linspace(0.5, 1.5, num_points, dtype=torch.float64).tolist()
    curves: dict[str, Any] = {}
    for label, (low, high) in CLIP_SETTINGS.items():
        for advantage in (1.0, -1.0):
            points = [objective_and_gradient(r, advantage, low, high) for r in ratios]
            curves[f"{label}, A={advantage:+.0f}"] = {
                "clip_low": low,
                "clip_high": high,
                "advantage": advantage,
                "ratio": ratios,
                "objective": [p[0] for p in points],
                "gradient": [p[1] for p in points],
            }
    probe = {label: objective_and_gradient(1.25, 1.0, *clip)[1] for label, clip in CLIP_SETTINGS.items()}
    return {"curves": curves, "gradient_at_ratio_1.25_positive_advantage": probe}


def token_weight_exercise() -> dict[str, Any]:
    """(c): how much each response contributes to the gradient under token- vs sample-level means."""
    lengths = [2, 8]
    mask = torch.zeros(2, max(lengths), dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    result: dict[str, Any] = {"response_lengths": lengths}
    for name, mode in (
        ("token-level (DAPO)", LossAggregation.TOKEN_MEAN_GLOBAL),
        ("sample-level (GRPO)", LossAggregation.SEQ_MEAN_TOKEN_MEAN),
    ):
        logp = torch.zeros(2, max(lengths), dtype=torch.float64, requires_grad=True)
        loss = dapo_loss(logp, torch.zeros_like(logp), torch.ones(2, dtype=torch.float64), mask, aggregation=mode)
        (grad,) = torch.autograd.grad(loss, logp)
        per_token = (-grad).tolist()
        share = (-grad).sum(dim=1) / (-grad).sum()
        result[name] = {
            "weight_per_token": [row[0] for row in per_token],
            "share_of_gradient_per_response": share.tolist(),
        }
    return result


def _plot(sweep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for col, advantage in enumerate((1.0, -1.0)):
        for label, style in zip(CLIP_SETTINGS, ("-", "--")):
            curve = sweep["curves"][f"{label}, A={advantage:+.0f}"]
            axes[0, col].plot(curve["ratio"], curve["objective"], style, label=label)
            axes[1, col].plot(curve["ratio"], curve["gradient"], style, label=label)
        axes[0, col].set_title(f"A = {advantage:+.0f}")
        axes[0, col].set_ylabel("objective min(rA, clip(r)A)")
        axes[1, col].set_ylabel("gradient dJ/dr")
        axes[1, col].set_xlabel("ratio r = pi / pi_old")
        for row in range(2):
            axes[row, col].axvline(1.25, color="grey", lw=0.8, ls=":")
            axes[row, col].legend(loc="best", fontsize=8)
    fig.suptitle("Clip-higher: at r = 1.25 with A > 0 the gradient survives under eps_high = 0.28, not 0.2")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def run_toy(out_dir: str | Path) -> dict[str, Path]:
    """Run the three exercises and write ``toy.json`` and ``toy.png`` into ``out_dir``.

    Returns:
        The paths written, keyed ``json`` and ``png``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sweep = clip_sweep()
    report = {"filter": filter_exercise(), "clip_sweep": sweep, "token_weights": token_weight_exercise()}
    json_path, png_path = out / "toy.json", out / "toy.png"
    write_text_atomically(json_path, json.dumps(report, indent=2))
    _plot(sweep, png_path)
    return {"json": json_path, "png": png_path}


def summary_lines(report_path: Path) -> list[str]:
    """A short human-readable digest of ``toy.json``."""
    report = json.loads(report_path.read_text())
    lines = ["(a) dynamic sampling keeps only mixed groups:"]
    for encoding, groups in report["filter"].items():
        kept = [name for name, group in groups.items() if group["kept"]]
        lines.append(f"    {encoding:5s} encoding -> kept {kept}")
    lines.append("(b) gradient dJ/dr at ratio 1.25, A = +1:")
    for label, grad in report["clip_sweep"]["gradient_at_ratio_1.25_positive_advantage"].items():
        lines.append(f"    {label:22s} {grad:.2f}")
    weights = report["token_weights"]
    lines.append(f"(c) responses of {weights['response_lengths']} tokens, share of the gradient:")
    for name in ("token-level (DAPO)", "sample-level (GRPO)"):
        share = ", ".join(f"{s:.2f}" for s in weights[name]["share_of_gradient_per_response"])
        lines.append(f"    {name:20s} [{share}]")
    return lines
