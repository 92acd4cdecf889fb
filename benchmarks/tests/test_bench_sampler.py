"""The dynamic-sampling benchmark on tiny scenarios: output structure, conservation, the baselines' rules."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_sampler import STRATEGIES, Scenario, StreamingRefill, main, run_benchmark
from benchmarks.sampler_report import check_targets, format_table

TINY = Scenario(num_prompts=64, group_size=4, train_batch_size=8, steps=6)
ALL_MIXED = Scenario(
    num_prompts=64,
    group_size=16,
    train_batch_size=8,
    steps=3,
    start_logit_mean=0.0,
    start_logit_std=0.0,
    logit_gain=0.0,
)  # every pass rate 0.5: uniform groups are ~1 in 30000
HEADLINE = (
    "generated_per_trained",
    "oracle_share",
    "rounds_mean",
    "rounds_max",
    "multi_round_share",
    "gen_time_mean",
    "partial_steps",
    "shortfall_groups",
    "carried_share",
    "fewer_than_recipe",
)


def _dropped(metrics):
    return sum(v for k, v in metrics.items() if k.startswith("dropped_"))


@pytest.fixture(scope="module")
def tiny_result():
    return run_benchmark(TINY, seeds=[0, 1])


def test_every_strategy_reports_every_metric_per_seed_and_summarised(tiny_result):
    assert set(tiny_result["strategies"]) == set(STRATEGIES)
    assert set(tiny_result["outcome_shares"]["start"]) == {"mixed", "all_correct", "all_wrong"}
    for entry in tiny_result["strategies"].values():
        assert [m["seed"] for m in entry["per_seed"]] == [0, 1]
        for key in HEADLINE:
            assert set(entry["summary"][key]) == {"mean", "sd", "min", "max"}
            assert entry["summary"][key]["min"] <= entry["summary"][key]["mean"] <= entry["summary"][key]["max"]
        for metrics in entry["per_seed"]:
            assert metrics["oracle_share"] == pytest.approx(1 / metrics["generated_per_trained"])
            assert metrics["responses_trained"] == metrics["groups_trained"] * TINY.group_size
    recipe = tiny_result["strategies"]["recipe_barrier_discard"]["summary"]
    assert recipe["fewer_than_recipe"]["mean"] == pytest.approx(1.0)


def test_every_strategy_conserves_groups(tiny_result):
    for name, entry in tiny_result["strategies"].items():
        for m in entry["per_seed"]:
            assert m["groups_generated"] == m["groups_trained"] + m["groups_carried_at_end"] + _dropped(m), name
            assert m["groups_trained"] + m["shortfall_groups"] == TINY.steps * TINY.train_batch_size, name


def test_streaming_baseline_trains_or_drops_every_group_and_carries_none(tiny_result):
    for m in tiny_result["strategies"]["v1_streaming_discard"]["per_seed"]:
        assert m["groups_carried_at_end"] == 0 and m["carried_share"] == 0
        assert m["groups_generated"] == m["groups_trained"] + _dropped(m)
        assert m["dropped_all_correct"] + m["dropped_all_wrong"] > 0


def test_with_every_group_informative_the_recipe_pays_exactly_its_3x_round_and_streaming_nothing():
    result = run_benchmark(ALL_MIXED, seeds=[0], strategies=["recipe_barrier_discard", "v1_streaming_discard"])
    recipe = result["strategies"]["recipe_barrier_discard"]["per_seed"][0]
    streaming = result["strategies"]["v1_streaming_discard"]["per_seed"][0]
    assert recipe["generated_per_trained"] == 3.0 and recipe["rounds_mean"] == 1.0
    assert recipe["dropped_surplus"] == 2 * ALL_MIXED.train_batch_size * ALL_MIXED.steps
    assert streaming["generated_per_trained"] == 1.0 and streaming["rounds_mean"] == 1.0


class _BoundChecked(StreamingRefill):
    """Asserts verl v1's in-flight bound after every dispatch."""

    max_in_flight = 0

    def _dispatch(self, heap, now, waves):
        super()._dispatch(heap, now, waves)
        self.max_in_flight = max(self.max_in_flight, len(heap))


