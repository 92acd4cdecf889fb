"""benchmarks.bench_stream: the cost model's exact sums, and every strategy on a small scenario."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import bench_stream
from benchmarks.bench_stream import STRATEGIES, RooflineCost, StreamScenario

TINY = StreamScenario(
    num_prompts=300,
    train_batch_size=8,
    group_size=4,
    steps=6,
    max_response_length=512,
    median_length=60.0,
    prompt_tokens=16,
    max_num_seqs=8,
)
"""A scenario every strategy runs in a second: 8 prompts x 4 responses a step on 2 replicas."""


def _naive(cost: RooflineCost, running: int, context: int, iterations: int) -> float:
    """One replica, one iteration at a time, straight from the formula."""
    total = 0.0
    bandwidth = cost.eta_bw * cost.gpu_bandwidth * cost.gpus_per_replica
    for j in range(iterations):
        memory = (2 * cost.params + cost.kv_bytes_per_token * (context + j * running)) / bandwidth
        compute = 2 * cost.params * running / (cost.eta_fl * cost.gpu_flops * cost.gpus_per_replica)
        total += max(memory, compute) + cost.t_sched
    return total


@settings(max_examples=60, deadline=None)
@given(
    running=st.integers(1, 2048),
    context=st.integers(0, 10**7),
    iterations=st.integers(0, 300),
    gpus=st.sampled_from([1, 2, 4, 8]),
)
def test_decode_time_is_the_exact_sum_of_its_iterations(running, context, iterations, gpus):
    cost = RooflineCost(gpus_per_replica=gpus)
    assert cost.decode_time(running, context, iterations) == pytest.approx(
        _naive(cost, running, context, iterations), rel=1e-9, abs=1e-12
    )


def test_decode_is_memory_bound_in_the_tail_and_compute_bound_past_the_ridge():
    cost = RooflineCost(replicas=1)
    one = cost.decode_time(1, 0, 1)  # weights only: 65 GB at 0.75 x 13.4 TB/s, plus scheduling
    assert one == pytest.approx(2 * 32.5e9 / (0.75 * 4 * 3.35e12) + cost.t_sched)
    # a full replica past the ridge costs more per iteration, but far less per token
    busy = cost.decode_time(2048, 0, 1)
    assert busy > one and busy / 2048 < one / 10


def test_the_kv_cache_is_what_vllm_may_take_less_the_weights_and_the_reserve():
    # 4 x (0.8 x 80 GB - 65 GB / 4 - 3 GB) / 262,144 bytes a token
    assert RooflineCost().kv_capacity(0.8) == int(4 * (64e9 - 16.25e9 - 3e9) / 262_144) == 682_830
    assert RooflineCost(gpu_memory=141e9).kv_capacity(0.8) > 2 * RooflineCost().kv_capacity(0.8)  # H200
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.2 leaves -3.2 GB per GPU .* raise it"):
        RooflineCost().kv_capacity(0.2)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_trains_full_batches_and_reports_its_metrics(strategy, capsys):
    scenario = dataclasses.replace(TINY, steps=6)
    result = bench_stream.run(strategy, scenario, seed=1, cost=RooflineCost(replicas=2), warmup=1, echo=print)
    assert result["steps"] == 5 and len(result["gen_s"]) == 5 and all(t > 0 for t in result["gen_s"])
    assert result["trained_tokens_per_step"] > 0 and result["tokens_per_trained"] >= 1.0
    oldest = {
        "verl_async": 7,
        "verl_async_warmup2": 7,
        "dapo_stream_carry": 1,
        "dapo_stream_carry_2x": 1,
        "dapo_rounds_carry": 1,
        "slime_april": 5,  # carried until served, however often aborted
    }.get(strategy, 0)  # 8-step spans
    assert 0 <= result["token_age_max"] <= oldest
    assert "step 6/6" in capsys.readouterr().out


def _item(born_step, tag):
    return (bench_stream.Request(tag, tag, born_step), tag)


def test_verls_selection_takes_the_oldest_step_first_and_draws_within_a_step():
    import random

    pool = [_item(2, i) for i in range(6)] + [_item(1, i) for i in range(6, 9)]
    chosen, rest = bench_stream.verl_selection(pool, 5, random.Random(0))
    assert sorted(tag for _, tag in chosen[:3]) == [6, 7, 8] and len(chosen) == 5  # step 1 before step 2
    assert sorted(tag for _, tag in chosen + rest) == list(range(9))  # nothing lost or repeated
    # Within a step the order is hash order in verl: every tied group is as likely to be trained, not the first.
    picks = [0] * 6
    for seed in range(600):
        chosen, _ = bench_stream.verl_selection(pool[:6], 2, random.Random(seed))
        for _, tag in chosen:
            picks[tag] += 1
    assert all(150 < count < 250 for count in picks), picks  # 200 each on average


def test_the_verl_sync_buffer_trains_a_draw_among_every_informative_group_drain_included(monkeypatch):
    scenario = dataclasses.replace(TINY, steps=4)
    offered = []
    real = bench_stream.verl_selection

    def spy(pool, size, rng):
        offered.append(len(pool))
        return real(pool, size, rng)

    monkeypatch.setattr(bench_stream, "verl_selection", spy)
    bench_stream.run("verl_sync", scenario, seed=1, cost=RooflineCost(replicas=2), warmup=1, echo=lambda line: None)
    assert len(offered) == 4 and all(n >= 8 for n in offered)
    assert max(offered) > 8  # groups that finished while the buffer drained were candidates too


def test_slime_keeps_a_batch_in_flight_or_accepted_and_april_carries_the_unfinished_groups_first(monkeypatch):
    scenario = dataclasses.replace(TINY, steps=3)
    for strategy, chunk in (("slime", 8), ("slime_april", 16)):
        engine = scenario.engine(1, RooflineCost(replicas=2))
        submitted = []
        real = engine.submit
        monkeypatch.setattr(
            engine,
            "submit",
            lambda requests, seen=submitted, real=real: (seen.append(list(requests)), real(requests))[1],
        )
        driver = bench_stream.DRIVERS[strategy](scenario, engine, 1)
        driver.step(1)
        assert all(len(chunk_) == chunk for chunk_ in submitted)  # --over-sampling-batch-size chunks
        carried = driver.buffer if strategy == "slime_april" else []
        assert (len(carried) > 0) == (strategy == "slime_april")
        submitted.clear()
        driver.step(2)
        resumed = [r for r in submitted[0] if r.resume is not None]
        assert [r.request_id for r in resumed] == [r.request_id for r, _ in carried][: len(resumed)]
        assert len(resumed) == min(len(carried), chunk)  # the buffer first


def test_verl_async_submits_its_warm_up_batches_once_at_the_start(monkeypatch):
    scenario = dataclasses.replace(TINY, steps=3)
    for warmup, first in ((1, 16), (1.5, 20), (2, 24)):  # warm-up batches (floored) plus the step's batch at step 1
        submitted = []
        engine = scenario.engine(1, RooflineCost(replicas=2))
        real = engine.submit
        monkeypatch.setattr(
            engine,
            "submit",
            lambda requests, seen=submitted, real=real: (seen.append(len(requests)), real(requests))[1],
        )
        driver = bench_stream.VerlColocateAsync(scenario, engine, 1, warmup_batches=warmup)
        driver.step(1)
        assert sum(submitted[:2]) == first and submitted[:2] == [8 * warmup, 8], submitted
        submitted.clear()
        driver.step(2)
        assert 8 in submitted and sum(submitted) < first + 8 * 4  # one batch a step after the first, plus refills


def test_the_command_line_appends_one_line_per_strategy_and_seed(tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    assert (
        bench_stream.main(
            [
                "--steps",
                "3",
                "--warmup",
                "1",
                "--seeds",
                "0",
                "--strategies",
                "verl_sync",
                "dapo_stream",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(line["strategy"], line["seed"]) for line in lines] == [("verl_sync", 0), ("dapo_stream", 0)]
    assert "s/step" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_stream.main(["--steps", "2", "--warmup", "2"])


def test_the_small_scenario_runs_four_prompts_a_step_and_the_report_refuses_mixed_scenarios(tmp_path):
    out = tmp_path / "small.jsonl"
    assert (
        bench_stream.main(
            [
                "--scenario",
                "small",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--seeds",
                "0",
                "--strategies",
                "verl_sync",
                "dapo_rounds_carry",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["scenario"]["train_batch_size"] for line in lines] == [4, 4]
    assert all(line["cost"]["replicas"] == 1 for line in lines)
    paper = dict(lines[0], scenario=dataclasses.asdict(StreamScenario()), seed=1)
    with pytest.raises(ValueError, match="2 different scenarios"):
        bench_stream.report([*lines, paper])


def _line(strategy, seed, time, tokens):
    """One run's line as bench_stream writes it, with the fields the report reads."""
    return {
        "strategy": strategy,
        "seed": seed,
        "gen_s_per_step": time,
        "tokens_per_trained": tokens,
        "waves_per_step": 1.0,
        "token_age_max": 0,
    }


