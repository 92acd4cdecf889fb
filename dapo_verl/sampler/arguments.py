"""Checks of the plain-number (and typed) arguments the sampler's public classes and functions take.

Every check raises one line: the argument and its value, what was expected, and how to fix it. They read Python
numbers only (never a tensor), so they cost nothing next to the work they guard.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

__all__ = ["require_flag", "require_instance", "require_int", "require_real"]


def require_int(name: str, value: Any, *, low: int, high: int | None = None, fix: str) -> int:
    """``value`` as an int if it is an integer (not a bool) in ``[low, high]``.

    Raises:
        TypeError: for a value that is not an integer (a float such as 10.5 or 10.0 included).
        ValueError: for an integer out of range.
    """
    expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) must be {expected}. {fix}")
    number = int(value)
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name}={value!r} must be {expected}. {fix}")
    return number


def require_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    fix: str,
) -> float:
    """``value`` as a float if it is a finite real number (not a bool) within the bounds given.

    Raises:
        TypeError: for a value that is not a real number.
        ValueError: for NaN, +-inf or a number out of range.
    """
    parts = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
    parts += [f"{'<' if high_open else '<='} {high:g}"] if high is not None else []
    expected = "a finite number" + (f" {' and '.join(parts)}" if parts else "")
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) must be {expected}. {fix}")
    number = float(value)
    below = low is not None and (number < low or (low_open and number == low))
    above = high is not None and (number > high or (high_open and number == high))
    if not math.isfinite(number) or below or above:
        raise ValueError(f"{name}={value!r} must be {expected}. {fix}")
    return number


def require_flag(name: str, value: Any, *, fix: str) -> bool:
    """``value`` if it is a bool (1, 0, 'false' and None are refused: each would read as a different choice)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) must be True or False. {fix}")
    return value


def require_instance(name: str, value: Any, kind: type, *, fix: str) -> Any:
    """``value`` if it is a ``kind``; a one-line TypeError naming what was given otherwise."""
    if not isinstance(value, kind):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) must be a {kind.__name__}. {fix}")
    return value
