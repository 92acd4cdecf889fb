"""What a rehearsal is asked to do and what it did: :class:`RehearsalOptions`, :class:`RehearsalResult`, and the
error a stop signal ends it with. Plain data, shared by :mod:`.run` (which fills them), :mod:`.schedule` (which starts
the runs) and :mod:`.report` (which writes them out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_verl.rehearsal.changes import Change
from dapo_verl.rehearsal.data import RehearsalData
from dapo_verl.rehearsal.engine import EngineChoice
from dapo_verl.rehearsal.folders import RehearsalError
from dapo_verl.rehearsal.memory import MemoryPeaks
from dapo_verl.rehearsal.processes import RunRecord

__all__ = ["RehearsalInterrupted", "RehearsalOptions", "RehearsalResult"]


@dataclass(frozen=True)
class RehearsalOptions:
    """Settings of one rehearsal.

    Attributes:
        config_name: A config under ``configs/`` (a recipe, ``dapo_trainer``) or ``ppo_trainer`` (verl's).
        overrides: The user's Hydra overrides, applied before the rehearsal's changes.
        out_dir: Output folder (created; must not hold an earlier rehearsal unless ``overwrite``).
        steps: Training steps of the first run (>= 2: a checkpoint at ``steps - 1`` is resumed).
        gpus: Fake GPUs per node, i.e. data-parallel worker processes on each (>= 1).
        nodes: Ray nodes (>= 1). With 1 the recipe's entry point runs with a Ray cluster of its own; with N >= 2 a
            head and N - 1 worker nodes start on this machine (:mod:`.cluster`) and each run is submitted to them
            through ``recipes/run_ray.sh --follow`` (:mod:`.multinode`).
        train_batch_size: Prompt groups per step in the rehearsal (the recipe's if smaller).
        max_response_length: Response budget in tokens (the recipe's if smaller).
        train_rows: Rows of the rehearsal's training file.
        val_rows: Rows of its validation file.
        resume: Run the second (resume) process.
        overlap: Start the resume process together with the first (it waits at verl's checkpoint load), so its
            start-up uses the core the first run's start-up leaves idle, at the price of two trainers, rollout
            engines and Ray clusters in memory at once; False (the default) starts it once the first run has ended
            and holds one of each (docs/rehearse.md, "Memory", has both peaks).
        seed: Seed of generated data and of the stand-in model.
        timeout_s: Limit per run, after which it is stopped and reported as failed.
        overwrite: Replace an existing rehearsal in ``out_dir``.
        engine: ``vllm`` (verl's own vLLM rollout on vLLM's CPU build), ``stand-in`` (the CPU replica), or None:
            vLLM whenever its CPU build is installed (:func:`.engine.choose_engine`).
    """

    config_name: str
    overrides: tuple[str, ...] = ()
    out_dir: Path = Path("runs/rehearse")
    steps: int = 3
    gpus: int = 1
    nodes: int = 1
    train_batch_size: int = 4
    max_response_length: int = 8
    train_rows: int = 96
    val_rows: int = 4
    resume: bool = True
    overlap: bool = False
    seed: int = 0
    timeout_s: float = 900.0
    overwrite: bool = False
    engine: str | None = None


@dataclass
class RehearsalResult:
    """What a rehearsal did; :mod:`.report` turns it into ``report.md``/``report.json``."""

    options: RehearsalOptions
    entry: str
    entry_module: str
    changes: list[Change]
    data: RehearsalData
    model_path: str
    model_replaced: bool
    engine: EngineChoice
    environment: dict[str, tuple[str, str]] = field(default_factory=dict)
    runs: list[RunRecord] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None
    not_started: dict[str, str] = field(default_factory=dict)
    """Each run that was to start and did not, with why."""
    interrupted_by: str = ""
    """The stop signal that ended the rehearsal ("Ctrl-C", "SIGTERM", "SIGHUP"); "" when none did."""
    memory: MemoryPeaks | None = None
    """The resident memory the rehearsal's processes held (:mod:`.memory`)."""
    cluster: dict[str, Any] | None = None
    """With ``nodes`` >= 2, what the cluster says of each run's job (:func:`.multinode.job_report`)."""


class RehearsalInterrupted(RehearsalError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) ended the rehearsal; its runs were stopped and the report written.

    Attributes:
        result: What the rehearsal did up to then (its ``report`` written).
    """

    def __init__(self, result: RehearsalResult) -> None:
        runs = [f"{run.name} {run.state} after {run.wall_s:.0f} s" for run in result.runs]
        runs += [f"{name} not started" for name in result.not_started]
        super().__init__(
            f"interrupted by {result.interrupted_by}: {', '.join(runs)}; every process the rehearsal "
            f"started was stopped. What ran is in {result.options.out_dir / 'report.md'}; run the same "
            f"command with --overwrite to rehearse again."
        )
        self.result = result
