"""What ``dapo-verl ablate`` writes and shows: run outcomes, progress lines, the report files, the summary table.

:func:`write_ablation_report` builds :func:`dapo_verl.report.build_report` from every run of an ablation
(``report.md``, ``report.json``, ``accuracy.png``, ``entropy.png``, ``clip_fractions.png``, and
``pass_at_k.png`` and ``clipped_probability.png`` when the runs logged them) and adds ``ablation.md``
(:func:`summary_markdown`: for a study with a declared primary metric its paired test first
(:mod:`.powered_test`, also under ``"analysis"`` in ``report.json``); one row per arm with the spread over
seeds, the final held-out accuracy of every seed, the arms' overrides, run times) and ``curves.png``
(held-out accuracy, answer-then-EOS, pass@k, entropy, response length and the clipped tokens' probability
over steps, one line per arm).

:mod:`dapo_verl.report` is pure Python (numpy, pandas, matplotlib) and imports no verl or ray, so the local
backend's import boundary (no verl, no ray) still holds.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dapo_verl.files import write_text_atomically
from dapo_verl.local.arms import Study
from dapo_verl.local.powered_test import PooledEstimate, PrimaryResult, analyse_primary, pool_with_development
from dapo_verl.report import DEFAULT_METRICS, JSON_FILE, Report, RunLog, build_report, load_runs, write_report
from dapo_verl.report.plots import plot_arms
from dapo_verl.report.summary import Spread, accuracy_keys, pass_at_k_keys

__all__ = [
    "CURVES_FILE",
    "SUMMARY_FILE",
    "Progress",
    "RunOutcome",
    "check_compare_out",
    "summary_markdown",
    "write_ablation_report",
]

SUMMARY_FILE = "ablation.md"
CURVES_FILE = "curves.png"


@dataclass(frozen=True)
class RunOutcome:
    """A finished run of an ablation.

    Attributes:
        arm: The arm's name.
        seed: ``data.seed``.
        run_dir: Where its outputs are.
        final_accuracy: Held-out greedy accuracy after the last step (None if never evaluated).
        final_exact: Held-out share of exact responses (answer then EOS) after the last step.
        steps: Training steps.
        wall_s: The run's own wall time (the earlier run's when reused).
        reused: True when a finished run was found in ``run_dir`` and not rerun.
    """

    arm: str
    seed: int
    run_dir: Path
    final_accuracy: float | None
    final_exact: float | None
    steps: int
    wall_s: float
    reused: bool


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


class Progress:
    """An ``on_run`` callback that writes one line per finished run, with an estimate of the time left.

    The estimate is the mean wall time of the runs trained so far times the runs left, divided by the runs
    trained at once.

    Args:
        write: Where each line goes (``print`` in the CLI).
        jobs: Runs trained at the same time.
        clock: Seconds since some fixed point (``time.perf_counter``); elapsed time counts from construction.
    """

    def __init__(
        self, write: Callable[[str], object], *, jobs: int = 1, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.write, self.jobs, self.clock = write, jobs, clock
        self.started = clock()
        self.trained_s: list[float] = []

    def __call__(self, outcome: RunOutcome, done: int, total: int) -> None:
        """Write the line of one finished (or reused) run."""
        elapsed = self.clock() - self.started

        def fmt(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.2f}"

        if outcome.reused:
            timing = f"reused ({outcome.wall_s:.0f} s earlier)"
        else:
            self.trained_s.append(outcome.wall_s)
            left = total - done
            estimate = sum(self.trained_s) / len(self.trained_s) * left / max(1, min(self.jobs, left))
            timing = f"{outcome.wall_s:.0f} s; elapsed {_clock(elapsed)}, about {_clock(estimate)} left"
        width = len(str(total))
        self.write(
            f"[{done:>{width}}/{total}] {outcome.arm} seed {outcome.seed}: held-out accuracy "
            f"{fmt(outcome.final_accuracy)}, answer+EOS {fmt(outcome.final_exact)}, {timing}"
        )


def _report_metrics(arms: Mapping[str, Sequence[RunLog]]) -> list[str]:
    """Held-out accuracy, answer-then-EOS, pass@k, the report's default metrics, then the share truncated."""
    available = sorted({key for runs in arms.values() for run in runs for key in run.metrics})
    exact = fnmatch.filter(available, "val-aux/*/exact/mean@*")
    wanted = [
        *accuracy_keys(available),
        *exact,
        *pass_at_k_keys(available),
        *DEFAULT_METRICS,
        "response_length/clip_ratio",
    ]
    return [key for key in dict.fromkeys(wanted) if key in available]


