"""Injection points of the fault trials: hooks that count a local run's events, record its batches, crash it.

:class:`EventTracker` wraps, for the duration of one run and without any seam in production code,

* ``Rollout.__call__`` -- the sampler's generate callback (event ``generate``);
* torch's global optimiser step pre-hook (event ``optimizer``);
* the ``save_state`` name in :mod:`dapo_verl.local.checkpoint` (event ``save``) and the
  ``save_checkpoint`` name in :mod:`dapo_verl.local.train` (a checkpoint is *committed* when it returns,
  its marker written);
* ``MetricsLog.log`` (event ``log``);
* ``BatchReplenisher.next_batch`` -- to record each step's trained groups and the conservation gap.

When the run reaches the event a :class:`Fault` names, the tracker does the fault's damage and raises
:class:`InjectedCrash`. It derives from ``BaseException``, as a signal would, so no ``except Exception``
in the run swallows it; unlike a SIGKILL it still runs ``finally`` blocks, which is why the e2e tests
also kill a real process. :func:`damage_file` damages a checkpoint the ways a disk or a copy can.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from dapo_verl.local import checkpoint as checkpoint_module
from dapo_verl.local import train as train_module
from dapo_verl.local.rollout import Rollout
from dapo_verl.local.tracking import MetricsLog
from dapo_verl.sampler import BatchReplenisher

__all__ = ["DAMAGE_MODES", "EventTracker", "Fault", "InjectedCrash", "damage_file"]

DAMAGE_MODES = ("truncate", "flip_header", "flip_data")
"""How :func:`damage_file` damages a file: cut it, or flip one byte of its JSON header or tensor data."""


class InjectedCrash(BaseException):
    """The simulated death of the training process."""


@dataclass(frozen=True)
class Fault:
    """One drawn fault.

    Attributes:
        kind: One of ``tools.reliability.faults.FAULT_KINDS``.
        index: 1-based count of the event it strikes at; for ``corrupt_checkpoint`` the number of committed
            checkpoints after which the newest one is damaged (at the next generate call; >= 2, so an
            intact predecessor exists).
        point: Human-readable description, e.g. ``"generate call 7 of 11"``.
        fraction: Share of the file or line kept (1.0: a complete file never renamed into place), or the
            relative position of the flipped byte, in [0, 1].
        damage: One of :data:`DAMAGE_MODES` (``corrupt_checkpoint`` only).
        xor: Non-zero byte XORed into the flipped byte.
    """

    kind: str
    index: int
    point: str
    fraction: float = 0.5
    damage: str = "truncate"
    xor: int = 0xFF


class EventTracker:
    """Counts a run's events, records its batches and fires at most one fault (see the module docstring).

    Attributes:
        counts: Events seen, by name (``generate``, ``optimizer``, ``save``, ``log``).
        committed: Steps whose checkpoint was committed, in order.
        batches: Step -> (prompt ids trained, digest of their responses and correctness).
        gaps: The sampler's conservation gap after every ``next_batch``.
        fired: Whether the fault fired; expected_resume: the last intact committed checkpoint at that moment.
        damaged: The file the fault damaged, if any.
    """

    def __init__(self, run_dir: Path, fault: Fault | None = None) -> None:
        self.run_dir, self.fault = Path(run_dir), fault
        self.counts: Counter[str] = Counter()
        self.committed: list[int] = []
        self.batches: dict[int, tuple[tuple[int, ...], str]] = {}
        self.gaps: list[int] = []
        self.fired = False
        self.expected_resume: int | None = None
        self.damaged: Path | None = None

    @contextmanager
    def installed(self) -> Iterator[EventTracker]:
        """Wrap the injection points for the duration of the ``with`` block."""
        with ExitStack() as stack:
            for owner, name, wrap in (
                (Rollout, "__call__", self._generate),
                (BatchReplenisher, "next_batch", self._next_batch),
                (checkpoint_module, "save_state", self._save_state),
                (train_module, "save_checkpoint", self._save_checkpoint),
                (MetricsLog, "log", self._log),
            ):
                stack.enter_context(_patched(owner, name, wrap(getattr(owner, name))))
            stack.callback(register_optimizer_step_pre_hook(self._optimizer_step).remove)
            yield self

    # -- firing -------------------------------------------------------------------------------------

    def _strikes(self, kind: str, event: str) -> bool:
        return self.fault is not None and self.fault.kind == kind and self.counts[event] == self.fault.index

    def _crash(self, expected_resume: int | None) -> None:
        self.fired, self.expected_resume = True, expected_resume
        raise InjectedCrash(self.fault.point if self.fault else "crash")

    def _last_committed(self) -> int | None:
        return self.committed[-1] if self.committed else None

    # -- the wrapped injection points ---------------------------------------------------------------

    def _generate(self, original: Any) -> Any:
        def generate(rollout: Rollout, prompt_ids: Any) -> Any:
            self.counts["generate"] += 1
            if self._strikes("generate", "generate"):
                self._crash(self._last_committed())
            fault = self.fault
            if fault is not None and fault.kind == "corrupt_checkpoint" and len(self.committed) >= fault.index:
                newest = checkpoint_module.checkpoint_dir(self.run_dir, self.committed[-1])
                self.damaged = newest / checkpoint_module.STATE_FILE
                damage_file(self.damaged, fault.damage, fault.fraction, fault.xor)
                self._crash(self.committed[-2])
            return original(rollout, prompt_ids)

        return generate

    def _optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.counts["optimizer"] += 1
        if self._strikes("update", "optimizer"):
            self._crash(self._last_committed())

    def _next_batch(self, original: Any) -> Any:
        def next_batch(sampler: BatchReplenisher) -> Any:
            batch = original(sampler)
            self.batches[batch.step] = (tuple(g.prompt_id for g in batch.groups), _digest(batch.groups))
            self.gaps.append(sampler.conservation_gap())
            return batch

        return next_batch

    def _save_state(self, original: Any) -> Any:
        def save_state(state: Any, path: Any) -> Any:
            self.counts["save"] += 1
            target = Path(path)
            if self._strikes("checkpoint_state", "save") and self.fault is not None:
                # The process dies while writing: the bytes so far sit under a temporary name, never renamed.
                scratch = original(state, target.parent / f".{target.name}.killed.tmp")
                scratch.write_bytes(scratch.read_bytes()[: int(scratch.stat().st_size * self.fault.fraction)])
                self._crash(self._last_committed())
            written = original(state, path)
            if self._strikes("checkpoint_marker", "save"):
                # Without any marker yet, the complete state file is the newest checkpoint (see find_resume_point).
                step = int(target.parent.name.removeprefix("global_step_"))
                self._crash(self._last_committed() if self.committed else step)
            return written

        return save_state

    def _save_checkpoint(self, original: Any) -> Any:
        def save_checkpoint(run_dir: Path, step: int, **kwargs: Any) -> Any:
            written = original(run_dir, step, **kwargs)
            self.committed.append(step)
            return written

        return save_checkpoint

    def _log(self, original: Any) -> Any:
        def log(metrics_log: MetricsLog, data: dict[str, float], step: int) -> None:
            self.counts["log"] += 1
            original(metrics_log, data, step)
            if self._strikes("metrics_line", "log") and self.fault is not None:
                metrics_log._file.flush()
                _cut_last_line(metrics_log.jsonl_path, self.fault.fraction)
                self._crash(self._last_committed())

        return log


@contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, name)  # AttributeError if production code renamed the injection point
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _digest(groups: Any) -> str:
    """Digest of a batch: each group's prompt id, response tokens and correctness."""
    sha = hashlib.sha256()
    for group in groups:
        sha.update(str(group.prompt_id).encode())
        sha.update(group.payload["tokens"].numpy().tobytes())
        sha.update(group.metric.to(torch.uint8).numpy().tobytes())
    return sha.hexdigest()[:16]


