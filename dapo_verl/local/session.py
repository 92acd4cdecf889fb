"""The process around a local run: Ctrl-C as a stop request, torch's settings, the sampler's quiet lines, the device,
and the numeric environment a run's results depend on.

Each is a context manager that :func:`dapo_verl.local.train.run_spec` holds for the run and that restores what it
changed, so a run in a notebook or a test leaves the process as it found it.
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from dapo_verl.lifetime import signal_name

__all__ = ["StopRequest", "device", "numeric_environment", "quiet_partial_batches", "stop_requests", "torch_settings"]

logger = logging.getLogger("dapo_verl.local.train")  # the run's own messages, under the name users filter on


class StopRequest:
    """Set by the first Ctrl-C (or SIGTERM / SIGHUP, which the CLI hands to the same handler); the training loop
    stops at the next step boundary. ``by`` names what asked."""

    requested = False
    by = "Ctrl-C"


@contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """Turn the first SIGINT into a stop request and a second one into KeyboardInterrupt, for the run's duration.

    Signal handlers belong to the main thread; elsewhere (a run in a thread) Ctrl-C keeps Python's default.
    """
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested, stop.by = True, signal_name(signum)
        logger.warning(
            "%s: stopping after this step, once its checkpoint is written (Ctrl-C again stops at "
            "once and loses the steps since the last checkpoint).",
            stop.by,
        )

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def torch_settings(threads: int) -> Iterator[None]:
    """Fix thread count and deterministic algorithms for the run; restore the caller's settings after."""
    saved = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])


class _BelowWarning(logging.Filter):
    """Drops records below WARNING (the sampler's line per partial batch; the run summarises them once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


@contextmanager
def quiet_partial_batches() -> Iterator[None]:
    """Silence the sampler's per-step partial-batch lines: ``dapo/sampler/partial`` and the run's summary have them."""
    sampler_logger = logging.getLogger("dapo_verl.sampler.replenisher")
    quiet = _BelowWarning()
    sampler_logger.addFilter(quiet)
    try:
        yield
    finally:
        sampler_logger.removeFilter(quiet)


def device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("local.device='cuda' but torch sees no GPU. Set local.device=cpu (or auto).")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def numeric_environment() -> dict[str, str]:
    """What decides a seeded run's last bits besides its configuration: the CPU, torch's kernel choice and the
    library versions. Two runs with the same seed repeat exactly where these agree; RL amplifies a difference in
    the last bit into another trajectory where they do not (docs/ablation.md, the clip-acts replication)."""
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    versions = {name: _version(name) for name in ("torch", "transformers", "numpy", "tokenizers")}
    return {
        "python": platform.python_version(),
        **versions,
        "machine": platform.machine(),
        "cpu": cpu,
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "threads": str(torch.get_num_threads()),
    }


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            return handle.read().splitlines()
    except OSError:  # not Linux
        return []


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
