"""Build an ablation report: load runs, summarise the key metrics per arm, write Markdown, JSON and plots.

:func:`build_report` is the entry point for ``dapo-verl compare`` and for any driver that runs the arms
itself: give it ``{label: [run paths or RunLog objects]}`` and an output directory. The statistics are
those of :mod:`dapo_verl.report.summary`; the plots those of :mod:`dapo_verl.report.plots`.

Files written to ``out_dir``: ``report.md`` (what :meth:`Report.to_markdown` returns), ``report.json``
(:meth:`Report.to_dict`), ``accuracy.png``, ``entropy.png``, ``clip_fractions.png``, ``pass_at_k.png`` and
``clipped_probability.png`` (each only when some run logged its metrics).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_verl.files import write_text_atomically
from dapo_verl.report.derived import RATIO_METRICS
from dapo_verl.report.plots import write_plots
from dapo_verl.report.readers import MetricFilter, RunLog, load_run
from dapo_verl.report.summary import (
    DEFAULT_LAST_FRAC,
    DEFAULT_METRICS,
    ArmMetric,
    Spread,
    UnknownMetricError,
    accuracy_keys,
    arm_metric,
    kept_metric,
    select_metrics,
)

__all__ = ["JSON_FILE", "MARKDOWN_FILE", "Report", "build_report", "load_runs", "summarize", "write_report"]

logger = logging.getLogger(__name__)

MARKDOWN_FILE = "report.md"
JSON_FILE = "report.json"
NA = "n/a"


@dataclass(frozen=True)
class Report:
    """The summary of an ablation.

    Attributes:
        arms: label -> the arm's runs, in the order given.
        metrics: The metric keys reported, in order.
        rows: One :class:`~dapo_verl.report.summary.ArmMetric` per (metric, arm), metric-major.
        last_frac: Share of a training metric's last logged values averaged into its final value.
        not_logged: Default metrics that no run logged (left out of ``rows``).
        files: Name (``markdown``, ``json`` and the plots of :func:`~dapo_verl.report.plots.write_plots`) -> file
            written.
        analysis: A driver's own JSON-ready results (e.g. ``dapo-verl ablate``'s paired test), written under
            ``"analysis"`` in ``report.json`` when not empty.
    """

    arms: Mapping[str, Sequence[RunLog]]
    metrics: Sequence[str]
    rows: Sequence[ArmMetric]
    last_frac: float
    not_logged: Sequence[str] = ()
    files: Mapping[str, Path] = field(default_factory=dict)
    analysis: Mapping[str, Any] = field(default_factory=dict)

    def row(self, metric: str, arm: str) -> ArmMetric:
        """The statistics of one metric in one arm.

        Raises:
            KeyError: if the report has no such row.
        """
        for row in self.rows:
            if row.metric == metric and row.arm == arm:
                return row
        raise KeyError(
            f"no row for metric {metric!r} and arm {arm!r}; metrics: {list(self.metrics)}, arms: {list(self.arms)}"
        )

    def to_markdown(self) -> str:
        """The report as Markdown: the rule, the metric table, the runs read, and notes."""
        lines = [
            self.title,
            "",
            _rule_text(self.last_frac),
            "",
            "| metric | arm | n | final | final min–max | run mean | run mean min–max |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [_markdown_row(row) for row in self.rows]
        if self.warnings:
            lines += ["", "## Warnings", "", *(f"- {_cell(w)}" for w in self.warnings)]
        lines += ["", "## Runs", "", "| arm | run | format | steps | metrics |", "|---|---|---|---|---|"]
        for label, runs in self.arms.items():
            lines += [
                f"| {_cell(label)} | {_cell(run.path)} | {run.format.value} | {_step_range(run)} | {len(run.metrics)} |"
                for run in runs
            ]
        logged = {key for runs in self.arms.values() for run in runs for key in run.metrics}
        undefined = [k for k in self.not_logged if k in RATIO_METRICS and set(RATIO_METRICS[k]) <= logged]
        missing = [k for k in self.not_logged if k not in undefined]
        if missing:
            lines += ["", f"Not logged by any run: {', '.join(f'`{k}`' for k in missing)}."]
        if undefined:
            counts = ", ".join(f"`{k}`: `{RATIO_METRICS[k][1]}`" for k in undefined)
            lines += ["", f"Undefined in every run, because their count was 0 at every step (no such token): {counts}."]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (None where a value is missing)."""
        arms: dict[str, Any] = {}
        for label, runs in self.arms.items():
            arms[label] = {"runs": [_run_info(run) for run in runs], "metrics": {}}
        for row in self.rows:
            arms[row.arm]["metrics"][row.metric] = {
                "final": dataclasses.asdict(row.final),
                "run_mean": dataclasses.asdict(row.run_mean),
                "runs": row.runs,
                "per_run": {path: dataclasses.asdict(v) for path, v in row.per_run.items()},
            }
        data = {
            "last_frac": self.last_frac,
            "rule": _rule_text(self.last_frac),
            "metrics": list(self.metrics),
            "not_logged": list(self.not_logged),
            "warnings": self.warnings,
            "arms": arms,
        }
        return data | ({"analysis": dict(self.analysis)} if self.analysis else {})

    @property
    def title(self) -> str:
        """The Markdown heading: what was compared (one run, one arm's runs, or arms against each other)."""
        runs = [len(arm) for arm in self.arms.values()]
        if len(runs) == 1 and runs[0] == 1:
            return f"# Run report: `{next(iter(self.arms.values()))[0].path}`"
        if len(runs) == 1:
            return f"# Report: arm `{next(iter(self.arms))}`, {runs[0]} runs"
        arms = " vs ".join(f"`{arm}`" for arm in self.arms)
        return f"# Comparison: {arms} ({' / '.join(map(str, runs))} runs)"

    @property
    def warnings(self) -> list[str]:
        """One line per note of a log reader (:attr:`~dapo_verl.report.readers.RunLog.notes`: what it left out), and
        per run whose final value of a reported metric is missing: not finite at the end, or never logged by that
        run while another run of the report logged it (each such run counts out of ``n``)."""
        runs = {str(run.path): run for arm_runs in self.arms.values() for run in arm_runs}
        lines = [f"{path}: {run.source.name} {note}" for path, run in runs.items() for note in run.notes]
        for row in self.rows:
            for path, value in row.per_run.items():
                if value.nonfinite_step is not None:
                    last = (
                        f"; its last finite value was at step {value.last_step}" if value.last_step is not None else ""
                    )
                    lines.append(
                        f"{path}: {row.metric} is NaN, inf or null at step {value.nonfinite_step}, so it "
                        f"has no final value (reported as n/a{last})."
                    )
                elif value.points == 0:
                    lines.append(
                        f"{path}: never logged {row.metric}, which another run of the report logged (its "
                        f"log holds steps {_step_range(runs[path])})."
                    )
        return lines


