"""Patch a class of verl's or vLLM's when its module is imported: the seam of a rehearsal's bridges.

A rehearsal changes a few methods of verl and vLLM in its own processes only (the resume barrier, the vLLM
bridges). Importing those modules early to patch them would slow every process down and could import them in
processes that never use them, so :func:`patch_on_import` registers a patch that runs right after the module's
own code, whenever the process imports it -- or at once, if it already has.

Patches are marked with :data:`PATCHED` on the function they install and must skip a function that already
carries it, so applying one twice is harmless.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["PATCHED", "is_patched", "mark", "patch_on_import"]

PATCHED = "__dapo_verl_rehearsal_patch__"
"""Attribute set on every function a rehearsal installs in place of verl's or vLLM's."""

Patch = Callable[[ModuleType], None]


def mark(function: Any) -> Any:
    """Mark ``function`` as a rehearsal's replacement and return it."""
    setattr(function, PATCHED, True)
    return function


def is_patched(function: Any) -> bool:
    """Whether ``function`` is a rehearsal's replacement (see :func:`mark`)."""
    return bool(getattr(function, PATCHED, False))


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import hook: loads a patched module with its own loader, then runs the patches registered for it."""

    def __init__(self) -> None:
        self.patches: dict[str, list[Patch]] = {}
        self._loaders: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                self._loaders[name] = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loaders[spec.name].create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loaders[module.__name__].exec_module(module)
        for patch in self.patches[module.__name__]:
            patch(module)


def _hook() -> _PatchOnImport:
    for finder in sys.meta_path:
        if isinstance(finder, _PatchOnImport):
            return finder
    finder = _PatchOnImport()
    sys.meta_path.insert(0, finder)
    return finder


def patch_on_import(module_name: str, patch: Patch) -> None:
    """Run ``patch(module)`` once ``module_name`` is imported in this process (now, if it already is)."""
    _hook().patches.setdefault(module_name, []).append(patch)
    if module_name in sys.modules:
        patch(sys.modules[module_name])