def write_ablation_report(
    study: Study, outcomes: Sequence[RunOutcome], out: Path, *, pool_with: Path | None = None
) -> tuple[Report, dict[str, Path]]:
    """Write the report files of an ablation into ``out`` (see the module docstring).

    Args:
        study: The study.
        outcomes: Its runs.
        out: The ablation's folder.
        pool_with: For a replication, the folder of the study it replicates: its estimate and the two pooled go
            into ``ablation.md`` and under ``"analysis"`` in ``report.json``.

    Returns:
        The report and name -> file written (the report's files plus ``curves`` and ``summary``).
    """
    paths: dict[str, list[Path]] = {}
    for outcome in outcomes:
        paths.setdefault(outcome.arm, []).append(outcome.run_dir)
    arms = load_runs(paths)
    report = build_report(arms, metrics=_report_metrics(arms))
    seeds = {arm: [o.seed for o in outcomes if o.arm == arm] for arm in arms}
    primary = analyse_primary(study, {arm: list(zip(seeds[arm], runs, strict=True)) for arm, runs in arms.items()})
    pooled = None
    if primary is not None and pool_with is not None and study.replicates is not None:
        pooled = pool_with_development(primary, pool_with, study.replicates)
    if primary is not None:  # the declared test goes into report.json beside every metric
        analysis = {"primary": primary.to_dict()} | ({"pooled": pooled.to_dict()} if pooled else {})
        report = dataclasses.replace(report, analysis=analysis)
    report = write_report(report, out)
    files = dict(report.files)
    panels = [k for k in report.metrics if k.startswith("val-")] + [
        k
        for k in (
            "actor/entropy",
            "response_length/mean",
            "actor/dapo/clip_upper_old_prob_mean",
            "actor/dapo/clip_upper_positive_share",
        )
        if k in report.metrics
    ]
    files["curves"] = plot_arms(arms, panels, out / CURVES_FILE, title=study.title)
    files["summary"] = out / SUMMARY_FILE
    write_text_atomically(files["summary"], summary_markdown(study, outcomes, report, primary, pooled))
    return report, files


def _has_analysis(report_json: Path) -> bool:
    try:
        return "analysis" in json.loads(report_json.read_text())
    except (OSError, ValueError, TypeError):
        return False


def check_compare_out(out: Path) -> None:
    """Refuse an output folder of ``dapo-verl compare`` that holds an ablation's report, which it would replace.

    An ablation's ``report.json`` holds its paired test and power analysis (``"analysis"``) and sits beside
    ``ablation.md``; ``compare`` writes a plain ``report.json``, ``report.md`` and plots.

    Raises:
        ValueError: naming the file that would be overwritten and another ``--out``.
    """
    report_json = out / JSON_FILE
    if report_json.is_file() and ((out / SUMMARY_FILE).exists() or _has_analysis(report_json)):
        raise ValueError(
            f"--out {out} holds an ablation's report ({SUMMARY_FILE} beside it); this comparison would "
            f"overwrite {report_json}, and with it any paired test and power analysis of the ablation, "
            f"its report.md and plots. Choose another --out, e.g. --out {out / 'compare'}."
        )


# -- the summary table -----------------------------------------------------------------------------

_COLUMNS = (
    ("held-out acc", "val-core/*/acc/mean@*", "final"),
    ("answer+EOS", "val-aux/*/exact/mean@*", "final"),
    ("entropy (run mean)", "actor/entropy", "run_mean"),
    ("response length (run mean)", "response_length/mean", "run_mean"),
    ("pass@G (final)", "val-core/*/acc/best@*/mean", "final"),
    ("upper clip frac. (run mean)", "actor/dapo/clip_upper_fraction", "run_mean"),
    ("upper clip share of A>0 tokens (run mean)", "actor/dapo/clip_upper_positive_share", "run_mean"),
    ("old prob. of upper-clipped tokens (run mean)", "actor/dapo/clip_upper_old_prob_mean", "run_mean"),
    ("lower clip frac. (run mean)", "actor/dapo/clip_lower_fraction", "run_mean"),
    ("generated/trained (run mean)", "dapo/sampler/generated_per_trained", "run_mean"),
)
"""(column title, metric key or pattern, which statistic) of the summary table."""


