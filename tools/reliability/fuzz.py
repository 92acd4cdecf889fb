"""Seeded fuzzing of every public core function and of what dapo_verl reads from outside, each case with an expected
outcome: config values, the overrides ``doctor`` and ``rehearse`` check, the sampler's callback and state contracts.

Each case draws random shapes (empty included), dtypes, masks, group sizes (1 included), reward
encodings, token counts, and injects NaN, +-inf, huge values and values that overflow float32 (1e38,
3e38) at random positions, padded or valid; settings are drawn valid or invalid. While drawing, a case
records what it expects:

* every argument it drew **invalid** (``bad``): the call must fail with a ``ValueError`` or ``TypeError`` whose
  message names one of those arguments -- by the exact name, so ``old_logp`` does not count for ``logp``
  and ``algorithm.filter_groups.enable`` not for ``enable``. Success is a failure ("accepted invalid");
* every argument whose drawn value the function may either handle or refuse (``risky``: NaN or inf at a
  valid position, values near the float32 limit): a correct result or a clear error naming one of them;
* nothing bad or risky: a **correct result** is required, one that satisfies the function's contract (see
  each ``run``); for the config targets that means every drawn value reads back unchanged and with the
  field's type, unless a ``DeprecationWarning`` named its key (a deprecated key is ignored, and says so).
  Any error is a failure ("refused valid input").

The targets live by area -- :mod:`.fuzz_core` (the core math), :mod:`.fuzz_inputs` (config values and the
sampler's contracts), :mod:`.fuzz_preflight` (the overrides of ``doctor`` and ``rehearse``) -- and draw with
:class:`~tools.reliability.fuzz_cases.Case`. A target whose cases each compose a Hydra config runs a share of
the cases the others run (:data:`CASE_SHARE`).

Anything else -- another exception type, a message that names none of the expected arguments, a NaN or inf
in a loss or gradient, a broken invariant -- is a failure, recorded with the case's description so it can be
replayed. Everything is drawn from one seed, so a run is reproducible and its counts are stable.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dapo_verl.config import DapoConfig
from tools.reliability.fuzz_cases import Case, names_exactly
from tools.reliability.fuzz_core import advantage_case, filter_case, loss_case, overlong_case
from tools.reliability.fuzz_inputs import (
    config_case_for,
    local_root,
    local_run_tree,
    read_local,
    sampler_case,
    sampler_state_case,
)
from tools.reliability.fuzz_preflight import preflight_case

__all__ = ["CASE_SHARE", "FUZZ_TARGETS", "FuzzResult", "cases_for", "names_exactly", "run_fuzz"]


@dataclass
class FuzzResult:
    """Outcome counts of one target: cases tried, correct results, clear errors, failures.

    ``drawn`` counts what the cases drew: ``bad:<argument>`` and ``risky:<argument>`` per case, and
    ``overflow`` for values beyond float32's comfort (1e38, 3e38) written at a valid position.
    """

    target: str
    tried: int = 0
    correct: int = 0
    clear_errors: int = 0
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    drawn: Counter[str] = field(default_factory=Counter)


FUZZ_TARGETS: dict[str, Callable[[Case], Callable[[], Any]]] = {
    "dapo_loss + clip_diagnostics": loss_case,
    "group_advantages (+ by_index)": advantage_case,
    "dynamic_group_mask + group_drop_reasons": filter_case,
    "reward_overlong_penalty + truncation masks": overlong_case,
    "DapoConfig.from_verl": config_case_for(DapoConfig.from_verl, DapoConfig, lambda: DapoConfig().to_verl()),
    "LocalRunConfig (dapo-verl train's own keys)": lambda case: config_case_for(
        read_local, local_root(), local_run_tree
    )(case),
    "doctor/rehearse overrides (the pre-flight check)": preflight_case,
    "BatchReplenisher with faulty generate callbacks": sampler_case,
    "BatchReplenisher.load_state_dict with damaged states": sampler_state_case,
}
"""Every fuzzed entry point and the generator of its cases."""

CASE_SHARE = {"doctor/rehearse overrides (the pre-flight check)": 0.05}
"""Share of ``cases_per_target`` a target runs when it is not 1: each pre-flight case composes a verl config with
Hydra (about a second), the other targets' cases take milliseconds."""


def cases_for(target: str, cases_per_target: int) -> int:
    """How many cases ``target`` runs when every other target runs ``cases_per_target`` (at least 3)."""
    share = CASE_SHARE.get(target, 1.0)
    return cases_per_target if share == 1.0 else max(3, math.ceil(share * cases_per_target))


def run_fuzz(cases_per_target: int = 400, seed: int = 0) -> list[FuzzResult]:
    """Run ``cases_per_target`` seeded cases against every target; see the module docstring."""
    results = []
    quiet = logging.getLogger("dapo_verl")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # shortfall warnings are expected here
    try:
        for offset, (name, make) in enumerate(FUZZ_TARGETS.items()):
            results.append(
                _fuzz_target(name, make, cases_for(name, cases_per_target), random.Random(seed * 7919 + offset))
            )
    finally:
        quiet.setLevel(level)
    return results


def _outcome(case: Case, run: Callable[[], Any]) -> tuple[str, str]:
    """``("correct" | "clear" | "failure", why)`` of one case against its expectations."""
    try:
        run()
    except AssertionError as err:
        return "failure", f"wrong result ({err})"
    except (ValueError, TypeError) as err:
        expected = case.bad | case.risky  # which of several problems a function reports first is its choice
        if not expected:
            return "failure", f"refused valid input: {type(err).__name__}: {err}"
        if any(names_exactly(str(err), name) for name in expected):
            return "clear", ""
        return "failure", f"error names none of {sorted(expected)}: {type(err).__name__}: {err}"
    except Exception as err:  # any other exception type is a crash, whatever was drawn
        return "failure", f"{type(err).__name__}: {err}"
    if case.bad:
        return "failure", f"accepted invalid {sorted(case.bad)}"
    return "correct", ""


def _fuzz_target(name: str, make: Callable[[Case], Callable[[], Any]], cases: int, rng: random.Random) -> FuzzResult:
    result = FuzzResult(name)
    for _ in range(cases):
        case = Case(rng)
        run = make(case)
        start = time.perf_counter()
        result.tried += 1
        kind, why = _outcome(case, run)
        result.drawn.update(
            [f"bad:{n}" for n in case.bad] + [f"risky:{n}" for n in case.risky] + ["overflow"] * case.overflow
        )
        if kind == "correct":
            result.correct += 1
        elif kind == "clear":
            result.clear_errors += 1
        else:
            result.failures.append(f"{why} :: {'; '.join(case.notes)}")
        result.slowest_s = max(result.slowest_s, time.perf_counter() - start)
    return result
