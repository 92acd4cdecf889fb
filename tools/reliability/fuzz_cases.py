"""The draws of one fuzz case and what it expects, shared by every target of :mod:`tools.reliability.fuzz`.

A :class:`Case` draws settings valid or invalid (:meth:`Case.pick`) and poisons tensors with NaN, +-inf, huge
values and values that overflow float32 (:meth:`Case.poison`), remembering every argument it drew invalid
(``bad``: the call must fail naming one of them) or risky (a correct result or an error naming one of them),
and a description for failure reports. :func:`names_exactly` decides whether an error message names an
argument.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

import torch

__all__ = ["FLOATS", "OVERFLOW", "POISON", "Case", "names_exactly"]

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
POISON = [math.nan, math.inf, -math.inf, 1e30, -1e30]
OVERFLOW = [1e38, -1e38, 3e38, -3e38]
"""Finite in float32 (max 3.4e38), but a product with a ratio or a sum over tokens overflows it."""


def names_exactly(message: str, name: str) -> bool:
    """Whether ``message`` names ``name`` as a whole word or key (``old_logp`` does not name ``logp``).

    Example:
        >>> names_exactly("old_logp has NaN at [0, 1]", "logp"), names_exactly("logp has NaN", "logp")
        (False, True)
        >>> names_exactly("algorithm.filter_groups.enable='x' must be a boolean", "filter_groups.enable")
        False
    """
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message) is not None


class Case:
    """Random draws for one case, remembering what it expects and a short description for failure reports."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.gen = torch.Generator().manual_seed(rng.randrange(2**31))
        self.notes: list[str] = []
        self.bad: set[str] = set()
        self.risky: set[str] = set()
        self.overflow = False

    def note(self, text: str) -> None:
        self.notes.append(text)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, name: str, good: list[Any], *, bad: list[Any], p_bad: float = 0.08) -> Any:
        """A valid setting of argument ``name``, or with probability ``p_bad`` an invalid one (then expected named)."""
        if self.chance(p_bad):
            self.bad.add(name)
            return self.rng.choice(bad)
        return self.rng.choice(good)

    def poison(
        self,
        tensor: torch.Tensor,
        name: str,
        where: torch.Tensor | None = None,
        *,
        valid: torch.Tensor | None = None,
        p: float = 0.2,
    ) -> torch.Tensor:
        """Maybe write a NaN, inf, huge or float32-overflowing value into ``tensor`` (inside ``where`` if given).

        A value written where ``valid`` is True (everywhere when ``valid`` is None) makes ``name`` risky.
        """
        if not tensor.is_floating_point() or tensor.numel() == 0 or not self.chance(p):
            return tensor
        tensor = tensor.clone()
        flat = tensor.reshape(-1)
        candidates = torch.arange(flat.numel()) if where is None else where.reshape(-1).nonzero().reshape(-1)
        if candidates.numel() == 0:
            return tensor
        index = int(candidates[self.rng.randrange(candidates.numel())])
        value = self.rng.choice(POISON + OVERFLOW)
        flat[index] = value
        if valid is None or bool(valid.reshape(-1)[index]):
            self.risky.add(name)
            self.overflow |= value in OVERFLOW
            if name in ("logp", "old_logp") and not math.isnan(value):
                # the log-ratio saturates at the clamp, and ratio x advantage may leave logp's dtype range:
                # an overflow error may rightly name the dtype's owner or the advantages instead
                self.risky |= {"logp", "advantages"}
        self.note(f"{name}[{index}]={value}")
        return tensor
