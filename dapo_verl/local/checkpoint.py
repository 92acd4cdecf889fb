"""Checkpoints of a local run: model, optimiser, sampler, RNG states and step, in one atomic file.

Layout follows verl's: ``<run_dir>/checkpoints/global_step_<N>/state.safetensors`` plus
``checkpoints/latest_checkpointed_iteration.txt`` holding N. The state file is written with
:func:`dapo_verl.state_io.save_state` (temporary file, fsync, rename; checksummed, no pickle) and the
marker after it, also by rename (:func:`~dapo_verl.local.files.write_text_atomically`), so a crash at any
moment leaves the marker naming a complete checkpoint.

Everything that influences the next step is saved -- weights, AdamW moments, the sampler's counters,
prompt order and carried groups, and the torch RNG state that drives sampling -- so a resumed run
reproduces the uninterrupted run's metrics exactly (on CPU, same thread count; see
:mod:`dapo_verl.local.train`).

Damage after the fact (a truncated file, a flipped byte, a deleted directory) is caught by
:func:`find_resume_point`: it tries the marker's checkpoint, then every earlier ``global_step_N`` in
descending order, logs each unusable file with the reason, resumes from the newest good one and points
the marker at it. Checkpoints newer than the marker are never used: they may belong to an earlier run in
the same directory. Without a marker (a run killed between its first state file and its first marker)
every ``global_step_N`` holding a state file is a candidate. When checkpoints exist but none is readable
it raises instead of silently starting over, because a fresh start would replace the run's metrics.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dapo_verl.files import write_text_atomically
from dapo_verl.sampler import BatchReplenisher
from dapo_verl.state_io import CorruptStateError, load_state, save_state

__all__ = [
    "LATEST",
    "STATE_FILE",
    "ResumePoint",
    "checkpoint_dir",
    "find_resume_point",
    "latest_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "read_marker",
    "restore_checkpoint",
    "save_checkpoint",
    "saved_steps",
]

logger = logging.getLogger(__name__)

STATE_FILE = "state.safetensors"
LATEST = "latest_checkpointed_iteration.txt"
_VERSION = 1
_STEP_DIR = re.compile(r"global_step_(\d+)")


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run continues from.

    Attributes:
        path: Its ``global_step_N`` directory.
        step: N, the step it was taken after.
        state: Its contents, as :func:`read_checkpoint` returns them.
        skipped: One line per newer checkpoint that was passed over, naming the file and why.
    """

    path: Path
    step: int
    state: dict[str, Any]
    skipped: tuple[str, ...] = ()


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """``<run_dir>/checkpoints/global_step_<step>``."""
    return Path(run_dir) / "checkpoints" / f"global_step_{step}"


def saved_steps(run_dir: Path) -> list[int]:
    """Steps of the ``checkpoints/global_step_N`` directories that hold a state file, newest first.

    The files are not opened; a listed checkpoint may still be damaged.
    """
    folder = Path(run_dir) / "checkpoints"
    matches = (_STEP_DIR.fullmatch(p.name) for p in folder.glob("global_step_*") if (p / STATE_FILE).is_file())
    return sorted((int(m.group(1)) for m in matches if m), reverse=True)


def read_marker(run_dir: Path) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt``; None if it is missing or unreadable (logged)."""
    marker = Path(run_dir) / "checkpoints" / LATEST
    if not marker.exists():
        return None
    text = marker.read_text(errors="replace").strip()
    if not text.isdigit():
        logger.warning(
            "%s holds %r, not a step number; looking for checkpoints by directory instead.", marker, text[:40]
        )
        return None
    return int(text)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The directory named by ``latest_checkpointed_iteration.txt`` if its state file exists, else None.

    It is not opened; :func:`find_resume_point` also checks it and falls back when it is damaged.
    """
    step = read_marker(run_dir)
    path = checkpoint_dir(run_dir, step) if step is not None else None
    return path if path is not None and (path / STATE_FILE).exists() else None


def _optimizer_to_plain(state: dict[str, Any]) -> dict[str, Any]:
    """torch's optimiser state uses int keys and tuples; state files hold str keys and lists."""
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in group.items()} for group in state["param_groups"]]
    return {"state": {str(k): v for k, v in state["state"].items()}, "param_groups": groups}


