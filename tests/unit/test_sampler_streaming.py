"""The batch replenisher on a streaming engine: top-ups, abort once the batch is full, carried aborted groups.

The engine is :class:`~dapo_verl.sampler.simulated_engine.SimulatedEngine`, which keeps the engine contract as
strictly as the replenisher checks it (it refuses a collect with nothing in flight and a request submitted twice,
and returns every unfinished group from abort with the tokens it holds), and counts the tokens it decodes on its
own, so the sampler's token accounting is checked against an independent count.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.config import SamplerConfig
from dapo_verl.core import dynamic_group_mask
from dapo_verl.sampler import BatchReplenisher, GroupResult
from dapo_verl.sampler.engine import Aborted, PartialGroup, Request, RoundEngine
from dapo_verl.sampler.simulated_engine import LongTailLengths, SimulatedEngine
from dapo_verl.sampler.simulation import SimulatedPolicy, drifting_pass_rates
from dapo_verl.state_io import load_state, save_state

P = "dapo/sampler/"


def _engine(seed=0, num_prompts=300, max_running=None, median=200.0, budget=1024, group_size=8, **shape):
    return SimulatedEngine(
        drifting_pass_rates(num_prompts, seed=seed),
        group_size=group_size,
        lengths=LongTailLengths(median),
        max_response_length=budget,
        max_running=max_running,
        seed=seed,
        **shape,
    )


def _sampler(engine, num_prompts=300, **overrides):
    config = SamplerConfig(**{"train_batch_size": 16, "seed": 0, "on_shortfall": "partial", **overrides})
    return BatchReplenisher(config, num_prompts, engine, codec=engine.codec)


def _run(sampler, engine, steps, first=1):
    batches = []
    for step in range(first, first + steps):
        engine.step = step
        batches.append(sampler.next_batch())
    return batches


class _Spy:
    """Records what the sampler submits, then passes it on."""

    streaming, resumes_partials, checks_groups = True, True, False

    def __init__(self, engine):
        self.engine, self.codec, self.submitted = engine, engine.codec, []

    def submit(self, requests):
        self.submitted.append(list(requests))
        self.engine.submit(requests)

    def collect(self):
        return self.engine.collect()

    def abort(self):
        return self.engine.abort()


@pytest.mark.parametrize("surplus", ["carry", "discard"])
def test_streaming_batches_are_full_informative_and_every_group_and_token_is_accounted_for(surplus):
    engine = _engine()
    sampler = _sampler(engine, surplus=surplus)
    for batch in _run(sampler, engine, 25):
        assert len(batch.groups) == 16 and bool(dynamic_group_mask(batch.stacked_metric()).all())
        assert sampler.conservation_gap() == 0
        assert not engine._groups  # nothing is left generating between steps: it was aborted
        m = batch.metrics
        assert m[P + "inflight_at_full"] == m[P + "aborted_groups"]  # the engine reports groups as they finish
    assert sampler.counters["response_tokens_generated"] == engine.tokens_generated  # counted once, independently
    assert sampler.counters["aborted_groups"] > 0
    if surplus == "discard":
        assert sampler.ledger.dropped_aborted["discarded"] == sampler.counters["aborted_groups"]
        assert sampler.counters["resumed_groups"] == 0 and not sampler.carried_aborted


def test_carried_aborted_groups_are_continued_first_oldest_first_and_count_only_their_new_tokens():
    spy = _Spy(_engine())
    sampler = _sampler(spy, surplus="carry")
    spy.engine.step = 1
    sampler.next_batch()
    carried = [(born, p.prompt_id, p.tokens) for born, p in sampler.carried_aborted]
    assert carried and all(born == 1 for born, _, _ in carried)
    spy.submitted.clear()
    spy.engine.step = 2
    second = sampler.next_batch()
    first_submission = spy.submitted[0]
    resumed = [(r.born_step, r.prompt_id, r.prefix_tokens) for r in first_submission if r.resume is not None]
    assert resumed == carried[: len(resumed)] and len(resumed) == second.metrics[P + "resumed_groups"] > 0
    assert all(r.resume is not None for r in first_submission)  # before any new prompt
    assert second.metrics[P + "resumed_tokens"] == sum(tokens for _, _, tokens in resumed)
    assert sampler.counters["response_tokens_generated"] == spy.engine.tokens_generated


@pytest.mark.parametrize("staleness", [1, 2])
def test_no_trained_token_is_older_than_max_staleness_steps(staleness):
    engine = _engine(median=400.0, budget=2048)
    sampler = _sampler(engine, surplus="carry", max_staleness_steps=staleness)
    ages = [b.metrics[P + "trained_token_age_max"] for b in _run(sampler, engine, 30)]
    assert 1 <= max(ages) <= staleness  # continued groups were trained, none older than the bound
    assert sampler.conservation_gap() == 0


def test_a_resumed_run_equals_the_uninterrupted_one_with_aborted_groups_carried(tmp_path):
    engine = _engine(seed=3)
    sampler = _sampler(engine, surplus="carry", seed=3)
    _run(sampler, engine, 6)
    assert sampler.carried_aborted  # the checkpoint holds partial responses
    path = save_state(sampler.state_dict(), tmp_path / "sampler.safetensors")
    expected = _run(sampler, engine, 6, first=7)

    engine_b = _engine(seed=3)
    resumed = _sampler(engine_b, surplus="carry", seed=3)
    resumed.load_state_dict(load_state(path))
    got = _run(resumed, engine_b, 6, first=7)
    for a, b in zip(expected, got):
        assert [g.prompt_id for g in a.groups] == [g.prompt_id for g in b.groups]
        assert a.metrics == b.metrics
    assert resumed.conservation_gap() == 0


def test_a_version_2_state_without_aborted_groups_still_loads(tmp_path):
    engine = _engine()
    sampler = _sampler(engine, surplus="carry")
    _run(sampler, engine, 2)
    state = sampler.state_dict()
    state["version"] = 2
    for key in ("carried_aborted", "dropped_aborted"):
        del state[key]
    for key in ("aborted_groups", "resumed_groups", "aborted_tokens"):
        del state["counters"][key]
    fresh = _sampler(_engine(), surplus="carry")
    fresh.load_state_dict(state)
    assert fresh.carried_aborted == [] and fresh.counters["aborted_groups"] == 0


def test_a_round_engine_is_the_callback_path_and_refuses_to_resume():
    policy_a, policy_b = (SimulatedPolicy(lambda i, s: 0.5, group_size=4, seed=1) for _ in range(2))
    config = SamplerConfig(train_batch_size=8, seed=1, surplus="carry")
    via_callback = BatchReplenisher(config, 64, policy_a)
    via_engine = BatchReplenisher(config, 64, RoundEngine(policy_b))
    for _ in range(5):
        a, b = via_callback.next_batch(), via_engine.next_batch()
        assert [g.prompt_id for g in a.groups] == [g.prompt_id for g in b.groups] and a.metrics == b.metrics
        assert a.metrics[P + "aborted_groups"] == 0 and a.metrics[P + "gen_rounds"] >= 1
    resume = Request(1, 0, 1, resume=PartialGroup(0, 5, 0, 4))
    with pytest.raises(ValueError, match="cannot continue one"):
        RoundEngine(policy_a).submit([resume])


class _Broken:
    """An engine that breaks one rule of the contract."""

    streaming, resumes_partials, checks_groups = True, True, False

    def __init__(self, rule):
        self.rule, self.requests = rule, []

    def submit(self, requests):
        self.requests.extend(requests)

    def collect(self):
        if self.rule == "silent":
            return []
        request = self.requests.pop(0)
        if self.rule == "stranger":
            request = dataclasses.replace(request, request_id=10_000)
        group = GroupResult(request.prompt_id, torch.tensor([1, 0]), torch.tensor([3, 4]), torch.tensor([False] * 2))
        return [(request, group)] * (2 if self.rule == "twice" else 1)

    def abort(self):
        return Aborted()  # forgets what is still in flight


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("silent", r"collect\(\) returned no group while \d+ are in flight; it must block"),
        ("stranger", r"reported a group for Request\(request_id=10000.*not in flight"),
        ("twice", r"not in flight \(or was returned before\)"),
        ("forgetful", r"abort\(\) left requests \[.*\] unaccounted for"),
    ],
)
def test_an_engine_that_breaks_the_contract_is_named_with_what_it_must_do(rule, message):
    sampler = BatchReplenisher(SamplerConfig(train_batch_size=2, gen_batch_size=4, seed=0), 50, _Broken(rule))
    with pytest.raises(ValueError, match=message):
        sampler.next_batch()


class _Undeclared:
    """The engine's three methods without the attributes the protocol declares."""

    streaming = True

    def submit(self, requests):
        raise AssertionError("never reached")

    collect = abort = submit


