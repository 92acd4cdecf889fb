"""Fuzz targets of :mod:`dapo_verl.core`: the loss and its diagnostics, group advantages, the group filter, overlong
shaping and truncation masks. Each ``*_case`` draws one case (:class:`~tools.reliability.fuzz_cases.Case`)
and returns the call that checks the function's contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from dapo_verl import core
from tools.reliability.fuzz_cases import FLOATS, Case

__all__ = ["advantage_case", "filter_case", "loss_case", "overlong_case"]


# -- losses --------------------------------------------------------------------------------------------


def _valid_token_count(case: Case, valid: int) -> int | torch.Tensor | float | None:
    """``num_valid_tokens`` as a micro-batch of a larger mini-batch passes it, or an invalid count."""
    if not case.chance(0.3):
        return None
    bad = [math.nan, math.inf, -1, 0.5, float(valid) + 0.5, *([valid - 1, 0] if valid > 0 else [])]
    count = case.pick("num_valid_tokens", [valid, valid + case.rng.randint(1, 40)], bad=bad, p_bad=0.3)
    return torch.tensor(count) if case.chance(0.3) else count


def loss_case(case: Case) -> Callable[[], Any]:
    b, length = case.rng.randint(0, 6), case.rng.randint(0, 8)
    dtype = case.rng.choice(FLOATS)
    if case.chance(0.02):
        dtype = torch.int64
        case.bad.add("logp")
    logp = (-torch.rand(b, length, generator=case.gen) * 3).to(dtype)
    old = (-torch.rand(b, length, generator=case.gen) * 3).to(case.rng.choice(FLOATS))
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
        "aggregation": case.pick(
            "aggregation",
            ["token_mean_global", "token_mean_group", "seq_mean_token_mean", "seq_mean_token_sum"],
            bad=["token-mean"],
        ),
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
        stats = core.clip_diagnostics(
            leaf.detach(),
            old,
            adv,
            mask,
            clip_low=kwargs["clip_low"],
            clip_high=kwargs["clip_high"],
            clip_ratio_c=kwargs["clip_ratio_c"],
        )
        for key, value in stats.items():
            assert torch.isfinite(value), key
            assert not key.endswith("_fraction") or 0 <= float(value) <= 1, key

    return run


# -- advantages and filters -----------------------------------------------------------------------------


def _rewards(case: Case, *, name: str = "rewards") -> torch.Tensor:
    """(P, G) rewards in a random encoding; 1-D or G = 1 (no baseline, refused by every group function) is bad."""
    p, g = case.rng.randint(0, 5), case.rng.choice([1, 2, 3, 8])
    if g < 2:
        case.bad.add(name)
    encoding = case.rng.choice(["01", "pm1", "bool", "int", "float", "const"])
    raw = torch.randint(0, 2, (p, g), generator=case.gen)
    rewards = {
        "01": raw.float(),
        "pm1": raw.float() * 2 - 1,
        "bool": raw.bool(),
        "int": raw,
        "float": torch.randn(p, g, generator=case.gen),
        "const": torch.full((p, g), 0.3),
    }[encoding]
    if case.chance(0.05):
        rewards = rewards.reshape(-1)
        case.bad.add(name)
    case.note(f"rewards {encoding} {tuple(rewards.shape)} {rewards.dtype}")
    rewards = case.poison(rewards, name)
    return _unreadable(case, rewards, name)


def _unreadable(case: Case, tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Rarely, ``tensor`` as a complex tensor (an imaginary part to lose) or a meta tensor (no values): both bad."""
    kind = case.rng.choice(["complex", "meta"]) if case.chance(0.04) else None
    if kind is None:
        return tensor
    case.bad.add(name)
    case.note(f"{name} made {kind}")
    return tensor.to(torch.complex64) if kind == "complex" else torch.empty_like(tensor, device="meta")


def advantage_case(case: Case) -> Callable[[], Any]:
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
        flat = core.group_advantages_by_index(
            rewards.reshape(-1), [i // rewards.shape[1] for i in range(rewards.numel())], scale_by_std=scale, eps=eps
        )
        assert torch.allclose(flat, adv.reshape(-1), atol=1e-4, rtol=1e-3)

    return run


def filter_case(case: Case) -> Callable[[], Any]:
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


def overlong_case(case: Case) -> Callable[[], Any]:
    n = case.rng.randint(0, 6)
    lmax = case.pick("max_response_length", [8, 20, 32], bad=[0, -4, 2.5])
    buf = case.pick("overlong_tokens", [4, 1, 8], bad=[0, -2, 40, True])
    factor = case.pick("overlong_penalty_factor", [1.0, 0.5, 0.0], bad=[-1.0, math.nan, "1"])
    schedule = case.pick("overlong schedule", ["linear", "quadratic"], bad=["cubic"])
    lengths = torch.randint(-1 if case.chance(0.05) else 0, 30, (n,), generator=case.gen)
    if bool((lengths < 0).any()):
        case.bad.add("response_lengths")
    if case.chance(0.15):  # token counts as floats: refused by dtype, whole-valued or not
        lengths = case.poison(lengths.float() + (0.5 if case.chance(0.5) else 0.0), "response_lengths", p=0.5)
        case.bad.add("response_lengths")
    lengths = _unreadable(case, lengths, "response_lengths")
    rewards = case.poison(torch.randn(n, generator=case.gen), "rewards")
    if case.chance(0.05):
        rewards = torch.randn(n + 1, generator=case.gen)
        case.bad |= {"rewards", "response_lengths"}  # a length mismatch may be reported under either name
    case.note(
        f"n={n} lmax={lmax} buf={buf} factor={factor} schedule={schedule} lengths="
        f"{'meta' if lengths.is_meta else lengths.tolist()}"
    )

    def run() -> None:
        shaped = core.reward_overlong_penalty(rewards, lengths, lmax, buf, factor, schedule=schedule)
        assert torch.isfinite(shaped).all() and (shaped <= rewards + 1e-6).all()
        assert (shaped >= rewards - float(factor) - 1e-6).all()
        truncated = core.truncated_response_mask(lengths.long(), lmax)
        masked = core.mask_truncated_responses(torch.ones(n, 3, dtype=torch.bool), truncated)
        assert torch.equal(masked.any(1), ~truncated)

    return run
