"""Seeded fuzzing of every public core function and of the config entry point.

Each case draws random shapes (empty included), dtypes, masks, group sizes (1 included), reward
encodings, and injects NaN, +-inf or huge values at random positions, padded or valid; settings are drawn
valid or invalid. A case passes when it ends either in a **correct result** -- finite outputs and gradients
that satisfy the function's contract (see each ``_check_*``) -- or in a **clear error**: a ``ValueError`` or
``TypeError`` whose message names the offending argument (or the full config key). Anything else -- another
exception type, a message that names nothing, a NaN or inf in a loss or gradient, a broken invariant --
is a failure, recorded with the case's description so it can be replayed.

Everything is drawn from one seed, so a run is reproducible and its counts are stable.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo_verl import core
from dapo_verl.config import DapoConfig, iter_verl_fields

__all__ = ["FUZZ_TARGETS", "FuzzResult", "run_fuzz"]

_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_POISON = [math.nan, math.inf, -math.inf, 1e30, -1e30]


@dataclass
class FuzzResult:
    """Outcome counts of one target: cases tried, correct results, clear errors, failures."""

    target: str
    tried: int = 0
    correct: int = 0
    clear_errors: int = 0
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0


class _Case:
    """Random draws for one case, remembering a short description for failure reports."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.gen = torch.Generator().manual_seed(rng.randrange(2**31))
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, good: list[Any], *, bad: list[Any], p_bad: float = 0.08) -> Any:
        """A valid setting, or with probability ``p_bad`` an invalid one."""
        return self.rng.choice(bad) if self.chance(p_bad) else self.rng.choice(good)

    def poison(self, tensor: torch.Tensor, name: str, where: torch.Tensor | None = None) -> torch.Tensor:
        """Maybe write a NaN/inf/huge value into ``tensor`` (inside ``where`` if given)."""
        if not tensor.is_floating_point() or tensor.numel() == 0 or not self.chance(0.2):
            return tensor
        tensor = tensor.clone()
        flat = tensor.reshape(-1)
        candidates = torch.arange(flat.numel()) if where is None else where.reshape(-1).nonzero().reshape(-1)
        if candidates.numel() == 0:
            return tensor
        index = int(candidates[self.rng.randrange(candidates.numel())])
        value = self.rng.choice(_POISON)
        flat[index] = value
        self.note(f"{name}[{index}]={value}")
        return tensor


def _names_argument(err: Exception, names: tuple[str, ...]) -> bool:
    return isinstance(err, (ValueError, TypeError)) and any(name in str(err) for name in names)


# -- losses --------------------------------------------------------------------------------------------