def test_an_engine_without_its_declared_attributes_is_refused_naming_them():
    with pytest.raises(
        TypeError, match=r"_Undeclared has submit/collect/abort but not resumes_partials, checks_groups"
    ):
        BatchReplenisher(SamplerConfig(train_batch_size=2, seed=0), 50, _Undeclared())


@pytest.mark.parametrize("staleness", [1, 2])
def test_fresh_carried_counts_what_the_next_step_takes_from_carry(staleness):
    # Finished surplus only (a round engine): each step takes the fresh carried groups first, up to the batch.
    sampler, served = (
        BatchReplenisher(
            SamplerConfig(
                train_batch_size=4,
                gen_batch_size=12,
                refill="barrier",
                surplus="carry",
                max_staleness_steps=staleness,
                seed=0,
            ),
            200,
            lambda ids: [
                GroupResult(i, torch.tensor([1.0, 0.0]), torch.tensor([3, 4]), torch.tensor([False, False]))
                for i in ids
            ],
        ),
        [],
    )
    for _ in range(6):
        fresh = sampler.fresh_carried(sampler.train_steps + 1)
        batch = sampler.next_batch()
        served.append(fresh)
        assert batch.metrics[P + "groups_from_carry"] == min(fresh, 4)
    assert max(served) > 4  # more carried than one batch takes: the count is not the batch size
    assert sampler.fresh_carried(sampler.train_steps + staleness + 1) == 0  # every group born by now is stale then