def test_the_report_applies_the_declared_bar_to_each_candidate():
    lines = []
    for seed, jitter in enumerate((0.0, 1.0, -1.0)):
        lines += [
            _line("verl_sync", seed, 600 + jitter, 3.0),
            _line("verl_async", seed, 300 + jitter, 2.0),
            _line("dapo_stream", seed, 280 + jitter, 2.0),  # 0.47x sync, below async, fewer tokens
            _line("dapo_stream_carry", seed, 310 + 2 * jitter, 1.5),  # slower than async
            _line("dapo_stream_carry_2x", seed, 250 + jitter, 3.5),
        ]  # more tokens than sync
    text = bench_stream.report(lines)
    assert "seeds 0-2 (3)" in text and "| dapo_stream | 280.0 | 0.467 [" in text
    assert "dapo_stream: meets the bar" in text
    assert "dapo_stream_carry: does not meet the bar" in text and "dapo_stream_carry_2x: does not meet" in text
    with pytest.raises(ValueError, match="at least 2 seeds"):
        bench_stream.report(lines[:5])


def test_the_small_scenario_judges_every_dapo_configuration_on_tokens_alone():
    lines = []
    for seed, jitter in enumerate((0.0, 0.1, -0.1)):
        lines += [
            _line("verl_sync", seed, 15 + jitter, 2.0),
            _line("verl_async", seed, 5 + jitter, 1.4),
            _line("dapo_rounds", seed, 13 + jitter, 3.0 + jitter),  # more tokens than verl's sync buffer
            _line("dapo_rounds_carry", seed, 14 + jitter, 1.5 + jitter),
        ]  # fewer, though slower than async
    text = bench_stream.report(lines, "small")
    assert "dapo_rounds: does not meet the 4-prompt criterion" in text
    assert "dapo_rounds_carry: meets the 4-prompt criterion" in text
    assert "the bar" not in text.split("\n\n", 1)[1]


