"""Reading the parts of a saved sampler state: each part checked before anything is restored from it.

A state to load comes from a file someone saved (:func:`dapo_verl.state_io.save_state`), possibly damaged or edited.
The readers here turn each part into the plain value its owner keeps -- a count, an amount, a row of them -- or raise
one ``ValueError`` (``TypeError`` for a state that is not a mapping) naming the owner, the part, the value found,
what was expected and the fix. Owners parse every part first and assign only then, so a refused state leaves them
as they were. Whole-valued floats count as integers (a state read back from JSON may hold ``3.0``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import torch

__all__ = [
    "read_amount",
    "read_amounts",
    "read_count",
    "read_flag",
    "read_ids",
    "read_rng_state",
    "read_rows",
    "require_keys",
    "state_mapping",
]


def _fix(owner: str) -> str:
    return f"Pass what {owner}.state_dict() returned (saved with dapo_verl.state_io.save_state), or start afresh."


def _refuse(owner: str, key: str, value: Any, expected: str) -> ValueError:
    shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:77]}..."
    return ValueError(f"the {owner} state's {key!r} is {shown}; expected {expected}. {_fix(owner)}")


def state_mapping(owner: str, state: object, known: Collection[str]) -> Mapping[str, Any]:
    """``state`` if it is a mapping whose keys are all in ``known``.

    Raises:
        TypeError: for a state that is not a mapping.
        ValueError: naming the keys that are not part of the owner's state.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"the {owner} state is {type(state).__name__}, not a mapping. {_fix(owner)}")
    unknown = sorted(str(key) for key in state if key not in known)
    if unknown:
        raise ValueError(
            f"the {owner} state has unknown keys {unknown}; a {owner} state holds only {sorted(known)}. {_fix(owner)}"
        )
    return state


def require_keys(owner: str, state: object, required: Collection[str]) -> Mapping[str, Any]:
    """``state`` if it is a mapping holding every key of ``required`` (other keys are left to the owner).

    Raises:
        TypeError: for a state that is not a mapping.
        ValueError: naming the required keys it lacks.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"the {owner} state is {type(state).__name__}, not a mapping. {_fix(owner)}")
    missing = [key for key in required if key not in state]
    if missing:
        raise ValueError(f"the {owner} state lacks {missing}; the state is damaged. {_fix(owner)}")
    return state


def read_count(owner: str, key: str, value: Any, *, low: int | None = 0, high: int | None = None) -> int:
    """``value`` as an int: an integer (or whole float) in ``[low, high]`` (None: unbounded)."""
    whole = isinstance(value, Integral) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or (low is not None and value < low) or (high is not None and value > high):
        bounds = {(True, True): "", (False, True): f" >= {low}", (True, False): f" <= {high}"}.get(
            (low is None, high is None), f" in [{low}, {high}]"
        )
        raise _refuse(owner, key, value, f"an integer{bounds}")
    return int(value)


def read_amount(owner: str, key: str, value: Any, *, low: float | None = 0.0, high: float | None = None) -> float:
    """``value`` as a float: a finite real number in ``[low, high]`` (None: unbounded)."""
    fits = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if not fits or (low is not None and value < low) or (high is not None and value > high):
        bounds = [f">= {low:g}"] if low is not None else []
        bounds += [f"<= {high:g}"] if high is not None else []
        raise _refuse(owner, key, value, f"a finite number {' and '.join(bounds)}".rstrip())
    return float(value)


def read_flag(owner: str, key: str, value: Any) -> bool:
    """``value`` as a bool: True, False, 1 or 0."""
    if value not in (True, False) or not isinstance(value, Integral):
        raise _refuse(owner, key, value, "a boolean")
    return bool(value)


def read_amounts(owner: str, key: str, value: Any, length: int) -> list[float]:
    """``value`` as a list of ``length`` finite non-negative floats."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != length:
        raise _refuse(owner, key, value, f"a list of {length} finite non-negative numbers")
    return [read_amount(owner, f"{key}[{i}]", v) for i, v in enumerate(value)]


def read_rows(owner: str, key: str, value: Any, width: int, length: int | None = None) -> list[Sequence[Any]]:
    """``value`` as a list of rows (``length`` of them, if given) of ``width`` items each (the items are read by the
    caller)."""
    if not isinstance(value, Sequence) or isinstance(value, str) or (length is not None and len(value) != length):
        raise _refuse(owner, key, value, f"a list of {'' if length is None else f'{length} '}[{width} items] rows")
    for index, row in enumerate(value):
        if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != width:
            raise _refuse(owner, f"{key}[{index}]", row, f"a row of {width} items")
    return list(value)


def read_ids(owner: str, key: str, value: Any, num_prompts: int) -> list[int]:
    """``value`` as a list of prompt ids, each in ``range(num_prompts)``."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise _refuse(owner, key, value, f"a list of prompt ids in [0, {num_prompts - 1}]")
    return [read_count(owner, key, pid, high=num_prompts - 1) for pid in value]


def read_rng_state(owner: str, key: str, value: Any) -> torch.Tensor:
    """``value`` if a CPU ``torch.Generator`` accepts it as its state (``Generator.get_state()``'s uint8 tensor)."""
    try:
        torch.Generator().set_state(value)
    except (TypeError, RuntimeError, ValueError):
        raise _refuse(owner, key, value, "the uint8 tensor torch.Generator.get_state() returns") from None
    return value
