"""Planning the next step's first round (``BatchReplenisher.plan_next_round``) changes when it is generated, not what.

verl v1's ``separate_async`` mode generates while the trainer trains; the v1 buffer asks for the next step's
first round at the end of a step and submits it at once. These tests hold the sampler to its promise: with the
same generated groups, a replenisher that plans serves exactly the batches, metrics and state of one that does
not, across carry, skipping, revisits and a checkpoint taken while a plan is pending.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.config import SamplerConfig
from dapo_verl.sampler import BatchReplenisher, GroupResult
from dapo_verl.sampler.simulation import drifting_pass_rates
from dapo_verl.state_io import load_state, save_state


class _Outcomes:
    """Each group's outcome depends only on (prompt, step, occurrence): both samplers meet the same groups."""

    def __init__(self, seed: int, group_size: int = 4) -> None:
        self.rates = drifting_pass_rates(48, seed=seed, drift_per_step=0.08)
        self.seed, self.group_size, self.step = seed, group_size, 1
        self.seen: dict[tuple[int, int], int] = {}
        self.calls: list[list[int]] = []

    def __call__(self, prompt_ids):
        self.calls.append(list(prompt_ids))
        groups = []
        for pid in prompt_ids:
            occurrence = self.seen.get((pid, self.step), 0)
            self.seen[(pid, self.step)] = occurrence + 1
            gen = torch.Generator().manual_seed(hash((self.seed, pid, self.step, occurrence)) % 2**31)
            correct = (torch.rand(self.group_size, generator=gen) < self.rates(pid, self.step)).float()
            groups.append(
                GroupResult(
                    prompt_id=pid,
                    metric=correct,
                    response_lengths=torch.full((self.group_size,), 5),
                    truncated=torch.zeros(self.group_size, dtype=torch.bool),
                    payload=pid,
                )
            )
        return groups


def _config(**overrides) -> SamplerConfig:
    return SamplerConfig(**{"train_batch_size": 6, "seed": 2, "on_shortfall": "partial", **overrides})


CONFIGS = st.fixed_dictionaries(
    {
        "surplus": st.sampled_from(["discard", "carry"]),
        "refill": st.sampled_from(["adaptive", "barrier"]),
        "skip_uninformative": st.booleans(),
        "revisit_informative": st.booleans(),
        "max_oversample_factor": st.sampled_from([1.5, 4.0]),
        "max_staleness_steps": st.integers(1, 2),
    }
)


def _served(sampler: BatchReplenisher, outcomes: _Outcomes, steps: int, *, plans: list[list[int]] | None = None):
    served = []
    for step in range(1, steps + 1):
        outcomes.step = step
        batch = sampler.next_batch()
        served.append(([g.prompt_id for g in batch.groups], batch.metrics))
        if plans is not None and step < steps:
            plans.append(sampler.plan_next_round())
    return served


@settings(max_examples=25, deadline=None)
@given(config=CONFIGS, seed=st.integers(0, 50))
def test_planning_serves_exactly_what_not_planning_serves(config, seed):
    plain_outcomes, planned_outcomes = _Outcomes(seed), _Outcomes(seed)
    plain = BatchReplenisher(_config(**config), 48, plain_outcomes)
    planned = BatchReplenisher(_config(**config), 48, planned_outcomes)
    plans: list[list[int]] = []
    assert _served(planned, planned_outcomes, 8, plans=plans) == _served(plain, plain_outcomes, 8)
    assert planned_outcomes.calls == plain_outcomes.calls  # the same rounds, in the same order
    assert all(plan in planned_outcomes.calls for plan in plans if plan)  # [] when carried groups fill a step
    assert planned.conservation_gap() == 0


def test_a_plan_is_the_first_round_of_the_next_step_and_asking_twice_gives_the_same_plan():
    outcomes = _Outcomes(1)
    sampler = BatchReplenisher(_config(), 48, outcomes)
    sampler.next_batch()
    plan = sampler.plan_next_round()
    assert plan and sampler.plan_next_round() == plan
    rounds_so_far = len(outcomes.calls)
    outcomes.step = 2
    sampler.next_batch()
    assert outcomes.calls[rounds_so_far] == plan


def test_no_round_is_planned_when_carried_groups_fill_the_next_batch():
    outcomes = _Outcomes(3)
    sampler = BatchReplenisher(_config(surplus="carry", refill="barrier", gen_batch_size=40), 48, outcomes)
    sampler.next_batch()
    assert len(sampler.carried) >= 6
    assert sampler.plan_next_round() == []


def test_a_checkpoint_with_a_pending_plan_resumes_it(tmp_path):
    config = _config(surplus="carry", skip_uninformative=True, revisit_informative=True, max_oversample_factor=1.5)
    outcomes = _Outcomes(4)
    original = BatchReplenisher(config, 48, outcomes)
    for step in range(1, 4):
        outcomes.step = step
        original.next_batch()
    plan = original.plan_next_round()
    state = load_state(save_state(original.state_dict(), tmp_path / "sampler.safetensors"))
    resumed_outcomes = _Outcomes(4)
    resumed_outcomes.seen = dict(outcomes.seen)
    resumed = BatchReplenisher(config, 48, resumed_outcomes)
    resumed.load_state_dict(state)
    assert resumed.plan_next_round() == plan  # restored, not chosen again from an advanced stream
    for step in range(4, 7):
        outcomes.step = resumed_outcomes.step = step
        expected, actual = original.next_batch(), resumed.next_batch()
        assert [g.prompt_id for g in actual.groups] == [g.prompt_id for g in expected.groups]
        assert actual.metrics == expected.metrics
    assert resumed_outcomes.calls[0] == plan
