"""The simulated engine's replicas: verl's router (least in flight, sticky) and vLLM's KV cache (admission,
recompute preemption of the last admitted). Each test fails on an engine without the mechanism it names."""

from __future__ import annotations

import itertools
import random

import pytest

from dapo_verl.sampler.engine import Request
from dapo_verl.sampler.simulated_engine import IterationCost, SimulatedEngine


class _Lengths:
    """Hands out the given response lengths in turn (the engine only calls ``draw``)."""

    def __init__(self, *lengths: int) -> None:
        self._next = itertools.cycle(lengths)

    def draw(self, prompt_id: int, seed: int, rng: random.Random) -> float:
        return float(next(self._next))


def _engine(*lengths: int, **shape) -> SimulatedEngine:
    options = {"group_size": 2, "max_response_length": 1000, "cost": IterationCost()} | shape
    return SimulatedEngine(lambda prompt_id, step: 0.5, lengths=_Lengths(*lengths), **options)


def _finish(engine: SimulatedEngine) -> list:
    done = []
    while engine._groups:
        done += engine.collect()
    return done


def test_the_router_spreads_a_groups_responses_over_the_replicas_with_the_fewest_in_flight():
    # Two replicas, one sequence each: the group's two responses decode side by side, not one after the other.
    engine = _engine(10, 10, replicas=2, max_running=1)
    engine.submit([Request(1, 1, 0)])
    assert [replica.inflight for replica in engine._replicas] == [1, 1]
    _finish(engine)
    assert engine.clock == 10  # one replica with both: 20
    # Four responses on three replicas: the fourth goes to one of the three with one in flight, drawn at random.
    picks = set()
    for seed in range(20):
        engine = _engine(5, replicas=3, group_size=4, seed=seed)
        engine.submit([Request(1, 1, 0)])
        loads = [replica.inflight for replica in engine._replicas]
        assert sorted(loads) == [1, 1, 2]
        picks.add(loads.index(2))
    assert picks == {0, 1, 2}


def test_a_resumed_response_goes_back_to_its_replica_whatever_the_load():
    engine = _engine(*[100] * 16, *[4] * 8, replicas=2, group_size=8, max_running=16)
    engine.submit([Request(1, 1, 0), Request(2, 2, 0), Request(3, 3, 0)])  # two long groups, then a short one
    assert [request.request_id for request, _ in engine.collect()] == [3]  # at iteration 4
    aborted = engine.abort()
    homes = {
        (request.request_id, index): r.replica
        for request, partial in aborted.partial
        for index, r in enumerate(partial.payload)
        if r.done < r.target
    }
    assert len(homes) == 16 and sorted(homes.values()) == [0] * 8 + [1] * 8
    engine.submit([Request(7, 7, 0)])  # new work first, spread by load
    engine.submit([Request(r.request_id, r.prompt_id, r.born_step, p) for r, p in aborted.partial])
    for request, _ in aborted.partial:
        group = engine._groups[request.request_id]
        for index, r in enumerate(group.responses):
            if (request.request_id, index) in homes:  # without sticky routing each would land by load: 1 in 2
                assert r.replica == homes[(request.request_id, index)]
                assert any(r is running for _, running in engine._replicas[r.replica].live.values())


def test_a_full_kv_cache_preempts_the_last_admitted_response_and_recomputes_it_later():
    # One replica holding 150 tokens; prompts of 10: two 100-token responses fit until their context reaches it.
    engine = _engine(100, 100, prompt_tokens=10, kv_capacity=150, max_response_length=100)
    engine.submit([Request(1, 1, 0)])
    _finish(engine)
    # Iteration k + 1 needs 20 + 2k + 2 <= 150 tokens: 65 iterations fit. The second (last admitted) then holds 65
    # tokens and waits until the first finishes at 100, is recomputed (prefill 10 + 65) and decodes its last 35.
    assert engine.preemptions == 1
    assert engine.clock == 135
    assert engine.prefill_tokens == 20 + 75
    assert engine.tokens_generated == 200  # every token decoded once; the recomputed ones are prefill
    unbounded = _engine(100, 100, prompt_tokens=10, max_response_length=100)
    unbounded.submit([Request(1, 1, 0)])
    _finish(unbounded)
    assert (unbounded.clock, unbounded.preemptions, unbounded.prefill_tokens) == (100, 0, 20)


def test_a_kv_cache_admits_a_newcomer_only_with_room_for_it_and_one_more_iteration():
    # 32 tokens: the first response (prompt 10) runs; the second needs 10 + 10 + 1 + 1 = 22 <= 32, so runs too;
    # the third would need 20 + 10 + 2 + 1 = 33 and waits until a response frees its cache.
    engine = _engine(20, group_size=3, prompt_tokens=10, kv_capacity=32, max_response_length=20)
    engine.submit([Request(1, 1, 0)])
    assert len(engine._replicas[0].live) == 2 and len(engine._replicas[0].waiting) == 1
    _finish(engine)
    assert engine.tokens_generated == 60 and engine.preemptions >= 1


def test_a_kv_cache_smaller_than_one_response_is_refused_naming_the_sizes():
    with pytest.raises(ValueError, match=r"kv_capacity=500.*prompt_tokens \+ max_response_length \(1010\)"):
        _engine(10, prompt_tokens=10, kv_capacity=500)


def test_single_response_requests_run_as_a_serving_benchmark_sends_them_and_an_empty_group_is_refused():
    # One response a request: two requests on one replica decode side by side, each a group of its own.
    engine = _engine(5, 8, group_size=1, max_running=4)
    engine.submit([Request(1, 1, 0), Request(2, 2, 0)])
    done = _finish(engine)
    assert [len(group.metric) for _, group in done] == [1, 1] and engine.clock == 8 and engine.tokens_generated == 13
    with pytest.raises(ValueError, match=r"group_size=0.*expected group_size >= 1"):
        _engine(5, group_size=0)


def test_an_aborted_payload_from_more_replicas_is_refused_on_resume():
    engine = _engine(50, replicas=3, group_size=3)
    engine.submit([Request(1, 1, 0)])
    ((_, partial),) = engine.abort().partial
    smaller = _engine(50, replicas=2, group_size=3)
    with pytest.raises(ValueError, match="routed to replica 2, but this engine has 2"):
        smaller.submit([Request(1, 1, 0, partial)])