@settings(max_examples=25, deadline=None)
@given(
    surplus=st.sampled_from(["carry", "discard"]),
    batch=st.integers(1, 12),
    group=st.integers(2, 6),
    running=st.one_of(st.none(), st.integers(1, 64)),
    median=st.floats(5.0, 300.0),
    staleness=st.integers(1, 3),
    seed=st.integers(0, 1000),
    replicas=st.integers(1, 4),
    kv=st.one_of(st.none(), st.integers(257, 3000)),
)
def test_streaming_accounting_is_conserved_for_any_engine_shape(
    surplus, batch, group, running, median, staleness, seed, replicas, kv
):
    engine = _engine(
        seed=seed,
        num_prompts=80,
        max_running=running,
        median=median,
        budget=256,
        group_size=group,
        replicas=replicas,
        kv_capacity=kv,
    )
    sampler = _sampler(
        engine, num_prompts=80, train_batch_size=batch, surplus=surplus, max_staleness_steps=staleness, seed=seed
    )
    for step_batch in _run(sampler, engine, 6):
        assert len(step_batch.groups) == batch or step_batch.is_partial
        assert step_batch.metrics[P + "trained_token_age_max"] <= staleness
        assert sampler.conservation_gap() == 0 and not engine._groups
    assert sampler.counters["response_tokens_generated"] == engine.tokens_generated


def test_stream_oversample_keeps_more_in_flight_on_a_streaming_engine_only():
    spies = {}
    for factor in (1.0, 2.0):
        spies[factor] = _Spy(_engine())
        sampler = _sampler(spies[factor], surplus="carry", stream_oversample=factor)
        spies[factor].engine.step = 1
        sampler.next_batch()
    first = {factor: len(spy.submitted[0]) for factor, spy in spies.items()}
    assert first[1.0] == 16 and first[2.0] == 32  # before any keep rate: one round of gen_batch_size, or twice that
    batches = []
    for factor in (1.0, 2.0):  # a round engine generates rounds: the factor does not apply
        policy = SimulatedPolicy(lambda i, s: 0.5, group_size=4, seed=0)
        sampler = BatchReplenisher(SamplerConfig(train_batch_size=8, stream_oversample=factor), 64, policy)
        batches.append([sampler.next_batch() for _ in range(3)])
    for a, b in zip(*batches):
        assert [g.prompt_id for g in a.groups] == [g.prompt_id for g in b.groups] and a.metrics == b.metrics


def test_stream_oversample_below_one_is_refused_with_the_key_and_the_fix():
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups\.stream_oversample.*0\.5.*1\.0 keeps one round"):
        SamplerConfig(stream_oversample=0.5)


def test_a_settled_step_continues_every_carried_aborted_group_and_leaves_nothing_in_flight():
    # What a backend asks for before a checkpoint its engine's partial groups cannot outlive (verl v1 colocate_async).
    engine = _engine()
    sampler = _sampler(engine, surplus="carry", stream_oversample=2.0)
    _run(sampler, engine, 2)
    fresh = sum(born == 2 for born, _ in sampler.carried_aborted)  # those born at step 1 are stale at step 3
    assert fresh > 0
    engine.step = 3
    settled = sampler.next_batch(settle=True)
    assert settled.metrics[P + "resumed_groups"] == fresh  # every one still fresh, not just a round's worth
    assert settled.metrics[P + "aborted_groups"] == 0 and not sampler.carried_aborted and not engine._groups
    assert settled.metrics[P + "inflight_at_full"] > 0  # there was something to wait for
    assert len(settled.groups) == 16 and sampler.conservation_gap() == 0
    assert sampler.counters["response_tokens_generated"] == engine.tokens_generated


class _NoResume(_Spy):
    """An engine that cannot continue an aborted group (verl's sync client)."""

    resumes_partials = False


def test_aborted_groups_of_an_engine_that_cannot_continue_them_are_discarded_even_with_carry():
    spy = _NoResume(_engine())
    sampler = _sampler(spy, surplus="carry")
    batches = _run(sampler, spy.engine, 3)
    aborted = sum(b.metrics[P + "aborted_groups"] for b in batches)
    assert aborted > 0 and sampler.ledger.dropped_aborted["discarded"] == aborted
    assert not sampler.carried_aborted and sampler.counters["resumed_groups"] == 0
    assert all(r.resume is None for submitted in spy.submitted for r in submitted)
    assert sampler.conservation_gap() == 0