def _loss_case(case: _Case) -> tuple[Callable[[], Any], tuple[str, ...]]:
    b, length = case.rng.randint(0, 6), case.rng.randint(0, 8)
    dtype = case.rng.choice([*_FLOATS, torch.int64]) if case.chance(0.1) else case.rng.choice(_FLOATS)
    logp = (-torch.rand(b, length, generator=case.gen) * 3).to(dtype)
    old = (-torch.rand(b, length, generator=case.gen) * 3).to(case.rng.choice(_FLOATS))
    mask = torch.rand(b, length, generator=case.gen) > case.rng.random()
    if case.chance(0.3):
        mask = mask.to(case.rng.choice([torch.int64, torch.float32]))
        if case.chance(0.1):
            mask = mask * 0.5
    adv = torch.randn(b, generator=case.gen)
    if case.chance(0.2):
        adv = adv.unsqueeze(-1).expand(b, length).clone()
    if case.chance(0.05):
        adv = torch.randn(b + 1, generator=case.gen)
    bool_mask = mask != 0
    if logp.is_floating_point():
        logp = case.poison(logp, "logp", ~bool_mask if case.chance(0.6) else None)
    old = case.poison(old, "old_logp", ~bool_mask if case.chance(0.6) else None)
    adv = case.poison(adv, "advantages")
    kwargs: dict[str, Any] = {
        "clip_low": case.pick([0.2, 0.1, 0.0], bad=[-0.1, 1.5, math.nan]),
        "clip_high": case.pick([0.28, 0.2, 0.0], bad=[-0.2, math.inf]),
        "clip_ratio_c": case.pick([None, 3.0, 10.0], bad=[0.5]),
        "aggregation": case.pick(["token_mean_global", "token_mean_group", "seq_mean_token_mean",
                                  "seq_mean_token_sum"], bad=["token-mean"]),
    }
    if kwargs["aggregation"] == "token_mean_group" and case.chance(0.8):
        kwargs["group_index"] = torch.randint(0, max(b // 2, 1), (b,), generator=case.gen)
    case.note(f"B={b} L={length} logp={dtype} mask={mask.dtype} adv={tuple(adv.shape)} {kwargs}")
    leaf = logp.detach().clone().requires_grad_(logp.is_floating_point())

    def run() -> None:
        loss = core.dapo_loss(leaf, old, adv, mask, **kwargs)
        assert loss.ndim == 0 and torch.isfinite(loss), f"loss {loss}"
        loss.backward()
        grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        assert torch.isfinite(grad).all(), "non-finite gradient"
        assert (grad[~bool_mask] == 0).all(), "gradient on padding"
        stats = core.clip_diagnostics(leaf.detach(), old, adv, mask, clip_low=kwargs["clip_low"],
                                      clip_high=kwargs["clip_high"], clip_ratio_c=kwargs["clip_ratio_c"])
        for key, value in stats.items():
            assert torch.isfinite(value), key
            assert not key.endswith("_fraction") or 0 <= float(value) <= 1, key

    names = ("logp", "old_logp", "advantages", "mask", "clip_low", "clip_high", "clip_ratio_c", "aggregation",
             "group_index")
    return run, names


# -- advantages and filters -----------------------------------------------------------------------------


def _rewards(case: _Case) -> torch.Tensor:
    p, g = case.rng.randint(0, 5), case.rng.choice([1, 2, 3, 8])
    encoding = case.rng.choice(["01", "pm1", "bool", "int", "float", "const"])
    raw = torch.randint(0, 2, (p, g), generator=case.gen)
    rewards = {"01": raw.float(), "pm1": raw.float() * 2 - 1, "bool": raw.bool(), "int": raw,
               "float": torch.randn(p, g, generator=case.gen), "const": torch.full((p, g), 0.3)}[encoding]
    if case.chance(0.05):
        rewards = rewards.reshape(-1)
    case.note(f"rewards {encoding} {tuple(rewards.shape)} {rewards.dtype}")
    return case.poison(rewards, "rewards")


def _advantage_case(case: _Case) -> tuple[Callable[[], Any], tuple[str, ...]]:
    rewards = _rewards(case)
    eps = case.pick([1e-6, 0.0, 0.1], bad=[-1.0, math.nan])
    scale = case.chance(0.7)

    def run() -> None:
        adv = core.group_advantages(rewards, scale_by_std=scale, eps=eps)
        assert torch.isfinite(adv).all() and adv.shape == rewards.shape
        keep = core.dynamic_group_mask(rewards)
        assert (adv[~keep] == 0).all(), "zero-spread group with advantage"
        row_sum, row_size = adv.double().sum(1).abs(), adv.double().abs().sum(1)
        assert (row_sum <= 1e-5 * row_size + 1e-3).all(), "advantages do not sum to zero within a group"
        flat = core.group_advantages_by_index(rewards.reshape(-1), [i // rewards.shape[1] for i in
                                                                    range(rewards.numel())], scale_by_std=scale,
                                              eps=eps)
        assert torch.allclose(flat, adv.reshape(-1), atol=1e-4, rtol=1e-3)

    return run, ("rewards", "scores", "eps", "index")


def _filter_case(case: _Case) -> tuple[Callable[[], Any], tuple[str, ...]]:
    rewards = _rewards(case)

    def run() -> None:
        keep = core.dynamic_group_mask(rewards)
        reasons = core.group_drop_reasons(rewards)
        values = rewards.float()
        expected = values.amax(1) > values.amin(1) if values.numel() else torch.zeros(0, dtype=torch.bool)
        assert torch.equal(keep, expected)
        assert torch.equal(reasons == int(core.DropReason.KEEP), keep)

    return run, ("rewards",)


# -- rewards --------------------------------------------------------------------------------------------


def _overlong_case(case: _Case) -> tuple[Callable[[], Any], tuple[str, ...]]:
    n = case.rng.randint(0, 6)
    lmax = case.pick([8, 20, 32], bad=[0, -4, 2.5])
    buf = case.pick([4, 1, 8], bad=[0, -2, 40, True])
    factor = case.pick([1.0, 0.5, 0.0], bad=[-1.0, math.nan, "1"])
    schedule = case.pick(["linear", "quadratic"], bad=["cubic"])
    lengths = torch.randint(-1 if case.chance(0.05) else 0, 30, (n,), generator=case.gen)
    if case.chance(0.15):
        lengths = lengths.float()
        lengths = case.poison(lengths, "response_lengths")
    rewards = case.poison(torch.randn(n + (1 if case.chance(0.05) else 0), generator=case.gen), "rewards")
    case.note(f"n={n} lmax={lmax} buf={buf} factor={factor} schedule={schedule}")

    def run() -> None:
        shaped = core.reward_overlong_penalty(rewards, lengths, lmax, buf, factor, schedule=schedule)
        assert torch.isfinite(shaped).all() and (shaped <= rewards + 1e-6).all()
        assert (shaped >= rewards - float(factor) - 1e-6).all()
        truncated = core.truncated_response_mask(lengths.long(), lmax)
        masked = core.mask_truncated_responses(torch.ones(n, 3, dtype=torch.bool), truncated)
        assert torch.equal(masked.any(1), ~truncated)

    return run, ("rewards", "response_lengths", "max_response_length", "overlong_tokens",
                 "overlong_penalty_factor", "overlong schedule")


# -- config ---------------------------------------------------------------------------------------------

_BAD_VALUES = [-1, 0, 1.5, -0.5, 2**40, "x", "", True, None, [], {"a": 1}, math.nan, math.inf]


def _config_case(case: _Case) -> tuple[Callable[[], Any], tuple[str, ...]]:
    tree = DapoConfig().to_verl()
    keys = [key for key, _ in iter_verl_fields()]
    for _ in range(case.rng.randint(1, 3)):
        key = case.rng.choice(keys)
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = case.rng.choice(_BAD_VALUES)
        case.note(f"{key}={node[leaf]!r}")

    def run() -> None:
        DapoConfig.from_verl(tree)

    return run, tuple(keys)


# -- sampler -------------------------------------------------------------------------------------------


def _sampler_case(case: _Case) -> tuple[Callable[[], Any], tuple[str, ...]]:
    from dapo_verl.config import SamplerConfig
    from dapo_verl.sampler import BatchReplenisher, GroupResult, ShortfallError

    config = SamplerConfig(
        train_batch_size=case.rng.randint(1, 6), max_num_gen_batches=case.rng.randint(1, 4),
        refill=case.rng.choice(["barrier", "adaptive"]), surplus=case.rng.choice(["discard", "carry"]),
        on_shortfall=case.rng.choice(["error", "partial"]), seed=case.rng.randrange(1000),
    )
    fault = case.pick(["none"], bad=["count", "order", "singleton", "shape", "nan"], p_bad=0.5)
    size = case.rng.choice([2, 4])
    case.note(f"{config} fault={fault}")

    def generate(ids):
        groups = []
        for pid in ids:
            g = 1 if fault == "singleton" else size
            metric = torch.rand(g, generator=case.gen) < 0.5
            lengths = torch.randint(1, 9, (g + (1 if fault == "shape" else 0),), generator=case.gen)
            if fault == "nan":
                metric = metric.float()
                metric[0] = math.nan
            groups.append(GroupResult(pid + (1 if fault == "order" else 0), metric, lengths,
                                      torch.zeros(lengths.shape, dtype=torch.bool)))
        return groups[:-1] if fault == "count" else groups

    def run() -> None:
        sampler = BatchReplenisher(config, case.rng.randint(1, 20), generate)
        for _ in range(3):
            try:
                batch = sampler.next_batch()
            except ShortfallError:  # the configured policy, with its message: a correct outcome
                assert config.on_shortfall == "error"
            else:
                assert len(batch.groups) == config.train_batch_size or batch.is_partial
                assert batch.groups == [] or bool(core.dynamic_group_mask(batch.stacked_metric()).all())
            assert sampler.conservation_gap() == 0

    return run, ("generate", "prompt", "metric", "response_lengths")


FUZZ_TARGETS: dict[str, Callable[[_Case], tuple[Callable[[], Any], tuple[str, ...]]]] = {
    "dapo_loss + clip_diagnostics": _loss_case,
    "group_advantages (+ by_index)": _advantage_case,
    "dynamic_group_mask + group_drop_reasons": _filter_case,
    "reward_overlong_penalty + truncation masks": _overlong_case,
    "DapoConfig.from_verl": _config_case,
    "BatchReplenisher with faulty generate callbacks": _sampler_case,
}
"""Every fuzzed entry point and the generator of its cases."""


def run_fuzz(cases_per_target: int = 400, seed: int = 0) -> list[FuzzResult]:
    """Run ``cases_per_target`` seeded cases against every target; see the module docstring."""
    results = []
    quiet = logging.getLogger("dapo_verl")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # shortfall warnings are expected here
    try:
        for offset, (name, make) in enumerate(FUZZ_TARGETS.items()):
            results.append(_fuzz_target(name, make, cases_per_target, random.Random(seed * 7919 + offset)))
    finally:
        quiet.setLevel(level)
    return results


def _fuzz_target(name: str, make: Callable[[_Case], tuple[Callable[[], Any], tuple[str, ...]]], cases: int,
                 rng: random.Random) -> FuzzResult:
    result = FuzzResult(name)
    for _ in range(cases):
        case = _Case(rng)
        run, names = make(case)
        start = time.perf_counter()
        result.tried += 1
        try:
            run()
            result.correct += 1
        except AssertionError as err:
            result.failures.append(f"wrong result ({err}): {'; '.join(case.notes)}")
        except Exception as err:  # classify: clear errors name the argument, anything else is a failure
            if _names_argument(err, names):
                result.clear_errors += 1
            else:
                result.failures.append(f"{type(err).__name__}: {err} :: {'; '.join(case.notes)}")
        result.slowest_s = max(result.slowest_s, time.perf_counter() - start)
    return result
