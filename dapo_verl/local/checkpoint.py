"""Checkpoints of a local run: model, optimiser, sampler, RNG states and step, in one atomic file.

Layout follows verl's: ``<run_dir>/checkpoints/global_step_<N>/state.safetensors`` plus
``checkpoints/latest_checkpointed_iteration.txt`` holding N, written after the state file so it never
points at a half-written checkpoint. Files are written with :func:`dapo_verl.state_io.save_state`
(atomic, checksummed, no pickle).

Everything that influences the next step is saved -- weights, AdamW moments, the sampler's counters,
prompt order and carried groups, and the torch RNG state that drives sampling -- so a resumed run
reproduces the uninterrupted run's metrics exactly (on CPU, same thread count; see
:mod:`dapo_verl.local.train`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from dapo_verl.sampler import BatchReplenisher
from dapo_verl.state_io import load_state, save_state

__all__ = ["STATE_FILE", "checkpoint_dir", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

STATE_FILE = "state.safetensors"
LATEST = "latest_checkpointed_iteration.txt"
_VERSION = 1


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """``<run_dir>/checkpoints/global_step_<step>``."""
    return run_dir / "checkpoints" / f"global_step_{step}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The directory named by ``latest_checkpointed_iteration.txt``, or None when there is none."""
    marker = run_dir / "checkpoints" / LATEST
    if not marker.exists():
        return None
    path = checkpoint_dir(run_dir, int(marker.read_text().strip()))
    return path if (path / STATE_FILE).exists() else None


def _optimizer_to_plain(state: dict[str, Any]) -> dict[str, Any]:
    """torch's optimiser state uses int keys and tuples; state files hold str keys and lists."""
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in group.items()} for group in state["param_groups"]]
    return {"state": {str(k): v for k, v in state["state"].items()}, "param_groups": groups}


def _optimizer_from_plain(state: dict[str, Any]) -> dict[str, Any]:
    groups = [{k: tuple(v) if k == "betas" else v for k, v in group.items()} for group in state["param_groups"]]
    return {"state": {int(k): v for k, v in state["state"].items()}, "param_groups": groups}


def save_checkpoint(run_dir: Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    sampler: BatchReplenisher, config: dict[str, Any]) -> Path:
    """Write the checkpoint of ``step`` and point ``latest_checkpointed_iteration.txt`` at it."""
    state = {
        "version": _VERSION,
        "step": step,
        "model": dict(model.state_dict()),
        "optimizer": _optimizer_to_plain(optimizer.state_dict()),
        "sampler": sampler.state_dict(),
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "config": config,
    }
    target = checkpoint_dir(run_dir, step)
    save_state(state, target / STATE_FILE)
    marker = run_dir / "checkpoints" / LATEST
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(f"{step}\n")
    os.replace(tmp, marker)
    return target


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    sampler: BatchReplenisher) -> tuple[int, dict[str, Any]]:
    """Restore a checkpoint directory into the given objects and the global RNG.

    Returns:
        ``(step, config)``: the step it was taken after and the config it was written with.

    Raises:
        FileNotFoundError: if ``path`` holds no checkpoint.
        ValueError: if it was written by another checkpoint version.
    """
    file = Path(path) / STATE_FILE
    if not file.exists():
        raise FileNotFoundError(f"No checkpoint at {file}; trainer.resume_from_path must name a global_step_N "
                                f"directory written by `dapo-verl train`.")
    state = load_state(file)
    if state.get("version") != _VERSION:
        raise ValueError(f"{file} is checkpoint version {state.get('version')!r}, expected {_VERSION}; resume with the "
                         f"release that wrote it or set trainer.resume_mode=disable.")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(_optimizer_from_plain(state["optimizer"]))
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return int(state["step"]), state["config"]
