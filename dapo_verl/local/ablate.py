"""``dapo-verl ablate``: every arm of a study times several seeds on the local backend, then the report.

:func:`run_ablation` trains each (arm, seed) with :func:`dapo_verl.local.train.run` into
``<out>/<arm>/seed<k>/`` -- the layout ``dapo-verl compare <out>/*/seed*`` groups by arm -- and builds the
report with :func:`dapo_verl.report.build_report`. The arms are data (:mod:`dapo_verl.local.arms`). Runs
are ordered seed by seed, so an interrupted ablation has about as many seeds in every arm, and with
``jobs=2`` the two arms of a seed train side by side (:mod:`dapo_verl.local.run_pool`; Ctrl-C starts no further
run and stops the ones in training at their step boundary). Each run uses ``local.num_threads`` torch threads (1).
With ``steps`` every arm trains that many steps, and the study's arms and report say so (:meth:`Study.with_steps`).

Resuming: a run whose directory holds a finished run of the same configuration (``summary.json`` at the
requested step count, ``config.yaml`` equal except for run-length, output and cache keys) is reused;
an unfinished one continues from its latest checkpoint (``trainer.resume_mode=auto``); a directory holding
a run of a different configuration is an error, never overwritten. A run's metrics do not depend on
``jobs``: on CPU with a fixed thread count a run is bit-reproducible.

Files in ``<out>``: ``report.md``, ``report.json``, ``accuracy.png``, ``entropy.png``, ``clip_fractions.png``,
``clipped_probability.png``, ``pass_at_k.png`` (when held-out responses were sampled), ``ablation.md`` (the
summary table, and the paired test of a study's declared primary metric) and ``curves.png`` (see
:mod:`dapo_verl.local.ablation_report`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from dapo_verl.local.ablation_report import Progress, RunOutcome, write_ablation_report
from dapo_verl.local.arms import STEPS_KEY, Arm, Study
from dapo_verl.local.compose import RunSpec, changed_keys, compose_run
from dapo_verl.local.powered_test import development_differences
from dapo_verl.local.run_pool import AblationInterrupted, train_runs
from dapo_verl.report import Report

__all__ = [
    "DEFAULT_JOBS",
    "DEFAULT_SEEDS",
    "QUIET_LOGGERS",
    "AblationInterrupted",
    "AblationResult",
    "PlannedRun",
    "Progress",
    "RunOutcome",
    "plan_runs",
    "run_ablation",
    "seed_list",
]

logger = logging.getLogger(__name__)

DEFAULT_SEEDS = 10
"""Seeds per arm (``data.seed`` 0..N-1) of ``dapo-verl ablate``: seed variance dominates at this scale. With 10
seeds and 2 jobs the clip ablation (20 runs) took 8.4 min and the ladder (60 runs) 7.3 min on 2 shared CPU cores."""

DEFAULT_JOBS = 2
"""Runs trained at the same time, one torch thread each; on 2 cores 2 jobs finished 4 default runs in 78 s
instead of 115 s (one job)."""

_OWN_KEYS = {
    "data.seed": "--seeds or --seed-list",
    "trainer.default_local_dir": "--out",
    "trainer.total_training_steps": "--steps",
}
"""Keys the driver sets itself -> the option that sets them."""

_RUN_LENGTH_KEYS = (
    "trainer.total_training_steps",
    "trainer.default_local_dir",
    "trainer.resume_mode",
    "trainer.resume_from_path",
    "trainer.save_freq",
    "local.cache_dir",
)
"""Keys in which a reused run's saved config.yaml may differ from the requested one (none changes a metric)."""

QUIET_LOGGERS = ("dapo_verl.sampler.replenisher", "dapo_verl.local.train")
"""Loggers of per-run warnings (partial batches, also counted in ``dapo/sampler/partial``) that ``dapo-verl
ablate`` raises to ERROR; worker processes inherit the levels."""


@dataclass(frozen=True)
class PlannedRun:
    """One (arm, seed) of an ablation.

    Attributes:
        arm: The arm.
        seed: ``data.seed``.
        run_dir: ``<out>/<arm>/seed<seed>``.
        overrides: Every Hydra override of the run: the arm's, the steps, the extra ones, the seed.
    """

    arm: Arm
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class AblationResult:
    """What :func:`run_ablation` produced.

    Attributes:
        study: The study run.
        outcomes: One per (arm, seed), in plan order.
        report: The report of :func:`dapo_verl.report.build_report`.
        files: Name -> file written (the report's files plus ``summary`` and ``curves``).
        wall_s: Seconds the whole call took.
    """

    study: Study
    outcomes: list[RunOutcome]
    report: Report
    files: dict[str, Path]
    wall_s: float


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def seed_list(count: int | None, listed: Sequence[int] | None, default: int) -> list[int]:
    """The seeds of ``--seeds N`` (0..N-1), or of ``--seed-list K ...``, or 0..``default``-1 when neither is given.

    Each seed is checked as ``data.seed`` when the runs are composed.

    Raises:
        ValueError: for a count below 1, naming the value.
    """
    if listed is not None:
        return list(listed)
    if count is not None and count < 1:
        raise ValueError(
            f"--seeds {count} is not a number of seeds; it must be at least 1 (--seeds N trains seeds "
            "0..N-1 in every arm). Pass e.g. --seeds 2, or --seed-list K [K ...]."
        )
    return list(range(default if count is None else count))