def _cut_last_line(path: Path, fraction: float) -> None:
    """Keep only the first ``fraction`` of the file's last line (at least one character, never its newline)."""
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    length = len(data.rstrip(b"\n")) - start
    path.write_bytes(data[: start + max(1, min(length - 1, int(length * fraction)))])


def damage_file(path: Path, mode: str, fraction: float, xor: int = 0xFF) -> None:
    """Damage a safetensors file in place.

    Args:
        path: The file.
        mode: ``truncate`` keeps the first ``fraction`` of its bytes (at least one byte goes);
            ``flip_header`` XORs ``xor`` into the byte at relative position ``fraction`` of the length
            prefix and JSON header (trailing padding excluded: a space turned into a tab changes nothing);
            ``flip_data`` does the same in the tensor data.
        fraction: In [0, 1).
        xor: Non-zero byte.
    """
    data = bytearray(path.read_bytes())
    if mode == "truncate":
        path.write_bytes(bytes(data[: min(len(data) - 1, int(len(data) * fraction))]))
        return
    header_end = 8 + struct.unpack("<Q", bytes(data[:8]))[0]
    if mode == "flip_header":
        start, stop = 0, 8 + len(bytes(data[8:header_end]).rstrip(b" "))
    elif mode == "flip_data":
        start, stop = header_end, len(data)
    else:
        raise ValueError(f"damage mode {mode!r} is not one of {list(DAMAGE_MODES)}.")
    data[start + int((stop - start) * fraction)] ^= xor
    path.write_bytes(bytes(data))