def _spread_cell(spread: Spread) -> str:
    if spread.mean is None:
        return "n/a"
    std = "" if spread.std is None else f" ± {spread.std:.2g}"
    return f"{spread.mean:.3g}{std} ({spread.min:.3g}–{spread.max:.3g})"


def _columns(report: Report) -> list[tuple[str, str, str]]:
    chosen = []
    for title, pattern, stat in _COLUMNS:
        key = next(iter(fnmatch.filter(report.metrics, pattern)), None)
        if key is not None:
            chosen.append((title, key, stat))
    return chosen


def summary_markdown(
    study: Study,
    outcomes: Sequence[RunOutcome],
    report: Report,
    primary: PrimaryResult | None = None,
    pooled: PooledEstimate | None = None,
) -> str:
    """The ablation in Markdown: the primary test (if any), one row per arm (mean ± std (min–max) over seeds),
    per-seed accuracy, the arms.

    Args:
        study: The arms.
        outcomes: Every run.
        report: The report built from the runs.
        primary: The paired test of the study's declared primary metric, if it has one.
        pooled: For a replication pooled with the study it replicates, the three estimates.
    """
    lines = [f"# {study.title}", ""]
    lines += primary.markdown() if primary is not None else []
    lines += pooled.markdown() if pooled is not None else []
    lines += [
        "Mean ± sample std (min–max) over seeds. Final held-out values are the last evaluation; run means "
        "average every logged step (see report.md).",
        "",
    ]
    lines += _arm_table(study, outcomes, report)
    lines += ["", "Final held-out accuracy per seed (the same seed gives every arm the same initial model):", ""]
    lines += _seed_table(study, outcomes)
    lines += ["", "Each arm against the arm above it, paired by seed (final held-out accuracy):", ""]
    lines += _paired_table(study, outcomes)
    lines += ["", "| arm | what | overrides |", "|---|---|---|"]
    lines += [f"| {a.name} | {a.description} | `{' '.join(a.overrides)}` |" for a in study.arms]
    walls = [o.wall_s for o in outcomes]
    lines += [
        "",
        f"{len(outcomes)} runs of {max(o.steps for o in outcomes)} steps; run wall time "
        f"{min(walls):.0f}–{max(walls):.0f} s, {sum(walls):.0f} s in all "
        f"({sum(o.reused for o in outcomes)} reused from an earlier call).",
    ]
    return "\n".join(lines) + "\n"


def _arm_table(study: Study, outcomes: Sequence[RunOutcome], report: Report) -> list[str]:
    columns = _columns(report)
    lines = [
        "| arm | seeds | " + " | ".join(title for title, _, _ in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for arm in study.arms:
        cells = [_spread_cell(getattr(report.row(key, arm.name), stat)) for _, key, stat in columns]
        runs = sum(o.arm == arm.name for o in outcomes)
        lines.append(f"| {arm.name} | {runs} | " + " | ".join(cells) + " |")
    return lines


def _seed_table(study: Study, outcomes: Sequence[RunOutcome]) -> list[str]:
    seeds = list(dict.fromkeys(o.seed for o in outcomes))
    by_run = {(o.arm, o.seed): o.final_accuracy for o in outcomes}
    lines = ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for arm in study.arms:
        values = [by_run.get((arm.name, s)) for s in seeds]
        lines.append(f"| {arm.name} | " + " | ".join("n/a" if v is None else f"{v:.2f}" for v in values) + " |")
    return lines


def _paired_table(study: Study, outcomes: Sequence[RunOutcome]) -> list[str]:
    by_run = {(o.arm, o.seed): o.final_accuracy for o in outcomes}
    seeds = list(dict.fromkeys(o.seed for o in outcomes))
    lines = ["| arm | against | difference, mean ± std | better / same / worse seeds |", "|---|---|---|---|"]
    for before, arm in itertools.pairwise(study.arms):
        pairs = [(by_run.get((arm.name, s)), by_run.get((before.name, s))) for s in seeds]
        # accuracies are multiples of 1 / (evaluation prompts): round so float noise cannot break a tie
        diffs = [round(a - b, 6) for a, b in pairs if a is not None and b is not None]
        spread = Spread.of(diffs)
        cell = (
            "n/a"
            if spread.mean is None
            else f"{spread.mean:+.3f}" + ("" if spread.std is None else f" ± {spread.std:.3f}")
        )
        counts = f"{sum(d > 0 for d in diffs)} / {sum(d == 0 for d in diffs)} / {sum(d < 0 for d in diffs)}"
        lines.append(f"| {arm.name} | {before.name} | {cell} | {counts} |")
    return lines
