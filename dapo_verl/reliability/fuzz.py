"""Seeded fuzzing of every public core function and of the config entry points, each case with an expected outcome.

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

Anything else -- another exception type, a message that names none of the expected arguments, a NaN or inf
in a loss or gradient, a broken invariant -- is a failure, recorded with the case's description so it can be
replayed. Everything is drawn from one seed, so a run is reproducible and its counts are stable.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from dapo_verl import core
from dapo_verl.config import DapoConfig, iter_verl_fields

__all__ = ["FUZZ_TARGETS", "FuzzResult", "names_exactly", "run_fuzz"]

_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_POISON = [math.nan, math.inf, -math.inf, 1e30, -1e30]
_OVERFLOW = [1e38, -1e38, 3e38, -3e38]
"""Finite in float32 (max 3.4e38), but a product with a ratio or a sum over tokens overflows it."""


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


def names_exactly(message: str, name: str) -> bool:
    """Whether ``message`` names ``name`` as a whole word or key (``old_logp`` does not name ``logp``).

    Example:
        >>> names_exactly("old_logp has NaN at [0, 1]", "logp"), names_exactly("logp has NaN", "logp")
        (False, True)
        >>> names_exactly("algorithm.filter_groups.enable='x' must be a boolean", "filter_groups.enable")
        False
    """
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message) is not None


class _Case:
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

    def poison(self, tensor: torch.Tensor, name: str, where: torch.Tensor | None = None, *,
               valid: torch.Tensor | None = None, p: float = 0.2) -> torch.Tensor:
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
        value = self.rng.choice(_POISON + _OVERFLOW)
        flat[index] = value
        if valid is None or bool(valid.reshape(-1)[index]):
            self.risky.add(name)
            self.overflow |= value in _OVERFLOW
            if name in ("logp", "old_logp") and not math.isnan(value):
                # the log-ratio saturates at the clamp, and ratio x advantage may leave logp's dtype range:
                # an overflow error may rightly name the dtype's owner or the advantages instead
                self.risky |= {"logp", "advantages"}
        self.note(f"{name}[{index}]={value}")
        return tensor


# -- losses --------------------------------------------------------------------------------------------


def _valid_token_count(case: _Case, valid: int) -> int | torch.Tensor | float | None:
    """``num_valid_tokens`` as a micro-batch of a larger mini-batch passes it, or an invalid count."""
    if not case.chance(0.3):
        return None
    bad = [math.nan, math.inf, -1, 0.5, float(valid) + 0.5, *([valid - 1, 0] if valid > 0 else [])]
    count = case.pick("num_valid_tokens", [valid, valid + case.rng.randint(1, 40)], bad=bad, p_bad=0.3)
    return torch.tensor(count) if case.chance(0.3) else count


def _loss_case(case: _Case) -> Callable[[], Any]:
    b, length = case.rng.randint(0, 6), case.rng.randint(0, 8)
    dtype = case.rng.choice(_FLOATS)
    if case.chance(0.02):
        dtype = torch.int64
        case.bad.add("logp")
    logp = (-torch.rand(b, length, generator=case.gen) * 3).to(dtype)
    old = (-torch.rand(b, length, generator=case.gen) * 3).to(case.rng.choice(_FLOATS))
    mask = torch.rand(b, length, generator=case.gen) > case.rng.random()
    bool_mask = mask.clone()
    if case.chance(0.3):
        mask = mask.to(case.rng.choice([torch.int64, torch.float32]))
        if case.chance(0.1) and bool(bool_mask.any()):
            mask = mask * 0.5
            case.bad.add("mask")
    adv = torch.randn(b, generator=case.gen)
    if case.chance(0.2):
        adv = adv.unsqueeze(-1).expand(b, length).clone()
    if case.chance(0.03):
        adv = torch.randn(b + 1, generator=case.gen)
        case.bad.add("advantages")
    if logp.is_floating_point():
        logp = case.poison(logp, "logp", ~bool_mask if case.chance(0.6) else None, valid=bool_mask)
    old = case.poison(old, "old_logp", ~bool_mask if case.chance(0.6) else None, valid=bool_mask)
    adv = case.poison(adv, "advantages")
    kwargs: dict[str, Any] = {
        "clip_low": case.pick("clip_low", [0.2, 0.1, 0.0], bad=[-0.1, 1.5, math.nan]),
        "clip_high": case.pick("clip_high", [0.28, 0.2, 0.0], bad=[-0.2, math.inf]),
        "clip_ratio_c": case.pick("clip_ratio_c", [None, 3.0, 10.0], bad=[0.5]),
        "aggregation": case.pick("aggregation", ["token_mean_global", "token_mean_group", "seq_mean_token_mean",
                                                 "seq_mean_token_sum"], bad=["token-mean"]),
    }
    if kwargs["aggregation"] == "token_mean_group":
        if case.chance(0.9):
            kwargs["group_index"] = torch.randint(0, max(b // 2, 1), (b,), generator=case.gen)
        else:
            case.bad.add("group_index")
    if kwargs["aggregation"] == "token_mean_global":
        count = _valid_token_count(case, int(bool_mask.sum()))
        if count is not None:
            kwargs["num_valid_tokens"] = count
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

    return run


# -- advantages and filters -----------------------------------------------------------------------------


def _rewards(case: _Case, *, name: str = "rewards") -> torch.Tensor:
    """(P, G) rewards in a random encoding; 1-D or G = 1 (no baseline, refused by every group function) is bad."""
    p, g = case.rng.randint(0, 5), case.rng.choice([1, 2, 3, 8])
    if g < 2:
        case.bad.add(name)
    encoding = case.rng.choice(["01", "pm1", "bool", "int", "float", "const"])
    raw = torch.randint(0, 2, (p, g), generator=case.gen)
    rewards = {"01": raw.float(), "pm1": raw.float() * 2 - 1, "bool": raw.bool(), "int": raw,
               "float": torch.randn(p, g, generator=case.gen), "const": torch.full((p, g), 0.3)}[encoding]
    if case.chance(0.05):
        rewards = rewards.reshape(-1)
        case.bad.add(name)
    case.note(f"rewards {encoding} {tuple(rewards.shape)} {rewards.dtype}")
    return case.poison(rewards, name)


def _advantage_case(case: _Case) -> Callable[[], Any]:
    rewards = _rewards(case)
    if not rewards.is_floating_point():
        case.bad.add("rewards")  # advantages are real numbers: 0/1 and bool rewards are converted by the caller
    eps = case.pick("eps", [1e-6, 0.0, 0.1], bad=[-1.0, math.nan])
    scale = case.chance(0.7)
    if "rewards" in case.bad | case.risky:
        case.risky.add("scores")  # the flat variant names its own argument

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

    return run


def _filter_case(case: _Case) -> Callable[[], Any]:
    rewards = _rewards(case)

    def run() -> None:
        keep = core.dynamic_group_mask(rewards)
        reasons = core.group_drop_reasons(rewards)
        values = rewards.float()
        expected = values.amax(1) > values.amin(1) if values.numel() else torch.zeros(0, dtype=torch.bool)
        assert torch.equal(keep, expected)
        assert torch.equal(reasons == int(core.DropReason.KEEP), keep)

    return run


# -- rewards --------------------------------------------------------------------------------------------


def _overlong_case(case: _Case) -> Callable[[], Any]:
    n = case.rng.randint(0, 6)
    lmax = case.pick("max_response_length", [8, 20, 32], bad=[0, -4, 2.5])
    buf = case.pick("overlong_tokens", [4, 1, 8], bad=[0, -2, 40, True])
    factor = case.pick("overlong_penalty_factor", [1.0, 0.5, 0.0], bad=[-1.0, math.nan, "1"])
    schedule = case.pick("overlong schedule", ["linear", "quadratic"], bad=["cubic"])
    lengths = torch.randint(-1 if case.chance(0.05) else 0, 30, (n,), generator=case.gen)
    if bool((lengths < 0).any()):
        case.bad.add("response_lengths")
    if case.chance(0.15):
        lengths = case.poison(lengths.float(), "response_lengths", p=0.5)
    rewards = case.poison(torch.randn(n, generator=case.gen), "rewards")
    if case.chance(0.05):
        rewards = torch.randn(n + 1, generator=case.gen)
        case.bad |= {"rewards", "response_lengths"}  # a length mismatch may be reported under either name
    case.note(f"n={n} lmax={lmax} buf={buf} factor={factor} schedule={schedule} lengths={lengths.tolist()}")

    def run() -> None:
        shaped = core.reward_overlong_penalty(rewards, lengths, lmax, buf, factor, schedule=schedule)
        assert torch.isfinite(shaped).all() and (shaped <= rewards + 1e-6).all()
        assert (shaped >= rewards - float(factor) - 1e-6).all()
        truncated = core.truncated_response_mask(lengths.long(), lmax)
        masked = core.mask_truncated_responses(torch.ones(n, 3, dtype=torch.bool), truncated)
        assert torch.equal(masked.any(1), ~truncated)

    return run


# -- config ---------------------------------------------------------------------------------------------

_CONFIG_VALUES = [-1, 0, 1, 1.5, -0.5, 0.2, 2**40, "x", "", "false", "true", True, False, None, [], {"a": 1},
                  math.nan, math.inf]


def _fits_type(value: Any, annotation: str) -> bool:
    """Whether an accepted non-None ``value`` has the type the field's annotation (``"int | None"``, ...) names."""
    if "bool" in annotation:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if "float" in annotation:
        return isinstance(value, int | float) and math.isfinite(value)
    if "int" in annotation:
        return isinstance(value, int)
    return isinstance(value, str) and bool(value)


