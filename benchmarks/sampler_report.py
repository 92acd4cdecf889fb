"""Reporting for :mod:`benchmarks.bench_sampler`: spread over seeds, targets, the Markdown table, the commit id."""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TARGETS = {"fewer_than_recipe": (1.5, "min"), "rounds_mean": (1.2, "max")}
"""Targets for our carry strategies: >= 1.5x fewer responses per trained one than verl-recipe, <= 1.2 rounds."""

TARGET_STRATEGIES = ("adaptive_carry", "adaptive_carry_skip")

COLUMNS = (
    ("generated_per_trained", "gen/trained", 2),
    ("fewer_than_recipe", "x fewer than recipe", 2),
    ("oracle_share", "oracle share", 2),
    ("rounds_mean", "rounds/step", 2),
    ("rounds_max", "max rounds", 0),
    ("multi_round_share", "steps >1 round", 2),
    ("gen_time_mean", "gen time/step", 2),
    ("carried_share", "carried share", 2),
    ("partial_steps", "partial steps", 0),
    ("pool_trained_fraction", "pool trained", 2),
)
"""(metric, column title, decimals) of the table."""

HEADLINE = {key for key, _, _ in COLUMNS} | {"shortfall_groups", "prompts_skipped"}
"""Metrics printed in the per-strategy JSON lines (the JSON file has all of them, per seed)."""


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation (0 for one value), min and max."""
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def check_targets(result: dict) -> dict[str, Any]:
    """``{strategy: {metric: {"measured", "target", "met"}}}`` for the strategies of :data:`TARGET_STRATEGIES` run."""
    checks: dict[str, Any] = {}
    for name in TARGET_STRATEGIES:
        summary = result["strategies"].get(name, {}).get("summary", {})
        if "fewer_than_recipe" not in summary:  # the recipe was not run: nothing to compare with
            continue
        checks[name] = {}
        for metric, (target, kind) in TARGETS.items():
            measured = summary[metric]["mean"]
            met = measured >= target if kind == "min" else measured <= target
            checks[name][metric] = {"measured": measured, "target": target, "met": met}
    return checks


def format_table(
    result: dict,
    columns: Sequence[tuple[str, str, int]] = COLUMNS,
    *,
    max_key: str = "rounds_max",
    plain_without_spread: bool = False,
) -> str:
    """Markdown table: mean ± sd over seeds (for ``max_key``: the largest over all seeds).

    ``columns`` are (metric, title, decimals); ``plain_without_spread`` writes the mean alone where sd is 0
    (one seed).
    """
    lines = ["| strategy | " + " | ".join(title for _, title, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for entry in result["strategies"].values():
        cells = []
        for key, _, digits in columns:
            stats = entry["summary"].get(key)
            if stats is None:
                cells.append("-")
            elif key == max_key:
                cells.append(f"{stats['max']:.0f}")
            elif plain_without_spread and not stats["sd"]:
                cells.append(f"{stats['mean']:.{digits}f}")
            else:
                cells.append(f"{stats['mean']:.{digits}f} ± {stats['sd']:.{digits}f}")
        lines.append(f"| {entry['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_result(result: dict, path: Path) -> None:
    """Write a benchmark's JSON result to ``path`` (folders created) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")


def commit_id() -> str:
    """Short commit hash of this checkout, with ``-dirty`` when tracked files differ; "unknown" without git."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")
