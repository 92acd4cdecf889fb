"""A run directory has one writer at a time and holds one configuration, and says so in its history.

**The lock.** :func:`run_directory_lock` takes an exclusive ``flock`` on ``<run_dir>/.lock`` for the whole
run and writes the holder into it (pid, host, command, start time). A second ``dapo-verl train`` on the same
directory is refused with :class:`RunDirectoryBusy`, which names the holder; before, both ran and the
directory ended with the steps of one run and the summary of the other. The kernel drops the lock when
its process dies, however it dies, so a lock left by a killed run is taken over at the next start (the
holder written in the file says who that was). ``flock`` works on local disks and, on Linux, NFS.

**The binding.** A run directory's results were trained with the configuration its checkpoints record.
:func:`configuration_changes` compares that configuration (or, before the first checkpoint, the run's
``config.yaml``) with the one asked for, ignoring :data:`FREE_KEYS` (run length, evaluation and checkpoint
cadence, paths). A difference is refused by :func:`refuse_changes` with the keys and both values and the
two ways forward: another ``--out``, or ``--allow-config-change`` to continue this run under the new
values, recorded in ``history.jsonl``. ``config.yaml`` is never rewritten to describe a run it did not
train. The same check applies to a checkpoint taken from another run (``trainer.resume_from_path``, or a
``state.safetensors`` copied in). Keys that change the model, the prompts or the held-out split
(:data:`STRUCTURAL_PREFIXES`, ``data.seed`` among them) cannot be continued at all.

**The history.** ``history.jsonl`` gets one JSON line per start (fresh or resumed from step N, with any
accepted change) and one per end (finished, or stopped by Ctrl-C), so the life of a directory stays
readable after the fact; :func:`accepted_changes` lists every change a run went through.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dapo_verl.files import apply_umask, os_errors_named
from dapo_verl.local.compose import flatten_keys

__all__ = [
    "CONFIG_FILE",
    "FREE_KEYS",
    "HISTORY_FILE",
    "LOCK_FILE",
    "STRUCTURAL_PREFIXES",
    "ConfigChange",
    "RunDirectoryBusy",
    "accepted_changes",
    "append_history",
    "configuration_changes",
    "read_history_events",
    "recorded_configuration",
    "refuse_changes",
    "run_directory_lock",
]

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
CONFIG_FILE = "config.yaml"
HISTORY_FILE = "history.jsonl"

FREE_KEYS = frozenset(
    {
        "trainer.total_training_steps",
        "trainer.test_freq",
        "trainer.save_freq",
        "trainer.val_before_train",
        "trainer.resume_mode",
        "trainer.resume_from_path",
        "trainer.default_local_dir",
        "local.cache_dir",
    }
)
"""Keys a run may change when it continues: none changes what a step computes (the cache holds the same model)."""

STRUCTURAL_PREFIXES = ("local.model.", "local.task.", "data.seed")
"""Keys no run can continue under, even with ``--allow-config-change``: the checkpoint's weights or prompt ids
would not fit (``local.model.*``, ``local.task.*``), or the held-out split and the prompt order the checkpoint's
sampler state refers to would move under it (``data.seed`` seeds the task's split)."""


class RunDirectoryBusy(RuntimeError):
    """Another process holds the run directory's lock."""


def _check_directory(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(
            f"{run_dir} is a file, not a run directory; pass a directory (new or an earlier "
            f"run's) as --out / trainer.default_local_dir."
        )


def _holder_text() -> str:
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(sys.argv),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    )


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}: {holder['command'] or 'python'}"
    except (ValueError, KeyError, TypeError):
        return "a process that left no description"


