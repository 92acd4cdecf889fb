"""What a local run directory records as its result, and the checks on it before a run continues there.

:class:`RunResult` is what a run returns (and what a finished run's ``summary.json`` and ``metrics.jsonl`` give
back); :func:`check_not_finished` returns a finished run of the requested length instead of training it again,
and :func:`refuse_gaps` refuses to continue from a checkpoint whose ``metrics.jsonl`` lost steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_verl.local.tracking import missing_steps, read_history

__all__ = ["OUTPUTS", "RunFinished", "RunResult", "check_not_finished", "refuse_gaps", "summary_lines"]

OUTPUTS = {
    "config": "config.yaml",
    "metrics": "metrics.jsonl",
    "tensorboard": "tensorboard",
    "plot": "plots/training_curves.png",
    "checkpoints": "checkpoints",
    "model": "model",
    "summary": "summary.json",
}
"""A run directory's outputs: name -> path inside it."""


@dataclass
class RunResult:
    """What a local run produced.

    Attributes:
        run_dir: The run directory.
        task: The task name (the ``<task>`` in validation metric keys).
        heldout: Whether evaluation prompts are held out (False: the task is too small, all prompts are used).
        history: Every ``metrics.jsonl`` record, ``{"step": int, "data": {key: value}}``, in order.
        initial_accuracy: Held-out greedy accuracy of the untrained model (step 0), if evaluated.
        final_accuracy: Held-out greedy accuracy after the last evaluation.
        final_exact: Held-out share of exact responses (answer then EOS) after the last evaluation.
        steps: The last training step.
        wall_s: Seconds this call took, model building included.
        resumed_from: The checkpoint step this call continued from, or None for a fresh start.
        model_built: Whether the initial model was built (False: loaded from the cache).
        paths: ``config``, ``metrics``, ``tensorboard``, ``plot``, ``checkpoints``, ``model``, ``summary``.
    """

    run_dir: Path
    task: str
    heldout: bool
    history: list[dict[str, Any]]
    initial_accuracy: float | None
    final_accuracy: float | None
    final_exact: float | None
    steps: int
    wall_s: float
    resumed_from: int | None
    model_built: bool
    paths: dict[str, Path] = field(default_factory=dict)

    def series(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of every record holding ``key``."""
        return [(r["step"], r["data"][key]) for r in self.history if r["data"].get(key) is not None]


def summary_lines(result: RunResult) -> list[str]:
    """What a finished run tells its user: the accuracy change, the wall time and where every output went."""
    where = "held-out" if result.heldout else "all-prompt (task too small to hold prompts out)"

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    lines = [
        f"Task {result.task}: {where} greedy accuracy {fmt(result.initial_accuracy)} -> {fmt(result.final_accuracy)} "
        f"(answer then EOS: {fmt(result.final_exact)}) after {result.steps} steps in {result.wall_s:.0f} s"
        + (f", resumed from step {result.resumed_from}." if result.resumed_from else "."),
        "",
    ]
    lines += [f"  {name:<12} {path}" for name, path in result.paths.items()]
    lines += ["", f"TensorBoard: tensorboard --logdir {result.paths['tensorboard']}"]
    return lines


class RunFinished(RuntimeError):
    """The run directory holds a finished run of the requested length: nothing to train, and nothing was written
    (:func:`~dapo_verl.local.train.run_spec` returns :attr:`result`).

    Attributes:
        result: The finished run's outcome, read from its ``summary.json`` and ``metrics.jsonl``.
    """

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


def refuse_gaps(run_dir: Path, step: int) -> None:
    """Refuse to continue from checkpoint ``step`` when ``metrics.jsonl`` lacks some of the steps before it."""
    missing = missing_steps(run_dir / "metrics.jsonl", step)
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(
            f"{run_dir / 'metrics.jsonl'} lacks step(s) {shown} of the {step} its checkpoint at step {step} trained "
            f"(the file was truncated or edited); continuing would leave a silent gap in the run's metrics. Restore "
            f"the file, or train into a new directory (--out)."
        )


def check_not_finished(run_dir: Path, step: int, total: int) -> None:
    """Raise :class:`RunFinished` (nothing to do) or ValueError (a shorter run asked for) for a finished run."""
    summary = run_dir / "summary.json"
    if step < total or not summary.exists():
        return
    if step > total:
        raise ValueError(
            f"{run_dir} holds a run trained for {step} steps, more than trainer.total_training_steps={total}; its "
            f"results and config.yaml describe {step} steps and are left as they are. Ask for "
            f"trainer.total_training_steps={step} (nothing to train) or more, or train into a new directory (--out)."
        )
    recorded = json.loads(summary.read_text())
    paths = {name: run_dir / rel for name, rel in OUTPUTS.items()}
    result = RunResult(
        run_dir=run_dir,
        task=recorded["task"],
        heldout=recorded["heldout"],
        history=read_history(paths["metrics"]),
        initial_accuracy=recorded["initial_accuracy"],
        final_accuracy=recorded["final_accuracy"],
        final_exact=recorded["final_exact"],
        steps=recorded["steps"],
        wall_s=recorded["wall_s"],
        resumed_from=recorded["resumed_from"],
        model_built=recorded["model_built"],
        paths=paths,
    )
    raise RunFinished(
        f"{run_dir} already holds this run, finished at step {step} ({summary}); nothing to train and "
        f"nothing was rewritten. Raise trainer.total_training_steps to train further, or pass another "
        f"--out.",
        result,
    )