def _read_back(config: Any, attr_path: tuple[str, ...]) -> Any:
    for part in attr_path:
        config = getattr(config, part)
    return config


def _config_case_for(read: Callable[[Mapping[str, Any]], Any], root: type,
                     tree: Callable[[], dict[str, Any]]) -> Callable[[_Case], Callable[[], Any]]:
    """A config target: inject drawn values at random keys of ``tree()`` and read it with ``read``."""
    leaves = {key: leaf for key, leaf in iter_verl_fields(root)}

    def make(case: _Case) -> Callable[[], Any]:
        config = tree()
        injected: dict[str, Any] = {}
        for _ in range(case.rng.randint(1, 3)):
            key = case.rng.choice(sorted(leaves))
            node = config
            *parents, name = key.split(".")
            for part in parents:
                node = node[part]
            node[name] = injected[key] = case.rng.choice(_CONFIG_VALUES)
            case.note(f"{key}={injected[key]!r}")
        case.risky |= set(injected)  # the oracle below decides: read back exactly, or refused naming a key

        def run() -> None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DeprecationWarning)
                result = read(config)
            deprecated = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
            for key, value in injected.items():
                if any(names_exactly(message, key) for message in deprecated):
                    continue  # a deprecated key: ignored, and the user was told so
                leaf = leaves[key]
                got = _read_back(result, leaf.attr_path)
                if value is None:
                    assert got == leaf.default, f"{key}=None read back as {got!r}, not the default"
                    continue
                annotation = str(leaf.field.type)
                assert _fits_type(value, annotation), f"{key}={value!r} accepted for a field of type {annotation}"
                assert got == value and type(got) is type(value), f"{key}={value!r} read back as {got!r}"

        return run

    return make