def _rule_text(last_frac: float) -> str:
    return (
        f"Final value per run: the last logged value of a validation metric (`val-*`), the mean of the last "
        f"{last_frac:.0%} of the logged values of a training metric. Run mean: the mean over the whole run. "
        "Across an arm's runs: mean ± sample std, min–max; n = runs that logged the metric / runs in the arm."
    )


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")  # a "|" in a label or path would end the Markdown cell


def _number(value: float | None) -> str:
    return NA if value is None else f"{value:.4g}"


def _mean_std(spread: Spread) -> str:
    if spread.mean is None:
        return NA
    return _number(spread.mean) if spread.std is None else f"{_number(spread.mean)} ± {_number(spread.std)}"


def _min_max(spread: Spread) -> str:
    return NA if spread.min is None else f"{_number(spread.min)} – {_number(spread.max)}"


def _markdown_row(row: ArmMetric) -> str:
    cells = [
        f"`{_cell(row.metric)}`",
        _cell(row.arm),
        f"{row.final.n}/{row.runs}",
        _mean_std(row.final),
        _min_max(row.final),
        _mean_std(row.run_mean),
        _min_max(row.run_mean),
    ]
    return "| " + " | ".join(cells) + " |"


def _step_range(run: RunLog) -> str:
    steps = run.table.index
    return f"{steps.min()}–{steps.max()} ({len(steps)})" if len(steps) else NA


def _run_info(run: RunLog) -> dict[str, Any]:
    steps = run.table.index
    return {
        "path": str(run.path),
        "source": str(run.source),
        "format": run.format.value,
        "first_step": int(steps.min()) if len(steps) else None,
        "last_step": int(steps.max()) if len(steps) else None,
        "steps": len(steps),
        "metrics": len(run.metrics),
    }


def load_runs(
    runs: Mapping[str, Sequence[str | Path | RunLog]], keep: MetricFilter | None = None
) -> dict[str, list[RunLog]]:
    """Load every run (paths are read with :func:`~dapo_verl.report.readers.load_run`; RunLogs are kept).

    Args:
        runs: label -> run paths or loaded runs.
        keep: Which metrics' values to keep (None: all); see :func:`~dapo_verl.report.summary.kept_metric`.

    Raises:
        ValueError: if there is no arm or an arm has no run.
        FileNotFoundError, NoMetricsLogError: as :func:`~dapo_verl.report.readers.load_run`.
    """
    if not runs:
        raise ValueError("no arm given; pass at least one run.")
    empty = [label for label, paths in runs.items() if not paths]
    if empty:
        raise ValueError(f"arm(s) {empty} have no run; give each label at least one run path.")
    return {label: [r if isinstance(r, RunLog) else load_run(r, keep) for r in paths] for label, paths in runs.items()}