def test_streaming_refill_respects_the_in_flight_bound_and_drains_surplus():
    baseline = _BoundChecked(TINY, seed=3)
    for step in range(TINY.steps):
        baseline.run_step(step)
    assert baseline.max_in_flight == TINY.max_inflight_gen_batches * TINY.train_batch_size
    record = baseline.record
    assert record.dropped.get("surplus", 0) > 0  # requests still in flight when the batch filled
    assert max(record.rounds) >= 2 and record.conservation_gap() == 0


def test_streaming_on_hopeless_data_ends_each_step_partial_instead_of_looping():
    hopeless = Scenario(
        num_prompts=16,
        group_size=4,
        train_batch_size=4,
        steps=2,
        start_logit_mean=40.0,
        start_logit_std=0.0,
        logit_gain=0.0,
    )
    baseline = StreamingRefill(hopeless, seed=0)
    for step in range(hopeless.steps):
        baseline.run_step(step)
    assert baseline.record.partial_steps == 2 and baseline.record.groups_trained == 0
    assert baseline.record.conservation_gap() == 0


def test_main_prints_one_json_line_per_strategy_and_writes_the_result(tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(
        [
            "--seeds",
            "0",
            "--steps",
            "3",
            "--train-batch-size",
            "4",
            "--group-size",
            "4",
            "--num-prompts",
            "32",
            "--out",
            str(out),
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [line["measurement"] for line in lines] == list(STRATEGIES)
    for line in lines:
        assert {"commit", "torch", "device", "generated_per_trained", "rounds_mean", "sd"} <= set(line)
    saved = json.loads(out.read_text())
    assert saved["meta"]["device"] == "cpu" and set(saved["targets"]) == {"adaptive_carry", "adaptive_carry_skip"}
    assert set(saved["targets"]["adaptive_carry"]) == {"fewer_than_recipe", "rounds_mean"}
    assert check_targets(saved) == saved["targets"]


def test_table_has_one_row_per_strategy_with_mean_and_spread(tiny_result):
    rows = format_table(tiny_result).splitlines()
    assert len(rows) == 2 + len(STRATEGIES)
    assert all(row.count("|") == rows[0].count("|") for row in rows)
    assert "±" in rows[2] and rows[2].startswith("| verl-recipe")
    assert check_targets({"strategies": {"adaptive_carry": {"summary": {}}}}) == {}  # no recipe: no comparison


def test_a_learning_scenario_raises_exactly_the_trained_prompts_by_train_gain():
    import math

    rates = Scenario(num_prompts=8, steps=10, train_gain=0.8).pass_rates(seed=0)
    before = [rates(i, 3) for i in range(8)]
    rates.trained([2, 5, 5])  # prompt 5 twice in one batch: two groups, two gains

    def logit(p):
        return math.log(p / (1 - p))

    after = [rates(i, 3) for i in range(8)]
    assert logit(after[2]) - logit(before[2]) == pytest.approx(0.8)
    assert logit(after[5]) - logit(before[5]) == pytest.approx(1.6)
    assert [after[i] for i in (0, 1, 3, 4, 6, 7)] == [before[i] for i in (0, 1, 3, 4, 6, 7)]
    frozen = Scenario(num_prompts=8, steps=10).pass_rates(seed=0)
    frozen.trained([2])
    assert frozen(2, 3) == before[2]  # train_gain 0: the drifting rates, untouched


def test_in_a_learning_scenario_the_prompts_trained_become_solved_and_groups_are_conserved():
    learns = Scenario(num_prompts=64, group_size=4, train_batch_size=8, steps=12, logit_gain=0.0, train_gain=2.0)
    still = Scenario(num_prompts=64, group_size=4, train_batch_size=8, steps=12, logit_gain=0.0)
    strategies = ["recipe_barrier_discard", "v1_streaming_discard", "adaptive_skip_revisit", "predicted_prefer"]
    learned = run_benchmark(learns, seeds=[0], strategies=strategies)["strategies"]
    frozen = run_benchmark(still, seeds=[0], strategies=strategies)["strategies"]
    for name in strategies:
        m = learned[name]["per_seed"][0]
        assert m["groups_generated"] == m["groups_trained"] + m["groups_carried_at_end"] + _dropped(m), name
    # Same draws until the first trained batch, then the trained prompts turn all-correct more often.
    solved = sum(learned[name]["per_seed"][0]["dropped_all_correct"] for name in strategies)
    assert solved > sum(frozen[name]["per_seed"][0]["dropped_all_correct"] for name in strategies)
