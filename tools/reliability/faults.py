"""Crash the local backend at random points, resume it, and check that nothing was lost or done twice.

:func:`run_fault_injection` trains the tiny run of :mod:`.runs` once without faults (the reference), then,
trial after trial, trains it again in a fresh directory, kills it at a point drawn from the seed, resumes
it with a fresh ``dapo_verl.local.train.run`` on the same directory (``trainer.resume_mode=auto``) and
compares the outcome with the reference. The fault kinds (:data:`FAULT_KINDS`), taken in turn:

* ``generate`` -- between generation rounds: at the N-th call of the sampler's generate callback;
* ``update`` -- mid-update: before the k-th optimiser step of a training step, k >= 2, so the weights in
  memory have taken some but not all of the step's gradient steps;
* ``checkpoint_state`` -- while writing a checkpoint: the state file is left half-written (or complete)
  under its temporary name, never renamed into place;
* ``checkpoint_marker`` -- after the state file, before ``latest_checkpointed_iteration.txt`` is updated;
* ``metrics_line`` -- while appending a line to ``metrics.jsonl``: the line is cut short;
* ``corrupt_checkpoint`` -- the newest checkpoint is damaged on disk (truncated, or one byte of its
  header or tensor data flipped) and the run dies at its next generation round.

The hooks and the simulated crash are described in :mod:`.injection`; they need no seam in production
code. ``tests/e2e/test_faults.py`` also kills a real ``dapo-verl train`` process with SIGKILL.

A trial *survives* when the fault fired and the resumed run continued from the last checkpoint committed
before the crash (for a damaged one: the one before it, after an error log naming the damaged file; when
the very first marker was never written, the complete state file beside it), left
no temporary file behind, and equals the reference: every metric of every step bit-identical
(``timing_s/*`` excepted), the same groups trained at each step (prompt ids plus a digest of responses and
correctness; a reference group missing from a step is *lost*, an extra one *trained twice*), the
sampler's conservation gap 0 after every step, and the final checkpoint (weights, AdamW moments, sampler
state, RNG) and the saved model identical. CPU only; see :mod:`.determinism` for why.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from dapo_verl.local.checkpoint import STATE_FILE, checkpoint_dir, read_checkpoint, read_marker
from dapo_verl.local.files import TMP_SUFFIX
from dapo_verl.local.tracking import read_history
from dapo_verl.local.train import run
from tools.reliability.injection import DAMAGE_MODES, EventTracker, Fault, InjectedCrash
from tools.reliability.runs import (
    history_differences,
    metric_values,
    quiet_run_logs,
    state_differences,
    tiny_overrides,
    work_directory,
)

__all__ = ["FAULT_KINDS", "FaultResult", "Trial", "draw_faults", "run_fault_injection"]

FAULT_KINDS = ("generate", "update", "checkpoint_state", "checkpoint_marker", "metrics_line", "corrupt_checkpoint")
"""Fault kinds in the order trials take them (see the module docstring)."""


@dataclass
class Trial:
    """One injected fault and what the resumed run made of it.

    Attributes:
        kind: One of :data:`FAULT_KINDS`.
        point: Where the fault struck, e.g. ``"generate call 7 of 11"``.
        crashed: Whether the fault fired (it always should).
        expected_resume: Step of the last intact checkpoint committed before the crash, or None.
        resumed_from: Step the resumed run continued from, or None for a fresh start.
        detected: Logged errors that named the damaged file (``corrupt_checkpoint``).
        lost_groups: Groups the reference trained that the recovered run did not (counted per step).
        duplicated_groups: Groups the recovered run trained beyond the reference's (counted per step).
        recomputed_steps: Training steps the crashed run had started after its resume point; the resumed
            run did them again (identically) -- the crash's only cost.
        metric_values: Metric values (step x key) compared with the reference.
        checks: Checks made.
        problems: Every failed check; empty when the trial survived.
        wall_s: Seconds of the crashed and the resumed run together.
    """

    kind: str
    point: str
    crashed: bool = False
    expected_resume: int | None = None
    resumed_from: int | None = None
    detected: list[str] = field(default_factory=list)
    lost_groups: int = 0
    duplicated_groups: int = 0
    recomputed_steps: int = 0
    metric_values: int = 0
    checks: int = 0
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def survived(self) -> bool:
        """The fault fired and every check passed."""
        return self.crashed and not self.problems

    def expect(self, ok: bool, problem: str) -> None:
        """Count a check; record ``problem`` if it failed."""
        self.checks += 1
        if not ok:
            self.problems.append(problem)


@dataclass
class FaultResult:
    """Outcome of :func:`run_fault_injection`.

    Attributes:
        seed: Seed of the fault points and of the runs (``data.seed``).
        steps: Training steps of each run.
        trials: Every trial, in order.
        injected: Faults that fired, by kind (every kind listed).
        survived: Trials that survived, by kind.
        lost_groups: Groups lost over all trials (target 0).
        duplicated_groups: Groups trained twice over all trials (target 0).
        recomputed_steps: Training steps redone after a resume, over all trials (up to save_freq per crash,
            twice that when a damaged checkpoint is skipped).
        corruptions_detected: Damaged checkpoints named in an error log and skipped.
        metric_values_compared: Metric values compared with the reference over all trials.
        invariant_checks: Checks made over all trials.
        reference_s: Seconds of the reference run. wall_s: Seconds of the whole call.
    """

    seed: int
    steps: int
    trials: list[Trial] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=dict)
    survived: dict[str, int] = field(default_factory=dict)
    lost_groups: int = 0
    duplicated_groups: int = 0
    recomputed_steps: int = 0
    corruptions_detected: int = 0
    metric_values_compared: int = 0
    invariant_checks: int = 0
    reference_s: float = 0.0
    wall_s: float = 0.0

    @property
    def failures(self) -> list[str]:
        """``"trial i (kind, point): problem"`` for every failed check and every fault that never fired."""
        return [
            f"trial {i} ({t.kind}, {t.point}): {p}"
            for i, t in enumerate(self.trials)
            for p in t.problems + ([] if t.crashed else ["the fault never fired"])
        ]


@dataclass
class _Reference:
    history: list[dict[str, Any]]
    tracker: EventTracker
    final_state: dict[str, Any]
    model: dict[str, Any]
    gradient_steps: list[int]  # per training step


def run_fault_injection(
    seed: int = 0, trials: int = 12, steps: int = 8, work_dir: str | Path | None = None
) -> FaultResult:
    """Inject ``trials`` faults into the tiny local run and check each recovery (see the module docstring).

    Args:
        seed: Seed of the fault points and of the runs.
        trials: Number of crashed-and-resumed runs; kinds are taken in turn, so 12 gives 2 of each.
        steps: Training steps per run (>= 6, so that a damaged checkpoint has an intact predecessor and a
            later generation round).
        work_dir: Where the runs are written (subfolders ``reference``, ``trial_NN``, ``cache``; earlier
            runs there are replaced); None uses a temporary folder removed afterwards.

    Raises:
        ValueError: if ``steps`` < 6 or ``trials`` < 1.
    """
    if steps < 6 or trials < 1:
        raise ValueError(
            f"steps={steps}, trials={trials}: need steps >= 6 (three checkpoints at save_freq=2) and trials >= 1."
        )
    started = time.perf_counter()
    result = FaultResult(seed=seed, steps=steps)
    records: list[logging.LogRecord] = []
    with (
        work_directory(work_dir, prefix="dapo_verl_faults_", stale=("reference", "trial_*")) as root,
        quiet_run_logs(records),
    ):
        overrides = tiny_overrides(steps=steps, seed=seed, cache_dir=root / "cache")
        reference = _reference(root / "reference", overrides)
        result.reference_s = time.perf_counter() - started
        for i, fault in enumerate(draw_faults(seed, trials, reference.tracker, reference.gradient_steps)):
            result.trials.append(_trial(root / f"trial_{i:02d}", fault, overrides, reference, records))
    _tally(result)
    result.wall_s = time.perf_counter() - started
    return result


def _reference(run_dir: Path, overrides: list[str]) -> _Reference:
    tracker = EventTracker(run_dir)
    with tracker.installed():
        result = run(overrides, run_dir)
    history = read_history(run_dir / "metrics.jsonl")
    steps = [int(r["data"].get("actor/dapo/gradient_steps") or 0) for r in history if r["step"] > 0]
    return _Reference(
        history=history,
        tracker=tracker,
        final_state=read_checkpoint(checkpoint_dir(run_dir, result.steps)),
        model=load_file(str(run_dir / "model" / "model.safetensors")),
        gradient_steps=steps,
    )


def draw_faults(seed: int, trials: int, reference: EventTracker, gradient_steps: list[int]) -> list[Fault]:
    """The faults of the trials: kinds in turn, each at a point drawn from ``seed`` among the reference's events.

    Args:
        seed: Seed of the draws.
        trials: Number of faults.
        reference: The tracker of the fault-free run (its event counts and committed checkpoints).
        gradient_steps: Optimiser steps of each training step of the reference, in order.
    """
    rng = random.Random(seed)
    return [_draw(FAULT_KINDS[i % len(FAULT_KINDS)], rng, reference, gradient_steps) for i in range(trials)]


def _draw(kind: str, rng: random.Random, ref: EventTracker, gradient_steps: list[int]) -> Fault:
    counts, saves = ref.counts, ref.committed
    if kind == "generate":
        index = rng.randint(1, counts["generate"])
        return Fault(kind, index, f"generate call {index} of {counts['generate']}")
    if kind == "update":
        later = [
            (sum(gradient_steps[:t]) + k, t + 1, k, n) for t, n in enumerate(gradient_steps) for k in range(2, n + 1)
        ]
        if not later:
            raise ValueError(
                "No training step of the reference took two gradient steps, so none can be cut "
                "mid-update; keep actor_rollout_ref.actor.ppo_mini_batch_size below "
                "data.train_batch_size."
            )
        index, step, k, n = rng.choice(later)
        return Fault(kind, index, f"optimizer step {index} (gradient step {k} of {n} in training step {step})")
    if kind in ("checkpoint_state", "checkpoint_marker"):
        index = rng.randint(1, len(saves))
        if kind == "checkpoint_marker":
            return Fault(kind, index, f"checkpoint of step {saves[index - 1]}: state file written, marker not")
        fraction = rng.choice([rng.random(), 1.0])
        return Fault(
            kind,
            index,
            f"checkpoint of step {saves[index - 1]}: {fraction:.0%} of the state file written under its temporary name",
            fraction=fraction,
        )
    if kind == "metrics_line":
        index, fraction = rng.randint(1, counts["log"]), rng.random()
        return Fault(kind, index, f"metrics line {index} of {counts['log']} cut at {fraction:.0%}", fraction=fraction)
    if kind == "corrupt_checkpoint":
        index, damage = rng.randint(2, len(saves) - 1), rng.choice(DAMAGE_MODES)
        fraction, xor = rng.random(), rng.randint(1, 255)
        how = f"{damage} at {fraction:.0%}" + (f", xor 0x{xor:02x}" if damage != "truncate" else "")
        return Fault(
            kind,
            index,
            f"checkpoint of step {saves[index - 1]} damaged ({how})",
            fraction=fraction,
            damage=damage,
            xor=xor,
        )
    raise ValueError(f"fault kind {kind!r} is not one of {list(FAULT_KINDS)}.")


def _trial(
    run_dir: Path, fault: Fault, overrides: list[str], ref: _Reference, records: list[logging.LogRecord]
) -> Trial:
    trial = Trial(kind=fault.kind, point=fault.point)
    began = time.perf_counter()
    crashed = EventTracker(run_dir, fault)
    with crashed.installed(), suppress(InjectedCrash):
        run(overrides, run_dir)
    trial.crashed, trial.expected_resume = crashed.fired, crashed.expected_resume
    seen = len(records)
    resumed = EventTracker(run_dir)
    try:
        with resumed.installed():
            trial.resumed_from = run(overrides, run_dir).resumed_from
    except Exception as err:  # any failure to resume is this trial's finding
        trial.expect(False, f"resume failed: {type(err).__name__}: {err}")
        return trial
    errors = [r.getMessage() for r in records[seen:] if r.levelno >= logging.ERROR]
    _check_resume(trial, crashed, errors)
    _check_outcome(trial, run_dir, ref, crashed, resumed)
    trial.wall_s = time.perf_counter() - began
    return trial


def _check_resume(trial: Trial, crashed: EventTracker, errors: list[str]) -> None:
    trial.expect(
        trial.resumed_from == trial.expected_resume,
        f"resumed from step {trial.resumed_from}, expected {trial.expected_resume}",
    )
    if crashed.damaged is None:
        trial.expect(not errors, f"unexpected errors logged: {errors}")
        return
    trial.detected = [m for m in errors if str(crashed.damaged) in m]
    trial.expect(bool(trial.detected), f"no error log named the damaged {crashed.damaged}")


def _check_outcome(trial: Trial, run_dir: Path, ref: _Reference, crashed: EventTracker, resumed: EventTracker) -> None:
    history = read_history(run_dir / "metrics.jsonl")
    trial.metric_values = metric_values(history)
    trial.expect(not (diffs := history_differences(ref.history, history)), f"metrics differ: {diffs[:3]}")
    kept = {s: b for s, b in crashed.batches.items() if trial.resumed_from is not None and s <= trial.resumed_from}
    trial.recomputed_steps = len(crashed.batches) - len(kept)
    got = kept | resumed.batches
    for step, (ids, digest) in sorted(ref.tracker.batches.items()):
        have, want = Counter(got.get(step, ((), ""))[0]), Counter(ids)
        trial.lost_groups += sum((want - have).values())
        trial.duplicated_groups += sum((have - want).values())
        trial.expect(got.get(step, ((), ""))[1] == digest, f"step {step} trained another batch")
    trial.expect(sorted(got) == sorted(ref.tracker.batches), f"steps trained {sorted(got)}")
    trial.expect(
        trial.lost_groups == 0 and trial.duplicated_groups == 0,
        f"{trial.lost_groups} groups lost, {trial.duplicated_groups} trained twice",
    )
    trial.expect(set(crashed.gaps + resumed.gaps) <= {0}, f"conservation gaps {crashed.gaps + resumed.gaps}")
    last = ref.tracker.committed[-1]
    trial.expect(read_marker(run_dir) == last, f"marker at {read_marker(run_dir)}, expected {last}")
    worst, diffs = state_differences(ref.final_state, read_checkpoint(checkpoint_dir(run_dir, last)))
    trial.expect(not diffs, f"final checkpoint differs (max abs diff {worst:.3g}): {diffs[:3]}")
    _, diffs = state_differences(ref.model, load_file(str(run_dir / "model" / "model.safetensors")))
    trial.expect(not diffs, f"saved model differs: {diffs[:3]}")
    folders = [run_dir, run_dir / "checkpoints", *(run_dir / "checkpoints").glob("global_step_*")]
    stale = [p.name for folder in folders for p in folder.glob(f".*{TMP_SUFFIX}")]
    trial.expect(not stale, f"temporary files left: {stale}")
    trial.expect(
        all((checkpoint_dir(run_dir, s) / STATE_FILE).exists() for s in ref.tracker.committed),
        "a checkpoint of the reference is missing",
    )


def _tally(result: FaultResult) -> None:
    result.injected = dict.fromkeys(FAULT_KINDS, 0)
    result.survived = dict.fromkeys(FAULT_KINDS, 0)
    for trial in result.trials:
        result.injected[trial.kind] += trial.crashed
        result.survived[trial.kind] += trial.survived
        result.lost_groups += trial.lost_groups
        result.duplicated_groups += trial.duplicated_groups
        result.recomputed_steps += trial.recomputed_steps
        result.corruptions_detected += bool(trial.detected)
        result.metric_values_compared += trial.metric_values
        result.invariant_checks += trial.checks
