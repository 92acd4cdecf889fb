"""The docstring examples of the pure modules run, so they cannot rot."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "dapo_verl.core.advantages",
    "dapo_verl.core.aggregation",
    "dapo_verl.core.filters",
    "dapo_verl.core.losses",
    "dapo_verl.core.registry",
    "dapo_verl.core.rewards",
    "dapo_verl.config",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
