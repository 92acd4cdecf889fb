"""How every config dataclass declares and checks its fields: the verl key of each field and the one error format.

:mod:`dapo_verl.config` and its sections (:mod:`dapo_verl.config_sampler`, :mod:`dapo_verl.local.config`) declare
each field with :func:`verl_key` and check it with the ``require_*`` functions, which raise through
:func:`config_error`: ``key=value why. fix``. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import fields
from enum import StrEnum
from typing import Any, NoReturn

__all__ = ["MAX_SEED", "config_error", "key_of", "require_bool", "require_choice", "require_number", "verl_key"]

MAX_SEED = 2**32 - 1
"""Largest ``data.seed``: the sampler derives a torch seed per epoch from it, which must fit in 64 bits."""


def verl_key(path: str, *, verl_native: bool) -> dict[str, Any]:
    """Field metadata: the dotted key of a config field in a verl Hydra config, and whether verl has it."""
    return {"verl_key": path, "verl_native": verl_native}


def config_error(key: str, value: object, why: str, fix: str) -> NoReturn:
    """Raise the configuration ``ValueError`` in its one format: ``key=value why. fix``."""
    raise ValueError(f"{key}={value!r} {why}. {fix}")


def key_of(config: Any, name: str) -> str:
    """The dotted config key of field ``name`` of a config dataclass (instance or class)."""
    return next(f.metadata["verl_key"] for f in fields(config) if f.name == name)


def require_bool(config: Any, *names: str) -> None:
    """Raise unless each named field of ``config`` is a boolean."""
    for name in names:
        if not isinstance(getattr(config, name), bool):
            config_error(
                key_of(config, name),
                getattr(config, name),
                "must be a boolean",
                "Use true or false, unquoted (a quoted 'false' is a string).",
            )


def require_number(
    config: object, name: str, *, low: float, high: float = math.inf, low_open=False, integer=False, fix: str
) -> None:
    """Raise unless field ``name`` is a finite number (an integer if ``integer``) within ``[low, high]``."""
    value = getattr(config, name)
    key = key_of(config, name)
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        config_error(key, value, f"must be a finite {'integer' if integer else 'number'}", fix)
    if value < low or (low_open and value == low) or value > high:
        if math.isinf(high):
            config_error(key, value, f"must be {'>' if low_open else '>='} {low}", fix)
        config_error(key, value, f"must lie in {'(' if low_open else '['}{low}, {high}]", fix)


def require_choice(config: object, name: str, choices: type[StrEnum] | list[str], fix: str = "") -> None:
    """Raise unless field ``name`` holds one of ``choices`` (an enum's values or a list)."""
    value = getattr(config, name)
    known = [c.value for c in choices] if isinstance(choices, type) else list(choices)
    if value not in known:
        config_error(key_of(config, name), value, f"is not one of {known}", fix or "Pick one of the listed values.")
