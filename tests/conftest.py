"""Shared test fixtures. Tests are seeded and never touch the network."""

from __future__ import annotations

import os

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
