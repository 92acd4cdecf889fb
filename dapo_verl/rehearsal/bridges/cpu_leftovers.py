"""What a rehearsal's processes leave in ``/dev/shm``, recorded as they create it and removed after the run.

vLLM's message queues and verl's shared-memory weight transfer create POSIX shared-memory segments
(``multiprocessing.shared_memory``) and named semaphores; when ``ray.shutdown`` kills the engine they are never
unlinked -- about 400 MiB per vLLM run. The names are random, so nothing after the fact tells this run's from
another program's. Each process of a rehearsal therefore records the names it creates (:func:`track`, installed
by the rehearsal's plugins only) into the run's record folder, and the rehearsal removes exactly those that
still exist once the run has ended (:func:`remove_recorded`), and nothing else. Reading and removing the records
lives in :mod:`dapo_verl.lifetime`, which the watchdog of a killed rehearsal runs without this package.
"""

from __future__ import annotations

import functools
import multiprocessing.shared_memory
import multiprocessing.synchronize
import os
from pathlib import Path
from typing import Any

from dapo_verl.rehearsal.bridges.import_patches import is_patched, mark
from dapo_verl.rehearsal.reaper import SHM_RECORD_PREFIX, SHM_ROOT, recorded_names, remove_recorded

__all__ = ["SHM_ROOT", "recorded_names", "remove_recorded", "track"]


def _record(folder: Path, name: str) -> None:
    # One file per process, appended line by line: processes never write to each other's file.
    with open(folder / f"{SHM_RECORD_PREFIX}{os.getpid()}.txt", "a") as sink:
        sink.write(name + "\n")


def track(folder: Path) -> None:
    """Record into ``folder`` every shared-memory segment and named semaphore this process creates. Idempotent."""
    folder.mkdir(parents=True, exist_ok=True)
    memory = multiprocessing.shared_memory.SharedMemory
    if not is_patched(memory.__init__):
        original_memory = memory.__init__

        @functools.wraps(original_memory)
        def __init__(self: Any, name: str | None = None, create: bool = False, size: int = 0, **kwargs: Any) -> None:
            original_memory(self, name, create, size, **kwargs)
            if create:
                _record(folder, self.name)

        memory.__init__ = mark(__init__)
    semaphore = multiprocessing.synchronize.SemLock
    if not is_patched(semaphore.__init__):
        original_semaphore = semaphore.__init__

        @functools.wraps(original_semaphore)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_semaphore(self, *args, **kwargs)
            name = getattr(self._semlock, "name", None)  # None once unlinked at creation (fork contexts)
            if name:
                _record(folder, "sem." + name.lstrip("/"))

        semaphore.__init__ = mark(__init__)
