"""Soft overlong punishment, schedules and truncation masks."""

from __future__ import annotations

import pytest
import torch

from dapo_verl.core import (
    OVERLONG_SCHEDULES,
    get_overlong_schedule,
    mask_truncated_responses,
    overlong_penalty,
    reward_overlong_penalty,
    truncated_response_mask,
)
from dapo_verl.core.registry import Registry


def _paper(length, lmax, lbuf, factor):
    if length <= lmax - lbuf:
        return 0.0
    if length <= lmax:
        return ((lmax - lbuf) - length) / lbuf * factor
    return -factor


def test_linear_schedule_is_the_paper_formula():
    lengths = torch.arange(0, 31)
    penalty = overlong_penalty(lengths, 20, 8, 0.5)
    expected = torch.tensor([_paper(int(n), 20, 8, 0.5) for n in lengths])
    torch.testing.assert_close(penalty, expected)


def test_matches_verl_dapo_reward_manager_formula_up_to_the_limit():
    # verl: min(-(L - (Lmax - Lbuf)) / Lbuf * f, 0), identical for L <= Lmax
    for length in range(0, 21):
        verl_value = min(-(length - (20 - 4)) / 4 * 1.0, 0)
        assert float(overlong_penalty(torch.tensor([length]), 20, 4, 1.0)) == pytest.approx(verl_value)


def test_reward_shaping_adds_a_non_positive_term_and_leaves_input_alone():
    rewards = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    before = rewards.clone()
    shaped = reward_overlong_penalty(rewards, torch.tensor([5, 18, 40]), 20, 4, 1.0)
    assert torch.equal(rewards, before)
    assert shaped.dtype == torch.float64
    assert torch.all(shaped <= rewards)
    assert shaped.tolist() == pytest.approx([1.0, -1.5, 0.0])


def test_quadratic_schedule_is_gentler_inside_the_buffer():
    lengths = torch.tensor([18])
    linear = overlong_penalty(lengths, 20, 4, 1.0)
    quadratic = overlong_penalty(lengths, 20, 4, 1.0, schedule="quadratic")
    assert float(quadratic) == pytest.approx(-0.25)
    assert float(linear) == pytest.approx(-0.5)
    assert float(overlong_penalty(torch.tensor([20]), 20, 4, 1.0, schedule="quadratic")) == pytest.approx(-1.0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((20, 0, 1.0), "overlong_tokens=0 must be positive"),
        ((20, 30, 1.0), "overlong_tokens=30 exceeds max_response_length=20"),
        ((20, 4, -1.0), "overlong_penalty_factor=-1.0 must be >= 0.0"),
        ((0, 4, 1.0), "max_response_length=0 must be positive"),
    ],
)
def test_bad_settings_are_rejected(args, match):
    with pytest.raises(ValueError, match=match):
        reward_overlong_penalty(torch.zeros(2), torch.tensor([1, 2]), *args)


def test_bad_tensors_are_rejected():
    with pytest.raises(ValueError, match="pass one length per reward"):
        reward_overlong_penalty(torch.zeros(2), torch.tensor([1, 2, 3]), 20, 4, 1.0)
    with pytest.raises(ValueError, match="negative length"):
        overlong_penalty(torch.tensor([-1]), 20, 4, 1.0)
    with pytest.raises(ValueError, match="rewards contains NaN or inf"):
        reward_overlong_penalty(torch.tensor([float("nan")]), torch.tensor([1]), 20, 4, 1.0)


def test_unknown_schedule_lists_known_names_and_how_to_register():
    with pytest.raises(ValueError, match=r"Unknown overlong schedule 'quad'. Known: \['linear', 'quadratic'"):
        overlong_penalty(torch.tensor([1]), 20, 4, 1.0, schedule="quad")
    with pytest.raises(ValueError, match="register_overlong_schedule"):
        get_overlong_schedule("quad")


@pytest.fixture
def schedule_named(monkeypatch):
    """Register a schedule for one test; the registry is restored afterwards."""
    monkeypatch.setattr(OVERLONG_SCHEDULES, "_entries", dict(OVERLONG_SCHEDULES._entries))

    def register(name, function):
        OVERLONG_SCHEDULES.register(name, function)
        return name

    return register