def summarize(
    arms: Mapping[str, Sequence[RunLog]], *, metrics: Sequence[str] | None = None, last_frac: float = DEFAULT_LAST_FRAC
) -> Report:
    """Summarise loaded runs (nothing is written).

    Args:
        arms: label -> runs.
        metrics: Metric keys or glob patterns to report; None for the defaults
            (:func:`~dapo_verl.report.summary.select_metrics`).
        last_frac: In (0, 1]; share of a training metric's last logged values averaged into its final value.

    Raises:
        ValueError: if ``last_frac`` is out of range.
        UnknownMetricError: if a requested metric matches nothing, or no default metric was logged.
    """
    if not 0.0 < last_frac <= 1.0:
        raise ValueError(f"--last-frac must be in (0, 1], got {last_frac}; 0.2 averages the last fifth.")
    available = sorted({key for runs in arms.values() for run in runs for key in run.metrics})
    keys = select_metrics(available, metrics)
    if not keys:
        raise UnknownMetricError(
            f"no run logged any default metric (held-out accuracy val-core/*/acc/mean@*, "
            f"{', '.join(DEFAULT_METRICS)}); choose metrics with --metrics from the "
            f"{len(available)} logged, e.g. {', '.join(available[:5])}."
        )
    not_logged = [k for k in DEFAULT_METRICS if k not in available] if metrics is None else []
    rows = [arm_metric(label, runs, key, last_frac=last_frac) for key in keys for label, runs in arms.items()]
    return Report(arms=dict(arms), metrics=keys, rows=rows, last_frac=last_frac, not_logged=not_logged)


def write_report(report: Report, out_dir: str | Path, *, plots: bool = True) -> Report:
    """Write ``report.md``, ``report.json`` and (with ``plots``) the PNG plots; return the report with ``files``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"markdown": out / MARKDOWN_FILE, "json": out / JSON_FILE}
    write_text_atomically(files["markdown"], report.to_markdown())
    write_text_atomically(files["json"], json.dumps(report.to_dict(), indent=2) + "\n")
    if plots:
        accuracy = [k for k in report.metrics if k in accuracy_keys(report.metrics)]
        if not accuracy:
            accuracy = accuracy_keys(sorted({k for runs in report.arms.values() for r in runs for k in r.metrics}))
        files.update(write_plots(report.arms, accuracy, out))
    logger.info("wrote %s", ", ".join(str(p) for p in files.values()))
    return dataclasses.replace(report, files=files)


def build_report(
    runs: Mapping[str, Sequence[str | Path | RunLog]],
    out_dir: str | Path | None = None,
    *,
    metrics: Sequence[str] | None = None,
    last_frac: float = DEFAULT_LAST_FRAC,
    plots: bool = True,
) -> Report:
    """Load the runs of every arm, summarise them and (with ``out_dir``) write the report files.

    Args:
        runs: label -> run paths (directories or log files, any format of :mod:`~dapo_verl.report.readers`)
            or already loaded :class:`~dapo_verl.report.readers.RunLog` objects. Several runs under one label
            are the seeds of one arm.
        out_dir: Where to write ``report.md``, ``report.json`` and the plots; None writes nothing.
        metrics: Metric keys or glob patterns to report; None for the defaults.
        last_frac: In (0, 1]; share of a training metric's last logged values averaged into its final value.
        plots: Write the PNG plots (with ``out_dir``).

    Returns:
        The :class:`Report`; ``files`` lists what was written.

    Raises:
        FileNotFoundError: if a run path does not exist.
        ValueError: (including ``NoMetricsLogError`` and ``UnknownMetricError``) for a path without a metrics
            log, a requested metric that no run logged, or a bad ``last_frac``.

    Example:
        >>> from pathlib import Path; import json, tempfile
        >>> run = Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> _ = run.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": e}}) + "\\n"
        ...                            for s, e in [(1, 0.9), (2, 0.7), (3, 0.5)]))
        >>> report = build_report({"clip028": [run]}, last_frac=0.5)
        >>> report.row("actor/entropy", "clip028").final.mean  # mean of the last ceil(0.5 * 3) = 2 values
        0.6
    """
    report = summarize(load_runs(runs, kept_metric(metrics)), metrics=metrics, last_frac=last_frac)
    return report if out_dir is None else write_report(report, out_dir, plots=plots)