@pytest.mark.parametrize("driver", [bench_stream.VerlSync, bench_stream.VerlColocateAsync])
def test_verls_buffers_polling_every_two_seconds_decide_only_at_their_looks(driver):
    scenario = dataclasses.replace(TINY, steps=4)
    cost = RooflineCost(replicas=2)
    at_once = bench_stream.run("verl", scenario, 1, cost, warmup=1, echo=lambda line: None, driver=driver)
    polled = bench_stream.run(
        "verl",
        scenario,
        1,
        cost,
        warmup=1,
        echo=lambda line: None,
        driver=lambda s, e, seed: driver(s, e, seed, poll_s=2.0),
    )
    assert all(abs(t / 2.0 - round(t / 2.0)) < 1e-9 for t in polled["gen_s"])  # a step ends at a look
    assert bench_stream._informative([]) == []  # a look that finds nothing finished
    assert polled["gen_s_per_step"] > at_once["gen_s_per_step"]  # looks come late; the engine decodes meanwhile


def test_the_engine_run_until_a_time_returns_what_finished_by_then_and_nothing_later():
    engine = TINY.engine(1, RooflineCost(replicas=2))
    engine.submit([bench_stream.Request(i, i, 1) for i in range(1, 9)])
    first = engine.collect()  # the first group to finish, and when
    when = engine.clock
    engine2 = TINY.engine(1, RooflineCost(replicas=2))
    engine2.submit([bench_stream.Request(i, i, 1) for i in range(1, 9)])
    assert engine2.run_until(when * 0.999) == [] and engine2.clock == when * 0.999
    seen = engine2.run_until(when)
    assert [r.request_id for r, _ in seen] == [r.request_id for r, _ in first] and engine2.clock == when