@pytest.mark.parametrize(
    ("function", "words"),
    [
        (lambda x: x * float("nan"), "returned nan for buffer fraction 0"),
        (lambda x: 1.5 * x, "returned 1.5 for buffer fraction 1"),
        (lambda x: -x, "returned -0.5 for buffer fraction 0.5"),
        (lambda x: x + 0.1, r"returned 0\.1\d* for buffer fraction 0 "),  # a penalty before the buffer
        (lambda x: torch.full_like(x, float("inf")), "returned inf"),
    ],
)
def test_a_schedule_that_leaves_0_to_1_or_penalises_before_the_buffer_is_refused(schedule_named, function, words):
    name = schedule_named("mine", function)
    with pytest.raises(ValueError, match=rf"overlong schedule 'mine' {words}.*@register_overlong_schedule\('mine'\)"):
        reward_overlong_penalty(torch.ones(3), torch.tensor([5, 18, 30]), 20, 4, 1.0, schedule=name)


def test_a_schedule_must_return_one_value_per_response(schedule_named):
    name = schedule_named("summed", lambda x: x.sum())
    with pytest.raises(TypeError, match=r"overlong schedule 'summed' returned \(\) for buffer fractions of shape"):
        overlong_penalty(torch.tensor([5, 18]), 20, 4, 1.0, schedule=name)


def test_registry_rules():
    registry = Registry[object]("thing", "Register things.")
    marker = object()
    registry.register("a", marker)
    registry.register("a", marker)  # same object twice: no-op
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a", object())
    assert "linear" in OVERLONG_SCHEDULES


def test_truncation_mask_and_overlong_filter():
    truncated = truncated_response_mask(torch.tensor([3, 8, 8]), 8, eos_emitted=torch.tensor([True, False, True]))
    assert truncated.tolist() == [False, True, False]
    mask = torch.ones(3, 8, dtype=torch.bool)
    filtered = mask_truncated_responses(mask, truncated)
    assert filtered.dtype == torch.bool
    assert filtered.sum(dim=1).tolist() == [8, 0, 8]
    assert torch.all(mask)  # input untouched
    with pytest.raises(ValueError, match="truncated has 2 entries but mask has 3 rows"):
        mask_truncated_responses(mask, truncated[:2])


@pytest.mark.parametrize(
    "lengths",
    [
        torch.tensor([10.5, 17.25]),
        torch.tensor([10.0, 18.0]),
        torch.tensor([True, False]),
        torch.tensor([10.0, 18.0], dtype=torch.float64),
    ],
)
def test_lengths_must_be_integer_token_counts(lengths):
    for call in (
        lambda: reward_overlong_penalty(torch.ones(2), lengths, 20, 4, 1.0),
        lambda: overlong_penalty(lengths, 20, 4, 1.0),
        lambda: truncated_response_mask(lengths, 20),
    ):
        with pytest.raises(
            TypeError,
            match=rf"response_lengths has dtype {lengths.dtype} but must be an integer "
            r"dtype",
        ):
            call()


def test_meta_and_complex_tensors_are_refused_naming_the_argument():
    meta = "is a meta tensor .* a materialized CPU or GPU tensor is expected"
    with pytest.raises(ValueError, match=f"rewards {meta}"):
        reward_overlong_penalty(torch.empty(2, device="meta"), torch.tensor([5, 18]), 20, 4, 1.0)
    with pytest.raises(ValueError, match=f"response_lengths {meta}"):
        reward_overlong_penalty(torch.ones(2), torch.empty(2, dtype=torch.long, device="meta"), 20, 4, 1.0)
    with pytest.raises(TypeError, match=r"rewards has dtype torch.complex64 but must be real"):
        reward_overlong_penalty(torch.ones(2, dtype=torch.complex64), torch.tensor([5, 18]), 20, 4, 1.0)
    with pytest.raises(TypeError, match=r"response_lengths has dtype torch.complex64 but must be real"):
        overlong_penalty(torch.tensor([5, 18], dtype=torch.complex64), 20, 4, 1.0)
