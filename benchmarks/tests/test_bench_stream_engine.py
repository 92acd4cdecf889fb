"""bench_stream_engine's counting, on records written as a rehearsal writes them (no verl run)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_stream_engine import (
    STRATEGIES,
    declared_test,
    equal_budget_test,
    measured_cpu,
    step_rows,
    summarise,
    table,
    verdicts,
    write_unsolvable_rows,
)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_tokens_and_busy_time_are_counted_at_the_engine_per_weights_version(tmp_path):
    records = tmp_path / "engine"
    records.mkdir()
    # Step 1 answers with the initial weights (global step 0); step 2 with step 1's, including requests verl continued
    # after the weight update (they return only their new tokens); a request after the last step belongs to no step.
    _write(records / "requests-1.jsonl", [{"start": 0, "end": 2, "weights": 0, "tokens": 10}] * 6)
    _write(
        records / "requests-2.jsonl",
        [{"start": 5, "end": 6, "weights": 1, "tokens": 4}] * 4
        + [{"start": 5.5, "end": 7, "weights": 1, "tokens": 2}] * 2
        + [{"start": 9, "end": 9.5, "weights": 2, "tokens": 9}],
    )
    _write(
        tmp_path / "metrics.jsonl",
        [
            {"step": 1, "data": {"timing_s/gen": 3.0, "response_length/mean": 10.0}},
            {
                "step": 2,
                "data": {
                    "timing_s/gen": 2.5,
                    "response_length/mean": 4.5,
                    "dapo/sampler/gen_rounds": 0.0,
                    "dapo/sampler/aborted_tokens": 7.0,
                    "dapo/sampler/resumed_tokens": 3.0,
                },
            },
        ],
    )
    rows = step_rows(records, tmp_path / "metrics.jsonl", steps=2, responses_per_step=4)
    assert rows[0] == {
        "requests": 6,
        "tokens": 60,
        "trained_responses": 4,
        "trained_tokens": 40.0,
        "engine_busy_s": 2.0,
        "request_s": 12.0,
        "gen_time_s": 3.0,
    }
    assert rows[1] == {
        "requests": 6,
        "tokens": 20,
        "trained_responses": 4,
        "trained_tokens": 18.0,
        "engine_busy_s": 2.0,
        "request_s": 7.0,  # 4 requests of 1 s and 2 of 1.5 s, in 2 s of busy time: 3.5 in flight on average
        "gen_time_s": 2.5,
        "gen_rounds": 0.0,
        "aborted_tokens": 7.0,
        "resumed_tokens": 3.0,
    }


def test_a_run_is_summarised_over_its_streaming_steps_only():
    def row(tokens, busy, **extra):
        return {
            "requests": 6,
            "tokens": tokens,
            "trained_responses": 4,
            "trained_tokens": 10.0,
            "engine_busy_s": busy,
            "request_s": 3 * busy if tokens == 20 else 5 * busy,
            "gen_time_s": 1.0,
            **extra,
        }

    # Step 1 holds vLLM's warm-up; the last two settle (a checkpoint follows one, the run ends after the other).
    rows = [
        row(99, 9.0),
        row(20, 2.0, aborted_tokens=4.0),
        row(30, 4.0, aborted_tokens=2.0),
        row(99, 9.0),
        row(99, 9.0),
    ]
    summary = summarise(rows)
    assert summary["tokens_per_trained"] == pytest.approx(50 / 20) and summary["requests_per_trained"] == 1.5
    # the whole run: everything generated over everything trained, steps 1 to N
    assert summary["run_tokens_per_trained"] == pytest.approx((20 + 30 + 3 * 99) / 50)
    assert summary["run_requests_per_trained"] == 1.5
    assert summary["engine_busy_s"] == 3.0 and summary["aborted_tokens"] == 3.0
    assert summary["in_flight"] == pytest.approx((3 * 2.0 + 5 * 4.0) / 6.0)  # weighted by busy time, not by step


def test_unsolvable_rows_are_distinct_problems_whose_answers_the_stand_in_cannot_give(tmp_path):
    import pyarrow.parquet as pq

    from dapo_verl.rehearsal.stand_in import ANSWER_TOKENS

    rows = pq.read_table(write_unsolvable_rows(tmp_path / "u.parquet", 50, seed=0)).to_pylist()
    assert len({r["prompt"][0]["content"] for r in rows}) == 50
    answers = {r["reward_model"]["ground_truth"] for r in rows}
    assert answers <= {str(k) for k in range(3, 10)} and len(answers) > 3
    assert not answers & {token.rsplit(" ", 1)[1] for token in ANSWER_TOKENS}  # "1" and "2"


def test_a_step_verl_did_not_log_is_an_error_naming_the_log(tmp_path):
    (tmp_path / "engine").mkdir()
    _write(tmp_path / "metrics.jsonl", [{"step": 1, "data": {"timing_s/gen": 1.0, "response_length/mean": 2.0}}])
    with pytest.raises(RuntimeError, match=r"step 2 is missing from verl's log .*metrics\.jsonl"):
        step_rows(tmp_path / "engine", tmp_path / "metrics.jsonl", steps=2, responses_per_step=4)


def test_the_strategies_differ_only_in_entry_trainer_mode_and_sampler_keys():
    verl = {o for _, config, overrides in STRATEGIES.values() if config == "ppo_trainer" for o in overrides}
    for name, (_, config, overrides) in STRATEGIES.items():
        keys = [o.split("=")[0] for o in overrides]
        assert keys.count("trainer.v1.trainer_mode") == 1, name
        if config == "ppo_trainer":  # verl's own buffers, the same overrides but the mode
            assert set(overrides) - {o for o in overrides if o.startswith("trainer.v1.trainer_mode")} <= verl
        else:
            assert config == "dapo_trainer" and not any(k.startswith("trainer.v1.sampler") for k in keys), name
            assert all(
                k in ("trainer.v1.trainer_mode", "reward.reward_kwargs.overlong_tokens")
                or k.startswith("algorithm.filter_groups.")
                for k in keys
            ), name


def test_the_table_gives_each_strategys_busy_time_against_verl_sync_on_the_same_seeds():
    def run(seed, busy):
        return {"seed": seed, "engine_busy_s": busy}

    def entry(label, runs, **extra):
        summary = {
            k: {"mean": v, "sd": 0.0}
            for k, v in {
                "tokens_per_trained": 2.0,
                "requests_per_trained": 1.5,
                "engine_busy_s": 1.0,
                "gen_time_s": 3.0,
                **extra,
            }.items()
        }
        return {"label": label, "runs": runs, "summary": summary}

    result = {
        "strategies": {
            "verl_sync": entry("verl", [run(0, 2.0), run(1, 4.0)]),
            "dapo_stream_carry": entry(
                "ours", [run(0, 1.0), run(1, 1.0), run(2, 9.0)], aborted_tokens=30.0, resumed_tokens=12.0
            ),
        }
    }
    lines = table(result).splitlines()
    assert "| 1.00 | not logged |" in lines[2]
    assert "| 0.38 | 30 / 12 |" in lines[3]  # mean of 1/2 and 1/4; seed 2 has no verl_sync run to compare with


def _declared(busy: dict[str, list[float]], requests: dict[str, list[float]]) -> dict:
    return {
        "strategies": {
            name: {
                "runs": [
                    {"seed": seed, "engine_busy_s": b, "requests_per_trained": r, "tokens_per_trained": r}
                    for seed, (b, r) in enumerate(zip(busy[name], requests[name]))
                ]
            }
            for name in busy
        }
    }


def test_the_declared_test_pairs_by_seed_and_meets_the_bar_only_below_every_bound():
    busy = {
        "verl_sync": [3.0, 4.0, 5.0],
        "verl_async": [2.0, 2.5, 3.0],
        "dapo_stream_carry": [1.5, 2.0, 2.5],
        "dapo_rounds": [1.8, 2.4, 3.3],
    }
    requests = {
        "verl_sync": [2.6, 2.7, 2.8],
        "verl_async": [2.0, 2.1, 2.0],
        "dapo_stream_carry": [2.4, 2.5, 2.6],
        "dapo_rounds": [2.5, 2.6, 2.7],
    }
    report = declared_test(_declared(busy, requests))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines() if line.startswith("| ")}
    assert "| 0.50 [0.50, 0.50] |" in rows["dapo_stream_carry"]  # half of verl_sync's time on every seed
    assert "-0.50 [-0.50, -0.50]" in rows["dapo_stream_carry"]  # 0.5 s less than verl_async on every seed
    assert "dapo_stream_carry: meets the bar" in report
    assert "dapo_rounds: does not meet the bar" in report  # 0.60-0.66x verl_sync, but its interval crosses 0.67


def test_the_declared_test_needs_both_of_verls_buffers_on_two_seeds():
    one_seed = {"verl_sync": [3.0], "verl_async": [2.0], "dapo_rounds": [2.5]}
    with pytest.raises(ValueError, match="at least 2 seeds every strategy ran"):
        declared_test(_declared(one_seed, one_seed))
    without_async = {"verl_sync": [3.0, 3.1], "dapo_rounds": [2.5, 2.4]}
    with pytest.raises(ValueError, match="needs verl_sync and verl_async"):
        declared_test(_declared(without_async, without_async))


def _budgeted(arms: dict[str, tuple[float, list[float]]]) -> dict:
    """name -> (requests in flight, requests per trained on seeds 0, 1, 2, ...); tokens per trained alike."""
    return {
        "strategies": {
            name: {
                "runs": [
                    {
                        "seed": k,
                        "in_flight": flight,
                        "run_requests_per_trained": r,
                        "run_tokens_per_trained": r,
                        "engine_busy_s": 1.0,
                    }
                    for k, r in enumerate(counts)
                ]
            }
            for name, (flight, counts) in arms.items()
        }
    }


def _rows(report: str) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    name = ""
    for line in report.splitlines():
        if line.startswith("| ") and not line.startswith("| strategy"):
            name = line.split(" | ")[0].lstrip("| ").strip() or name
            rows.setdefault(name, []).append(line)
    return rows


def test_each_arm_is_judged_against_verls_setting_with_the_nearest_in_flight_budget():
    arms = {
        "verl_async": (20.0, [2.0, 2.1, 2.0]),
        "verl_async_warmup2": (30.0, [2.4, 2.5, 2.6]),
        "dapo_async_carry": (27.0, [2.45, 2.5, 2.6]),  # nearer warmup2's budget: judged against it, where it passes
        "dapo_async_rounds": (18.0, [2.6, 2.7, 2.8]),  # nearer verl's default: 0.6-0.7 more on every seed
    }
    rows = _rows(equal_budget_test(_budgeted(arms)))
    carry, rounds = rows["dapo_async_carry"], rows["dapo_async_rounds"]
    assert "verl_async_warmup2, seeds 0-2 (equal budget)" in carry[1] and carry[1].endswith("| **yes** |")
    assert "| verl_async, seeds 0-2 |" in carry[0] and carry[0].endswith(
        "| no |"
    )  # against the default budget it generates more
    assert "verl_async, seeds 0-2 (equal budget)" in rounds[0] and rounds[0].endswith("| **no** |")
    assert "+0.67 [" in rounds[0]


def test_no_more_than_verl_allows_the_declared_margin_and_no_more():
    verl = [2.0, 2.0, 2.0, 2.0]
    within = {
        "verl_async": (20.0, verl),
        "verl_async_warmup2": (40.0, verl),
        "dapo_async_carry": (21.0, [2.08, 2.09, 2.08, 2.09]),
    }
    assert _rows(equal_budget_test(_budgeted(within)))["dapo_async_carry"][0].endswith("| **yes** |")  # <= 5% of 2.0
    beyond = within | {"dapo_async_carry": (21.0, [2.10, 2.12, 2.11, 2.12])}
    assert _rows(equal_budget_test(_budgeted(beyond)))["dapo_async_carry"][0].endswith("| **no** |")


def test_each_arm_is_paired_with_each_verl_setting_on_the_seeds_both_ran():
    arms = _budgeted({"verl_async": (20.0, [2.0, 2.1, 2.0]), "dapo_async_rounds": (20.0, [2.6, 2.7])})
    alone = _budgeted({"verl_async_warmup2": (20.0, [2.0] * 6)})["strategies"]["verl_async_warmup2"]
    arms["strategies"]["verl_async_warmup2"] = {"runs": alone["runs"][5:]}  # seed 5 alone: no seed in common
    rows = _rows(equal_budget_test(arms))["dapo_async_rounds"]
    assert len(rows) == 1 and "verl_async, seeds 0-1 (equal budget)" in rows[0] and "+0.60 [" in rows[0]


def test_the_equal_budget_test_needs_an_arm_and_a_verl_setting_on_two_common_seeds():
    apart = {"verl_async": (20.0, [2.0, 2.1]), "dapo_async_carry": (20.0, [2.0])}
    with pytest.raises(ValueError, match="on 2 seeds both ran"):
        equal_budget_test(_budgeted(apart))
    assert verdicts(_budgeted(apart)) == []  # the report prints no test it cannot judge
    with pytest.raises(ValueError, match="needs one of verl_async"):
        equal_budget_test(_budgeted({"verl_async": (20.0, [2.0, 2.1]), "verl_sync": (20.0, [2.0, 2.1])}))
    together = apart | {"dapo_async_carry": (20.0, [2.0, 2.0])}
    assert len(verdicts(_budgeted(together))) == 1 and "equal budget" in verdicts(_budgeted(together))[0]


def test_the_cpu_profile_is_read_over_the_measured_steps_requests_only(tmp_path):
    records = tmp_path / "engine"
    records.mkdir()
    # 5 steps: steps 2 and 3 (weights 1 and 2) are measured; step 1's and step 4's requests fall outside the window
    _write(
        records / "requests-1.jsonl",
        [
            {"start": 1, "end": 2, "weights": 0, "tokens": 1},
            {"start": 10, "end": 12, "weights": 1, "tokens": 1},
            {"start": 20, "end": 23, "weights": 2, "tokens": 1},
            {"start": 30, "end": 31, "weights": 3, "tokens": 1},
        ],
    )
    profile = tmp_path / "cpu.jsonl"
    _write(
        profile,
        [
            {"t": t, "p": {"7": [cpu, "ray::AgentLoopWorkerTQ.x"]}}
            for t, cpu in ((1, 0.0), (10, 1.0), (23, 4.0), (31, 9.0))
        ],
    )
    assert measured_cpu(profile, records, steps=5) == {"agent_loop": 3.0}
    with pytest.raises(FileNotFoundError, match="without --reuse"):
        measured_cpu(tmp_path / "none.jsonl", records, steps=5)


def test_append_keeps_the_runs_already_in_the_result_and_runs_only_the_missing_ones(tmp_path, monkeypatch, capsys):
    import benchmarks.bench_stream_engine as bench

    made = []

    def fake_run(strategy, seed, args):  # the rehearsal itself is the e2e tests'; this checks the bookkeeping
        made.append((strategy, seed))
        return {"strategy": strategy, "seed": seed, "steps": [], "tokens_per_trained": 2.0, "in_flight": 9.0}

    monkeypatch.setattr(bench, "run_one", fake_run)
    monkeypatch.setattr(bench, "table", lambda result: "")
    out = tmp_path / "r.json"
    bench.main(["--seeds", "1", "--strategies", "verl_async", "--out", str(out)])
    result = bench.main(["--seeds", "1", "2", "--strategies", "verl_async", "--out", str(out), "--append"])
    assert made == [("verl_async", 1), ("verl_async", 2)]
    assert [r["seed"] for r in result["strategies"]["verl_async"]["runs"]] == [1, 2]
    assert all("commit" in r for r in result["strategies"]["verl_async"]["runs"])
    assert "verl_async seed 1: already in" in capsys.readouterr().err
    bench.main(["--seeds", "2", "--strategies", "verl_async", "--out", str(out)])  # without --append: a new result
    assert [r["seed"] for r in json.loads(out.read_text())["strategies"]["verl_async"]["runs"]] == [2]