def _optimizer_from_plain(state: dict[str, Any]) -> dict[str, Any]:
    groups = [{k: tuple(v) if k == "betas" else v for k, v in group.items()} for group in state["param_groups"]]
    return {"state": {int(k): v for k, v in state["state"].items()}, "param_groups": groups}


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchReplenisher,
    config: dict[str, Any],
) -> Path:
    """Write the checkpoint of ``step``, then point ``latest_checkpointed_iteration.txt`` at it."""
    state = {
        "version": _VERSION,
        "step": step,
        "model": dict(model.state_dict()),
        "optimizer": _optimizer_to_plain(optimizer.state_dict()),
        "sampler": sampler.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
        "config": config,
    }
    target = checkpoint_dir(run_dir, step)
    save_state(state, target / STATE_FILE)
    write_text_atomically(Path(run_dir) / "checkpoints" / LATEST, f"{step}\n")
    return target


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Read and check a checkpoint directory without applying it.

    Raises:
        FileNotFoundError: if ``path`` holds no state file.
        dapo_verl.state_io.CorruptStateError: if the file is truncated or altered, naming it.
        ValueError: if it was written by another checkpoint version.
    """
    file = Path(path) / STATE_FILE
    if not file.exists():
        raise FileNotFoundError(
            f"No checkpoint at {file}; trainer.resume_from_path must name a global_step_N "
            f"directory written by `dapo-verl train`."
        )
    state = load_state(file)
    if not isinstance(state, dict) or state.get("version") != _VERSION:
        version = state.get("version") if isinstance(state, dict) else None
        raise ValueError(
            f"{file} is checkpoint version {version!r}, expected {_VERSION}; resume with the "
            f"release that wrote it or set trainer.resume_mode=disable."
        )
    return state


def restore_checkpoint(
    state: dict[str, Any], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler: BatchReplenisher
) -> tuple[int, dict[str, Any]]:
    """Apply :func:`read_checkpoint`'s result to the given objects and the global RNG.

    Returns:
        ``(step, config)``: the step it was taken after and the config it was written with.
    """
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(_optimizer_from_plain(state["optimizer"]))
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return int(state["step"]), state["config"]


def load_checkpoint(
    path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler: BatchReplenisher
) -> tuple[int, dict[str, Any]]:
    """Read a checkpoint directory and restore it (:func:`read_checkpoint`, then :func:`restore_checkpoint`).

    Raises:
        FileNotFoundError, dapo_verl.state_io.CorruptStateError, ValueError: as :func:`read_checkpoint`.
    """
    return restore_checkpoint(read_checkpoint(path), model=model, optimizer=optimizer, sampler=sampler)


def _candidates(run_dir: Path) -> list[int]:
    marker = read_marker(run_dir)
    steps = saved_steps(run_dir)
    if marker is None:
        return steps
    return [marker, *(s for s in steps if s < marker)]


def _usable(run_dir: Path, step: int) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint's state, or None and why it cannot be used."""
    path = checkpoint_dir(run_dir, step)
    try:
        state = read_checkpoint(path)
    except (FileNotFoundError, CorruptStateError) as err:
        return None, str(err)
    if state.get("step") != step:
        return None, f"{path / STATE_FILE} holds step {state.get('step')!r}, not {step}; it was moved or copied."
    return state, ""


def find_resume_point(run_dir: Path) -> ResumePoint | None:
    """The newest good checkpoint at or before the marker's (see the module docstring); None if there is none.

    Raises:
        dapo_verl.state_io.CorruptStateError: if checkpoints exist but none can be read.
        ValueError: if a checkpoint was written by another checkpoint version.
    """
    skipped: list[str] = []
    damaged: list[str] = []
    for step in _candidates(run_dir):
        state, why = _usable(run_dir, step)
        if state is None:
            logger.error("Checkpoint %s is unusable: %s", checkpoint_dir(run_dir, step) / STATE_FILE, why)
            skipped.append(why)
            damaged.append(checkpoint_dir(run_dir, step).name)
            continue
        point = ResumePoint(path=checkpoint_dir(run_dir, step), step=step, state=state, skipped=tuple(skipped))
        if skipped:
            logger.warning(
                "Resuming from the previous good checkpoint %s (step %d) after skipping %d unusable "
                "one(s); the steps after it are recomputed.",
                point.path,
                step,
                len(skipped),
            )
            write_text_atomically(Path(run_dir) / "checkpoints" / LATEST, f"{step}\n")
        return point
    if skipped:
        raise CorruptStateError(
            f"No usable checkpoint in {Path(run_dir) / 'checkpoints'}: all {len(damaged)} are damaged or missing "
            f"({', '.join(damaged)}; the reason for each is logged above), so the run cannot continue. To start it "
            f"over (replacing its metrics) set trainer.resume_mode=disable, or train into another --out directory."
        )
    return None
