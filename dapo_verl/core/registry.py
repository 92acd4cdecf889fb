"""A small named registry for open sets of interchangeable functions (e.g. overlong penalty schedules).

Rules (STYLE.md §8): registering the same object twice is a no-op; registering a different object
under a taken name raises; a lookup miss raises with the known names and how to register a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object mapping with loud conflicts and helpful misses.

    Args:
        kind: What is registered, used in messages (e.g. ``"overlong schedule"``).
        how_to_register: One sentence telling users how to add an entry.

    Example:
        >>> shapes = Registry[int]("shape", "Use shapes.register(name, value).")
        >>> shapes.register("square", 4)
        4
        >>> shapes.get("square")
        4
        >>> shapes.get("circle")
        Traceback (most recent call last):
        ...
        ValueError: Unknown shape 'circle'. Known: ['square']. Use shapes.register(name, value).
    """

    def __init__(self, kind: str, how_to_register: str) -> None:
        self._kind = kind
        self._how = how_to_register
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T) -> T:
        """Add ``obj`` under ``name`` and return it; a repeat of the same pair is a no-op.

        Raises:
            ValueError: if ``name`` is empty or already holds a different object.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self._kind} name must be a non-empty string, got {name!r}.")
        existing = self._entries.get(name)
        if existing is not None and existing is not obj:
            raise ValueError(
                f"{self._kind} {name!r} is already registered to {existing!r}; names must be unique. "
                f"Choose another name for {obj!r}."
            )
        self._entries[name] = obj
        return obj

    def decorator(self, name: str) -> Callable[[T], T]:
        """Return a decorator that registers the decorated object under ``name``."""

        def wrap(obj: T) -> T:
            return self.register(name, obj)

        return wrap

    def get(self, name: str) -> T:
        """Look ``name`` up.

        Raises:
            ValueError: naming the known entries and how to register a new one.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"Unknown {self._kind} {name!r}. Known: {sorted(self._entries)}. {self._how}") from None

    def names(self) -> list[str]:
        """Sorted registered names."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