def plan_runs(
    study: Study,
    seeds: Sequence[int],
    out_dir: str | Path,
    *,
    steps: int | None = None,
    extra_overrides: Sequence[str] = (),
) -> list[PlannedRun]:
    """Every (arm, seed) of ``study``, seed by seed.

    Args:
        study: The arms.
        seeds: ``data.seed`` values, each used in every arm.
        out_dir: The ablation's directory.
        steps: ``trainer.total_training_steps``; None keeps the config's (200).
        extra_overrides: Hydra overrides applied to every arm, after the arm's own.

    Raises:
        ValueError: for no seed, a repeated seed, or an extra override of a key the study varies or the
            driver sets itself.
    """
    if not seeds:
        raise ValueError("no seed given; pass --seeds N (seeds 0..N-1) or --seed-list K [K ...].")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {list(seeds)} repeat a seed; give each seed once.")
    for override in extra_overrides:
        key = _key(override)
        if key in study.varied_keys:
            raise ValueError(
                f"the override {override!r} sets {key}, which the {study.name} study varies between "
                f"its arms ({', '.join(a.name for a in study.arms)}); it would make the arms equal. "
                "Drop it, or run `dapo-verl train` for a single configuration."
            )
        if key in _OWN_KEYS:
            raise ValueError(
                f"the override {override!r} sets {key}, which dapo-verl ablate sets for each run; "
                f"use {_OWN_KEYS[key]} instead."
            )
    study = study.with_steps(steps)  # an arm that sets the run length gets ``steps`` in its own settings
    return [
        PlannedRun(
            arm=arm,
            seed=seed,
            run_dir=Path(out_dir) / arm.name / f"seed{seed}",
            overrides=(*arm.overrides, *_length(arm, steps), *extra_overrides, f"data.seed={seed}"),
        )
        for seed in seeds
        for arm in study.arms
    ]


def _length(arm: Arm, steps: int | None) -> list[str]:
    return [] if steps is None or STEPS_KEY in arm.settings else [f"{STEPS_KEY}={steps}"]


def _finished(planned: PlannedRun, spec: RunSpec) -> RunOutcome | None:
    """The outcome of a finished run of ``spec`` in ``planned.run_dir``; None when it must (still) run.

    Raises:
        ValueError: if the directory holds a run of another configuration, or a longer one.
    """
    config, summary = planned.run_dir / "config.yaml", planned.run_dir / "summary.json"
    if not config.exists():
        return None
    saved = OmegaConf.to_container(OmegaConf.load(config), resolve=True)
    changed = changed_keys(saved, spec.cfg, ignore=_RUN_LENGTH_KEYS)  # type: ignore[arg-type]
    if changed:
        raise ValueError(
            f"{planned.run_dir} holds a run of another configuration (differs in {', '.join(changed)}); "
            "an ablation never overwrites a run. Use another --out, or delete that directory to "
            "train it again."
        )
    if not summary.exists():
        return None  # interrupted: dapo-verl train continues from its latest checkpoint
    done = json.loads(summary.read_text())
    total = spec.run.trainer.total_training_steps
    if done["steps"] > total:
        raise ValueError(
            f"{planned.run_dir} already holds {done['steps']} steps but {total} were asked for; a "
            f"report would mix run lengths. Pass --steps {done['steps']} or use another --out."
        )
    if done["steps"] < total:
        return None  # dapo-verl train continues it from its last checkpoint
    return RunOutcome(
        arm=planned.arm.name,
        seed=planned.seed,
        run_dir=planned.run_dir,
        final_accuracy=done["final_accuracy"],
        final_exact=done["final_exact"],
        steps=done["steps"],
        wall_s=done["wall_s"],
        reused=True,
    )


def _log_levels() -> dict[str, int]:
    return {name: logging.getLogger(name).getEffectiveLevel() for name in ("dapo_verl", *QUIET_LOGGERS)}


