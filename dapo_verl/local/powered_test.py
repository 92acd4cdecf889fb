"""The declared primary metric of a powered study, per run, and its paired test across seeds.

A study with a :class:`~dapo_verl.local.arms.PrimaryMetric` (``dapo-verl ablate --setting clip-acts``) is read
by one number per run: the normalised area under the curve of the primary key over the run's evaluations
(:func:`~dapo_verl.report.stats.normalised_auc`). Paired by seed, d = treatment - baseline; the test is
Student's paired t-test, two-sided, with its 95% interval (:func:`~dapo_verl.report.stats.paired_t_test`).
The reading is stated from the interval, whatever it says: the paper's direction (interval above 0), the
opposite (below 0), or no detectable difference (the interval holds 0, with the effect the seed count was
powered for). The seed count's power calculation (:class:`~dapo_verl.local.arms.PowerPlan`) is reported
beside it, and a run with fewer seeds than planned is called underpowered.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dapo_verl.local.arms import PowerPlan, PrimaryMetric, Study
from dapo_verl.report import RunLog
from dapo_verl.report.stats import PairedTest, normalised_auc, paired_t_test

__all__ = [
    "PooledEstimate",
    "PrimaryResult",
    "analyse_primary",
    "development_differences",
    "pool_with_development",
    "primary_value",
]


def primary_value(run: RunLog, primary: PrimaryMetric) -> float | None:
    """The run's normalised area under the curve of ``primary.key``; None if it logged the key fewer than twice.

    Raises:
        ValueError: if the pattern matches more than one of the run's metrics.
    """
    keys = fnmatch.filter(run.metrics, primary.key)
    if len(keys) > 1:
        raise ValueError(f"the primary metric {primary.key!r} matches {keys} in {run.path}; it must name one metric.")
    series = run.series(keys[0]) if keys else None
    if series is None or len(series) < 2:
        return None
    return normalised_auc([float(s) for s in series.index], [float(v) for v in series])


@dataclass(frozen=True)
class PrimaryResult:
    """The paired comparison of a study's primary metric.

    Attributes:
        primary: The declared metric.
        values: arm -> seed -> the run's value.
        differences: seed -> treatment - baseline, for the seeds both arms have.
        evaluation_steps: The steps at which the runs logged the primary metric (the curve's points).
        test: The paired t-test; None with fewer than 2 pairs.
        power: The study's power calculation, if any.
        reading: One plain sentence: what the interval says.
    """

    primary: PrimaryMetric
    values: Mapping[str, Mapping[int, float]]
    differences: Mapping[int, float]
    evaluation_steps: tuple[int, ...]
    test: PairedTest | None
    power: PowerPlan | None
    reading: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the declaration, per-run values, differences, the test, the power plan and the reading."""
        return {
            "primary_metric": asdict(self.primary),
            "test_name": "Student's paired t-test, two-sided",
            "values": {arm: {str(k): v for k, v in seeds.items()} for arm, seeds in self.values.items()},
            "differences": {str(k): v for k, v in self.differences.items()},
            "evaluation_steps": list(self.evaluation_steps),
            "test": None if self.test is None else self.test.to_dict(),
            "power": None if self.power is None else asdict(self.power),
            "reading": self.reading,
        }

    def markdown(self) -> list[str]:
        """The section of ``ablation.md``: declaration, power calculation, test and reading."""
        p, lines = self.primary, ["## Primary metric and paired test", ""]
        lines += [
            f"Declared before the main run: **{p.title}** of `{p.key}`, {p.treatment} minus {p.baseline}, "
            "paired by seed; Student's paired t-test, two-sided, with its 95% confidence interval. The runs "
            f"evaluated it at steps {_steps_text(self.evaluation_steps)}.",
            "",
        ]
        if self.power is not None:
            w = self.power
            target = "the pilot's effect" if w.effect == w.pilot_effect else "an effect of"
            sizing = (
                f"the pilot's SD {w.pilot_sd:.4f}" if w.planning_sd is None else f"a planning SD of {w.planning_sd:.4f}"
            )
            lines += [
                f"Seeds: {w.seeds}, for {w.power:.0%} power at alpha {w.alpha} (paired t-test sample size: the "
                f"normal approximation n = ((z + z) SD / effect)^2 refined with t quantiles) to detect "
                f"{target} ±{abs(w.effect):.4f} with {sizing}. Pilot (seeds "
                f"{_seed_text(w.pilot_seeds)}, not reused here): paired effect {w.pilot_effect:+.4f}, "
                f"SD {w.pilot_sd:.4f}, which would need {w.pilot_effect_seeds} seeds"
                + (f"; {w.why}." if w.why else "."),
                "",
            ]
        if self.test is not None:
            t = self.test
            lines += [
                "| pairs | difference, mean | SD | 95% CI | t | df | p | better / same / worse |",
                "|---|---|---|---|---|---|---|---|",
                f"| {t.n} | {t.mean:+.4f} | {t.sd:.4f} | [{t.ci_low:+.4f}, {t.ci_high:+.4f}] | {t.t:.2f} "
                f"| {t.df} | {t.p_value:.3g} | {t.better} / {t.same} / {t.worse} |",
                "",
            ]
        return [*lines, f"**Reading.** {self.reading}", ""]


def _steps_text(steps: Sequence[int]) -> str:
    """``0, 5, 10`` or, for a long regular schedule, ``0, 5, ..., 40``; ``none`` when empty."""
    if len(steps) > 4 and len({b - a for a, b in itertools.pairwise(steps)}) == 1:
        return f"{steps[0]}, {steps[1]}, ..., {steps[-1]}"
    return ", ".join(map(str, steps)) or "none"


def _reading(primary: PrimaryMetric, test: PairedTest | None, power: PowerPlan | None) -> str:
    if test is None:
        return "Fewer than two seeds ran in both arms: no test."
    stats = (
        f"{primary.treatment} minus {primary.baseline} is {test.mean:+.4f} (95% CI [{test.ci_low:+.4f}, "
        f"{test.ci_high:+.4f}], paired t({test.df}) = {test.t:.2f}, p = {test.p_value:.3g}, n = {test.n})"
    )
    planned = (
        ""
        if power is None or test.n >= power.seeds
        else (f" Underpowered: {test.n} of the {power.seeds} planned seeds ran.")
    )
    name = primary.effect_name
    if primary.margin is not None:  # a guard: does the treatment hold the metric?
        if test.ci_high < 0:
            return f"It loses: {stats}; the interval lies below 0: {name} lowered the primary metric.{planned}"
        if test.ci_low > -primary.margin:
            return (
                f"It holds: {stats}; the interval's lower end is above -{primary.margin:g}, the smallest loss "
                f"of interest.{planned}"
            )
        return f"Undecided: {stats}; the interval reaches below -{primary.margin:g} and above 0.{planned}"
    if test.ci_low > 0:
        return f"The paper's direction: {stats}; {name} raised the primary metric.{planned}"
    if test.ci_high < 0:
        return f"The opposite of the paper's direction: {stats}; {name} lowered the primary metric.{planned}"
    powered = (
        ""
        if power is None
        else (f" The seed count had {power.power:.0%} power for an effect of ±{abs(power.effect):.4f}.")
    )
    return f"No detectable effect: {stats}; the interval holds 0.{powered}{planned}"


def analyse_primary(study: Study, runs: Mapping[str, Sequence[tuple[int, RunLog]]]) -> PrimaryResult | None:
    """The paired comparison of ``study.primary``; None for a study without one.

    Args:
        study: The study.
        runs: arm name -> ``(seed, run)`` of each of its runs.
    """
    primary = study.primary
    if primary is None:
        return None
    values = {
        arm: {seed: v for seed, run in runs.get(arm, ()) if (v := primary_value(run, primary)) is not None}
        for arm in (primary.baseline, primary.treatment)
    }
    steps = sorted(
        {
            int(step)
            for arm in (primary.baseline, primary.treatment)
            for _, run in runs.get(arm, ())
            for key in fnmatch.filter(run.metrics, primary.key)
            for step in run.series(key).index
        }
    )
    base, treat = values[primary.baseline], values[primary.treatment]
    differences = {seed: treat[seed] - base[seed] for seed in base if seed in treat}
    test = paired_t_test(list(differences.values())) if len(differences) >= 2 else None
    return PrimaryResult(
        primary=primary,
        values=values,
        differences=differences,
        evaluation_steps=tuple(steps),
        test=test,
        power=study.power,
        reading=_reading(primary, test, study.power),
    )


@dataclass(frozen=True)
class PooledEstimate:
    """A replication beside the study it replicates: the development estimate, the replication's and both pooled.

    The pooled estimate is one paired t-test over every paired difference of both runs (the same arms, metric and
    design, on disjoint seeds). It includes the development run, so it is the best estimate of the effect but not
    independent evidence for it: whether the effect replicated is read from the replication's interval alone.

    Attributes:
        development_study: The replicated study's name.
        development: Its paired test, from its runs' differences.
        development_seeds: Its seeds.
        replication: This study's paired test.
        pooled: The paired test of both runs' differences together.
    """

    development_study: str
    development: PairedTest
    development_seeds: tuple[int, ...]
    replication: PairedTest
    pooled: PairedTest

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the three tests and the development run's name and seeds."""
        return {
            "development_study": self.development_study,
            "development_seeds": list(self.development_seeds),
            "development": self.development.to_dict(),
            "replication": self.replication.to_dict(),
            "pooled": self.pooled.to_dict(),
        }

    def markdown(self) -> list[str]:
        """The section of ``ablation.md``: the three estimates and what the replication's interval says of the
        development estimate."""
        rows = [
            (f"development ({self.development_study}, seeds {_seed_text(self.development_seeds)})", self.development),
            ("replication (this study)", self.replication),
            ("pooled (both; not independent of the development run)", self.pooled),
        ]
        lines = [
            "## Development, replication and pooled",
            "",
            "| estimate | pairs | difference, mean | SD | 95% CI | t | p | better / same / worse |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {name} | {t.n} | {t.mean:+.4f} | {t.sd:.4f} | [{t.ci_low:+.4f}, {t.ci_high:+.4f}] | {t.t:.2f} "
            f"| {t.p_value:.3g} | {t.better} / {t.same} / {t.worse} |"
            for name, t in rows
        ]
        held = self.replication.ci_low <= self.development.mean <= self.replication.ci_high
        lines += [
            "",
            f"The replication's interval {'holds' if held else 'excludes'} the development estimate "
            f"{self.development.mean:+.4f}"
            + ("." if held else ": the effect is smaller than the development run measured, if there is one."),
            "",
        ]
        return lines


def _seed_text(seeds: Sequence[int]) -> str:
    """``0-25`` for a run of more than two consecutive seeds, else the seeds listed."""
    ordered = sorted(seeds)
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def pool_with_development(result: PrimaryResult, development_dir: Path, development_study: str) -> PooledEstimate:
    """Pool ``result`` (a replication) with the paired differences of the study it replicates, read from that
    ablation's ``report.json``.

    Args:
        result: The replication's paired comparison.
        development_dir: The replicated ablation's folder (``dapo-verl ablate --out`` of that study).
        development_study: The replicated study's name, for the report.

    Raises:
        ValueError: if the folder holds no ablation report with a paired test, if its primary metric or arms
            differ from the replication's, if the two share a seed, or if either has fewer than two pairs.
    """
    differences = development_differences(development_dir, result.primary)
    shared = sorted(set(differences) & set(result.differences))
    if shared:
        raise ValueError(
            f"--pool-with {development_dir}: the development run and the replication share seeds "
            f"{shared}; a replication runs fresh seeds. Point --pool-with at the study it replicates."
        )
    if len(result.differences) < 2:
        raise ValueError(f"the replication has {len(result.differences)} paired seed(s); pooling needs at least 2.")
    return PooledEstimate(
        development_study=development_study,
        development=paired_t_test(list(differences.values())),
        development_seeds=tuple(sorted(differences)),
        replication=paired_t_test(list(result.differences.values())),
        pooled=paired_t_test([*differences.values(), *result.differences.values()]),
    )


def development_differences(development_dir: Path, primary: PrimaryMetric) -> dict[int, float]:
    """Seed -> paired difference of the primary metric, from the ablation report in ``development_dir``.

    Raises:
        ValueError: if there is no readable report with a paired test, if it tested another metric or other
            arms, or if it holds fewer than two pairs.
    """
    import json

    path = development_dir / "report.json"
    try:
        analysis = json.loads(path.read_text())["analysis"]["primary"]
        declared, raw = analysis["primary_metric"], analysis["differences"]
        differences = {int(seed): float(value) for seed, value in raw.items()}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"--pool-with {development_dir}: no ablation report with a paired test there ({path}: "
            f"{type(err).__name__}: {err}). Run the study it replicates first, e.g. `dapo-verl ablate "
            f"--setting clip-acts`, and pass its --out."
        ) from None
    mine = {field: getattr(primary, field) for field in ("key", "baseline", "treatment")}
    theirs = {field: declared.get(field) for field in mine}
    if theirs != mine:
        raise ValueError(
            f"--pool-with {development_dir}: its paired test is of {theirs}, this study's of {mine}; "
            f"only the same metric and arms pool. Point --pool-with at the study this one replicates."
        )
    if len(differences) < 2:
        raise ValueError(
            f"--pool-with {development_dir}: its report holds {len(differences)} paired seed(s); "
            "pooling needs at least 2."
        )
    return differences