def _local_run_tree() -> dict[str, Any]:
    from dapo_verl.local.config import LocalRunConfig, defaults_tree

    return defaults_tree(LocalRunConfig)


def _read_local(tree: Mapping[str, Any]) -> Any:
    from dapo_verl.local.config import read_run_config

    return read_run_config(tree)


def _local_root() -> type:
    from dapo_verl.local.config import LocalRunConfig

    return LocalRunConfig


# -- sampler -------------------------------------------------------------------------------------------


def _sampler_case(case: _Case) -> Callable[[], Any]:
    from dapo_verl.config import SamplerConfig
    from dapo_verl.sampler import BatchReplenisher, GroupResult, ShortfallError

    config = SamplerConfig(
        train_batch_size=case.rng.randint(1, 6), max_num_gen_batches=case.rng.randint(1, 4),
        refill=case.rng.choice(["barrier", "adaptive"]), surplus=case.rng.choice(["discard", "carry"]),
        on_shortfall=case.rng.choice(["error", "partial"]), seed=case.rng.randrange(1000),
    )
    fault = case.pick("generate", ["none"], bad=["count", "order", "singleton", "shape", "nan"], p_bad=0.5)
    if fault != "none":
        case.bad |= {"prompt", "metric", "response_lengths"}  # the fault may be reported under its field
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

    return run


FUZZ_TARGETS: dict[str, Callable[[_Case], Callable[[], Any]]] = {
    "dapo_loss + clip_diagnostics": _loss_case,
    "group_advantages (+ by_index)": _advantage_case,
    "dynamic_group_mask + group_drop_reasons": _filter_case,
    "reward_overlong_penalty + truncation masks": _overlong_case,
    "DapoConfig.from_verl": _config_case_for(DapoConfig.from_verl, DapoConfig, lambda: DapoConfig().to_verl()),
    "LocalRunConfig (dapo-verl train's own keys)": lambda case: _config_case_for(_read_local, _local_root(),
                                                                                 _local_run_tree)(case),
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


def _outcome(case: _Case, run: Callable[[], Any]) -> tuple[str, str]:
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


def _fuzz_target(name: str, make: Callable[[_Case], Callable[[], Any]], cases: int,
                 rng: random.Random) -> FuzzResult:
    result = FuzzResult(name)
    for _ in range(cases):
        case = _Case(rng)
        run = make(case)
        start = time.perf_counter()
        result.tried += 1
        kind, why = _outcome(case, run)
        result.drawn.update([f"bad:{n}" for n in case.bad] + [f"risky:{n}" for n in case.risky]
                            + ["overflow"] * case.overflow)
        if kind == "correct":
            result.correct += 1
        elif kind == "clear":
            result.clear_errors += 1
        else:
            result.failures.append(f"{why} :: {'; '.join(case.notes)}")
        result.slowest_s = max(result.slowest_s, time.perf_counter() - start)
    return result

