"""benchmarks.frontier: the clairvoyant bound generates nothing it does not train, and the frontier rule."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import bench_stream, frontier
from benchmarks.bench_stream import RooflineCost
from benchmarks.tests import test_bench_stream

TINY = dataclasses.replace(test_bench_stream.TINY, steps=4)


def test_the_clairvoyant_generates_exactly_the_informative_groups_it_trains():
    result = bench_stream.run(
        "clairvoyant",
        TINY,
        seed=3,
        cost=RooflineCost(replicas=2),
        warmup=1,
        echo=lambda line: None,
        driver=frontier.Clairvoyant,
    )
    assert result["tokens_per_trained"] == 1.0 and result["trained_tokens_per_step"] > 0
    # and it is faster than verl's sync buffer on the same draws, which generates groups it does not train
    sync = bench_stream.run("verl_sync", TINY, seed=3, cost=RooflineCost(replicas=2), warmup=1, echo=lambda line: None)
    assert sync["tokens_per_trained"] > 1.0


def _line(setting, seed, tokens, seconds):
    return {
        "setting": setting,
        "seed": seed,
        "tokens_per_trained": tokens,
        "gen_s_per_step": seconds,
        "running_per_replica": 100.0,
        "preemptions_per_step": 0.0,
    }


def test_a_setting_is_below_verls_frontier_only_when_faster_than_every_verl_setting_using_no_fewer_tokens():
    verl_a, verl_b = "verl_async(num_warmup_batches=1.0)", "verl_async(num_warmup_batches=2.0)"
    carry, default = "dapo_stream(carry, stream_oversample=1.0)", "dapo_rounds(discard) [default]"
    lines = []
    for seed, scale in ((1, 1.0), (2, 1.01), (3, 0.99)):
        lines += [
            _line(verl_a, seed, 1.9, 300 * scale),  # verl: 300 s at 1.9 tokens, 280 s at 2.5
            _line(verl_b, seed, 2.5, 280 * scale),
            _line(carry, seed, 2.0, 270 * scale),  # at 2.0 tokens verl's frontier is 300 s: 10% below
            _line(default, seed, 3.0, 270 * scale),  # at 3.0 it is 280 s: only 3.6% below
        ]
    table = frontier.report(lines)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert rows[carry].endswith("| yes |") and "0.900 [0.900, 0.900]" in rows[carry]
    assert rows[default].endswith("| no |")
    with pytest.raises(ValueError, match="at least one verl_async setting"):
        frontier.report([line for line in lines if not line["setting"].startswith("verl")])


def test_every_setting_runs_on_a_small_scenario():
    scenario = dataclasses.replace(TINY, steps=3)
    for name, (_, factory) in frontier.SETTINGS.items():
        result = bench_stream.run(
            name, scenario, seed=1, cost=RooflineCost(replicas=2), warmup=1, echo=lambda line: None, driver=factory
        )
        assert result["trained_tokens_per_step"] > 0 and 0 < result["running_per_replica"] <= scenario.max_num_seqs


def test_the_full_engine_rate_is_the_cap_or_the_cache_filled_at_the_mean_context():
    scenario, cost = TINY, RooflineCost(replicas=2)
    rate = frontier.full_engine_rate(scenario, cost, draws=2000)
    # TINY's cache (683K tokens) holds its 8 sequences, so each replica decodes 8 tokens an iteration
    one = cost.decode_time(8, 8 * 50, 1)
    assert 2 * 8 / (one * 1.5) < rate < 2 * 8 / one * 1.5
    # a cache just above one response (540 tokens) holds fewer than the 8 sequences the cap allows
    small_cache = dataclasses.replace(scenario, gpu_memory_utilization=0.24107)
    assert 528 < RooflineCost().kv_capacity(0.24107) < 560
    assert frontier.full_engine_rate(small_cache, cost, draws=2000) < rate