@contextmanager
def run_directory_lock(run_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``<run_dir>/.lock`` exclusively while the block runs (the directory is created if needed).

    Raises:
        RunDirectoryBusy: if another process holds it; the message names that process.
        NotADirectoryError: if ``run_dir`` is a file.
        OSError: if the directory cannot be created or written (read-only disk, permissions).
    """
    root = Path(run_dir)
    _check_directory(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            raise RunDirectoryBusy(
                f"{root} is being written by another run ({holder}); two writers would interleave their steps and "
                f"one would overwrite the other's results. Wait for it to finish, or pass another --out."
            ) from None
        previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if previous:
            logger.info(
                "%s: the previous run (%s) ended without releasing its lock (it was killed); taking over.",
                root,
                _describe_holder(previous),
            )
        with os_errors_named(path):  # a full disk fails here, before anything else is written
            os.ftruncate(fd, 0)
            os.pwrite(fd, _holder_text().encode(), 0)
        apply_umask(path)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # an empty lock file marks a clean end
    finally:
        os.close(fd)  # releases the flock


@dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs between a run's recorded configuration and the one asked for."""

    key: str
    recorded: Any
    requested: Any

    def __str__(self) -> str:
        return f"{self.key}={_show(self.recorded)} there, {_show(self.requested)} now"


_ABSENT = "<absent>"


def _show(value: Any) -> str:
    return value if value == _ABSENT else json.dumps(value)


def recorded_configuration(run_dir: Path, checkpoint_config: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The configuration the run in ``run_dir`` was trained with: its checkpoint's, else its ``config.yaml``'s.

    Returns None for a directory that holds no run.
    """
    if checkpoint_config is not None:
        return checkpoint_config
    file = Path(run_dir) / CONFIG_FILE
    if not file.exists():
        return None
    try:
        return OmegaConf.to_container(OmegaConf.load(file), resolve=True)  # type: ignore[return-value]
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as err:
        raise ValueError(
            f"{file} cannot be read ({' '.join(str(err).split())[:200]}); the directory's configuration "
            f"is unknown. Restore the file, or train into another --out."
        ) from None


def configuration_changes(recorded: Mapping[str, Any], requested: Mapping[str, Any]) -> list[ConfigChange]:
    """Every key outside :data:`FREE_KEYS` whose value differs (a key present on one side only counts too)."""
    before, after = flatten_keys(recorded), flatten_keys(requested)
    keys = sorted(
        k
        for k in before.keys() | after.keys()
        if k not in FREE_KEYS and before.get(k, _ABSENT) != after.get(k, _ABSENT)
    )
    return [ConfigChange(k, before.get(k, _ABSENT), after.get(k, _ABSENT)) for k in keys]


def refuse_changes(
    run_dir: Path, changes: Sequence[ConfigChange], *, source: str, step: int | None, allowed: bool
) -> None:
    """Raise unless ``changes`` is empty, or ``allowed`` and no change is structural.

    Args:
        run_dir: The run directory.
        changes: What :func:`configuration_changes` found.
        source: Where the recorded configuration came from, for the message.
        step: The step the run would continue from (None: it would start over).
        allowed: ``--allow-config-change`` was given.

    Raises:
        ValueError: naming every changed key with both values and the ways forward.
    """
    if not changes:
        return
    listed = "; ".join(str(c) for c in changes)
    structural = [c.key for c in changes if c.key.startswith(STRUCTURAL_PREFIXES)]
    if structural and step is not None:
        raise ValueError(
            f"{run_dir} holds a run whose {source} differs in a key no run can continue under ({listed}): "
            f"{', '.join(structural)} changes the model, the prompts or the held-out split the checkpoint was "
            f"trained and evaluated on, so --allow-config-change cannot accept it. Train into a new directory (--out)."
        )
    if allowed:
        return
    where = f"continue it from step {step}" if step is not None else "start it over"
    raise ValueError(
        f"{run_dir} holds a run trained with another configuration ({source}: {listed}); going on would label its "
        f"results with settings they were not trained with. Train into a new directory (--out), or {where} with "
        f"the change by adding --allow-config-change (recorded in {Path(run_dir) / HISTORY_FILE})."
    )


def append_history(run_dir: Path, event: str, **fields: Any) -> None:
    """Append one ``{"time", "event", ...}`` line to ``history.jsonl``."""
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "event": event, **fields}
    path = Path(run_dir) / HISTORY_FILE
    with os_errors_named(path), path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


def read_history_events(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``history.jsonl`` (a line cut short by a crash is skipped)."""
    path = Path(run_dir) / HISTORY_FILE
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return [e for e in events if isinstance(e, dict)]


def accepted_changes(run_dir: Path) -> list[dict[str, Any]]:
    """Every configuration change a run accepted with ``--allow-config-change``: key, values and step."""
    return [
        change | {"step": event.get("resumed_from")}
        for event in read_history_events(run_dir)
        for change in event.get("config_changes", [])
    ]


def change_records(changes: Sequence[ConfigChange]) -> list[dict[str, Any]]:
    """``changes`` as plain data for ``history.jsonl``."""
    return [asdict(c) for c in changes]