def run_ablation(
    study: Study,
    seeds: Sequence[int],
    out_dir: str | Path,
    *,
    steps: int | None = None,
    extra_overrides: Sequence[str] = (),
    jobs: int = DEFAULT_JOBS,
    on_run: Callable[[RunOutcome, int, int], None] | None = None,
    pool_with: Path | None = None,
) -> AblationResult:
    """Train every arm of ``study`` with every seed (reusing finished runs) and write the report.

    Args:
        study: The arms (:data:`~dapo_verl.local.arms.CLIP_STUDY` or :data:`~dapo_verl.local.arms.LADDER_STUDY`).
        seeds: ``data.seed`` values, each trained in every arm.
        out_dir: The ablation's directory.
        steps: ``trainer.total_training_steps`` of every run; None keeps the config's.
        extra_overrides: Hydra overrides applied to every arm.
        jobs: Runs trained at the same time (separate processes); 1 trains in this process.
        on_run: Called after each finished or reused run with ``(outcome, runs done, runs in all)``.
        pool_with: For a study that replicates another (:attr:`~dapo_verl.local.arms.Study.replicates`), that
            study's ablation folder: the report adds its estimate and the two pooled
            (:class:`~dapo_verl.local.powered_test.PooledEstimate`).

    Returns:
        The :class:`AblationResult`.

    Raises:
        ValueError: for a bad seed list, extra override or ``jobs``, an ``out_dir`` that is a file (or lies in
            one), a config that does not compose, a run directory holding another configuration, or a ``pool_with``
            that holds no report of the study replicated (before anything is trained).
        OSError: if ``out_dir`` cannot be created (before anything is trained).
        AblationInterrupted: after Ctrl-C, SIGTERM or SIGHUP with ``jobs`` > 1 (:mod:`dapo_verl.local.run_pool`).
        dapo_verl.local.train.RunInterrupted: after Ctrl-C with ``jobs`` = 1.
        dapo_verl.sampler.ShortfallError: from a run with ``algorithm.filter_groups.on_shortfall=error``.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r} must be a positive integer; use 2 on a 2-core machine, 1 to stay in-process.")
    _check_out(Path(out_dir))
    if pool_with is not None:
        if study.replicates is None or study.primary is None:
            raise ValueError(f"pool_with={pool_with}: the study {study.name!r} replicates no other study.")
        development_differences(pool_with, study.primary)  # refused now, not after the runs
    started = time.perf_counter()
    study = study.with_steps(steps)
    plan = plan_runs(study, seeds, out_dir, steps=steps, extra_overrides=extra_overrides)
    specs = [compose_run(p.overrides, out_dir=p.run_dir) for p in plan]  # every config error before any run
    done: dict[tuple[str, int], RunOutcome] = {}
    for planned, spec in zip(plan, specs, strict=True):
        outcome = _finished(planned, spec)
        if outcome is not None:
            done[(planned.arm.name, planned.seed)] = outcome
            _notify(on_run, outcome, len(done), len(plan))
    pending = [p for p in plan if (p.arm.name, p.seed) not in done]
    logger.info(
        "Ablation %s: %d runs, %d reused from %s, %d to train with %d job(s).",
        study.name,
        len(plan),
        len(done),
        out_dir,
        len(pending),
        jobs,
    )
    Path(out_dir).mkdir(parents=True, exist_ok=True)  # an --out that cannot be made fails here, not in a worker
    for planned, fields in train_runs(pending, jobs, _log_levels()):
        outcome = RunOutcome(arm=planned.arm.name, seed=planned.seed, run_dir=planned.run_dir, reused=False, **fields)
        done[(planned.arm.name, planned.seed)] = outcome
        _notify(on_run, outcome, len(done), len(plan))
    outcomes = [done[(p.arm.name, p.seed)] for p in plan]
    report, files = write_ablation_report(study, outcomes, Path(out_dir), pool_with=pool_with)
    return AblationResult(
        study=study, outcomes=outcomes, report=report, files=files, wall_s=time.perf_counter() - started
    )


def _check_out(out: Path) -> None:
    """Refuse an ablation directory that is a file, or lies below one.

    Raises:
        ValueError: naming the file.
    """
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            where = "is a file" if path == out else f"lies in {path}, which is a file"
            raise ValueError(
                f"--out {out} {where}; an ablation writes a directory of runs (<out>/<arm>/seed<k>) and "
                "its report. Pass a directory: a new one, or an earlier ablation's to continue it."
            )
        if path.exists():
            return


def _notify(on_run: Callable[[RunOutcome, int, int], None] | None, outcome: RunOutcome, done: int, total: int) -> None:
    if on_run is not None:
        on_run(outcome, done, total)
