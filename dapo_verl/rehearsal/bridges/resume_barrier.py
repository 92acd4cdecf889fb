"""A rehearsal's resume run starts with the first run and waits at verl's checkpoint load for the checkpoint.

Start-up is most of a rehearsal on 2 cores: Ray, then verl's trainer, TransferQueue, workers and rollout
replica, each a process importing verl one after another, so one core works while the other waits. ``dapo-verl
rehearse`` therefore starts its resume run together with the first run, and the resume run's start-up fills
the idle core. The one thing it must not do early is load the checkpoint, which the first run writes later.

verl loads it in ``_load_checkpoint`` -- the v1 trainer at the end of its construction, once its workers are up;
the legacy trainer at the start of ``fit``. With ``DAPO_REHEARSAL_RESUME_AFTER=<file>`` in the environment
(the rehearsal sets it for its resume run only, next to ``VERL_PLATFORM=cpu``; the CPU plugin calls
:func:`install` then), that method first waits until the file exists -- the rehearsal creates it once the
first run's checkpoint is complete -- and then runs verl's own code unchanged. The wait gives up after
``DAPO_REHEARSAL_RESUME_TIMEOUT_S`` seconds (default 900) with an error naming the file.

The classes are patched when their modules are imported (:mod:`.import_patches`), so nothing is imported early.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from dapo_verl.rehearsal.bridges.import_patches import patch_on_import

__all__ = ["ENV", "TIMEOUT_ENV", "install", "wait_for"]

ENV = "DAPO_REHEARSAL_RESUME_AFTER"
TIMEOUT_ENV = "DAPO_REHEARSAL_RESUME_TIMEOUT_S"
_MARK = "__dapo_verl_resume_barrier__"
TARGETS = {
    "verl.trainer.ppo.v1.trainer_base": "PPOTrainer",
    "verl.trainer.ppo.ray_trainer": "RayPPOTrainer",
    "dapo_verl.adapter.trainer": "DapoRayTrainer",  # checks data.pt before calling verl's: wait before that too
}
"""Module -> class whose ``_load_checkpoint`` waits."""


def wait_for(path: Path, timeout_s: float, poll_s: float = 0.2) -> None:
    """Block until ``path`` exists.

    Raises:
        TimeoutError: after ``timeout_s`` seconds, naming the file.
    """
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"The rehearsal's resume run waited {timeout_s:.0f} s for the first run's checkpoint "
                f"({path} was never created); see the first run's log."
            )
        time.sleep(poll_s)


def _patch(module: ModuleType, barrier: Path, timeout_s: float) -> None:
    cls = getattr(module, TARGETS[module.__name__], None)
    original = getattr(cls, "_load_checkpoint", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _load_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not barrier.exists():  # printed, not logged: it goes to the rehearsal's run log whatever the log level
            started = time.monotonic()
            print(
                "[dapo-verl rehearse] resume run: waiting for the first run's checkpoint before loading it",
                file=sys.stderr,
                flush=True,
            )
            wait_for(barrier, timeout_s)
            print(
                f"[dapo-verl rehearse] resume run: checkpoint ready after {time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        return original(self, *args, **kwargs)

    setattr(_load_checkpoint, _MARK, True)
    assert cls is not None
    cls._load_checkpoint = _load_checkpoint


def install() -> bool:
    """Make ``_load_checkpoint`` wait for ``$DAPO_REHEARSAL_RESUME_AFTER`` if it is set; return whether it is."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return False
    barrier, timeout_s = Path(value), float(os.environ.get(TIMEOUT_ENV, "900"))
    for name in TARGETS:
        patch_on_import(name, functools.partial(_patch, barrier=barrier, timeout_s=timeout_s))
    return True
