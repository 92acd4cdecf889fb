"""A long adversarial run of the batch replenisher with its invariants checked after every step.

The simulated policy's pass rates go through phases meant to break a sampler: everything all-correct
(nothing informative), then everything all-wrong, then a healthy mix, then a collapse to nearly uniform
outcomes, repeated. After every call the checks are: conservation (generated = trained + carried + dropped
by reason), every trained group informative, the batch full unless the shortfall policy let a partial one
through (and then only under ``on_shortfall=partial``), at most ``max_num_gen_batches`` rounds, carried
groups no older than ``max_staleness_steps``, and memory bounded (carried groups within their bound,
prompt history within the prompt count). ``error`` runs must raise ``ShortfallError`` in hopeless phases
and keep going afterwards with a consistent state.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from dapo_verl.config import SamplerConfig
from dapo_verl.core import dynamic_group_mask
from dapo_verl.sampler import BatchReplenisher, ShortfallError
from dapo_verl.sampler.simulation import SimulatedPolicy

__all__ = ["STRESS_CONFIGS", "StressResult", "run_stress"]

PHASES = (("all_correct", 1.0), ("all_wrong", 0.0), ("mixed", None), ("near_uniform", 0.98))
"""Pass-rate phases in order; None means a per-prompt mix of rates."""

STRESS_CONFIGS = {
    "adaptive + carry + skip, partial": dict(
        refill="adaptive", surplus="carry", skip_uninformative=True, on_shortfall="partial", max_staleness_steps=2
    ),
    "barrier + discard, error": dict(refill="barrier", surplus="discard", on_shortfall="error", gen_batch_size=24),
    "adaptive + discard, error": dict(refill="adaptive", surplus="discard", on_shortfall="error"),
    "adaptive + carry + prediction, partial": dict(
        refill="adaptive",
        surplus="carry",
        prompt_selection="predicted",
        prefer_informative=True,
        explore_fraction=0.2,
        on_shortfall="partial",
    ),
}


@dataclass
class StressResult:
    """One configuration's stress run: calls made, checks passed, shortfalls by policy, violations."""

    name: str
    steps: int = 0
    invariant_checks: int = 0
    shortfall_errors: int = 0
    partial_batches: int = 0
    max_carried: int = 0
    max_history: int = 0
    violations: list[str] = field(default_factory=list)


def _pass_rate(steps_per_phase: int):
    def rate(prompt_id: int, step: int) -> float:
        _, value = PHASES[(step // steps_per_phase) % len(PHASES)]
        if value is None:
            return (prompt_id % 5) / 4  # 0, .25, .5, .75, 1: a mix with informative prompts
        return value

    return rate


def run_stress(steps: int = 2000, steps_per_phase: int = 100, seed: int = 0) -> list[StressResult]:
    """Run every :data:`STRESS_CONFIGS` entry for ``steps`` calls of ``next_batch``."""
    quiet = logging.getLogger("dapo_verl")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # shortfall warnings are the point here
    try:
        return [
            _stress_one(name, overrides, steps, steps_per_phase, seed) for name, overrides in STRESS_CONFIGS.items()
        ]
    finally:
        quiet.setLevel(level)


def _stress_one(name: str, overrides: dict, steps: int, steps_per_phase: int, seed: int) -> StressResult:
    config = SamplerConfig(train_batch_size=8, max_num_gen_batches=4, seed=seed, **overrides)
    policy = SimulatedPolicy(_pass_rate(steps_per_phase), group_size=4, seed=seed)
    num_prompts = 200
    sampler = BatchReplenisher(config, num_prompts, policy)
    result = StressResult(name)
    largest_round = max(config.prompts_per_round, math.ceil(config.max_oversample_factor * config.train_batch_size))
    carried_bound = config.max_staleness_steps * config.max_num_gen_batches * largest_round
    for step in range(steps):
        policy.step = step
        calls = policy.calls
        checks = _Checks(result, step)
        try:
            batch = sampler.next_batch()
        except ShortfallError:
            result.shortfall_errors += 1
            checks.expect(config.on_shortfall == "error", "ShortfallError although on_shortfall=partial")
        else:
            full = len(batch.groups) == config.train_batch_size
            result.partial_batches += not full
            checks.expect(full or (batch.is_partial and config.on_shortfall == "partial"), "short batch not flagged")
            checks.expect(
                not batch.groups or bool(dynamic_group_mask(batch.stacked_metric()).all()),
                "uninformative group trained",
            )
            checks.expect(
                batch.metrics["dapo/sampler/carried_staleness_max"] <= config.max_staleness_steps, "stale group trained"
            )
        checks.expect(policy.calls - calls <= config.max_num_gen_batches, "round limit exceeded")
        checks.expect(sampler.conservation_gap() == 0, f"conservation gap {sampler.conservation_gap()}")
        checks.expect(len(sampler.carried) <= carried_bound, f"{len(sampler.carried)} carried > {carried_bound}")
        checks.expect(sampler.stream.history_size <= num_prompts, "history larger than the prompt set")
        result.steps += 1
        result.max_carried = max(result.max_carried, len(sampler.carried))
        result.max_history = max(result.max_history, sampler.stream.history_size)
    return result


class _Checks:
    def __init__(self, result: StressResult, step: int) -> None:
        self.result, self.step = result, step

    def expect(self, ok: bool, message: str) -> None:
        self.result.invariant_checks += 1
        if not ok:
            self.result.violations.append(f"step {self.step}: {message}")
