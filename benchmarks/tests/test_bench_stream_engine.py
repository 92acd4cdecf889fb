"""bench_stream_engine's counting, on records written as a rehearsal writes them (no verl run)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_stream_engine import (
    STRATEGIES,
    declared_test,
    measured_cpu,
    step_rows,
    summarise,
    table,
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
        "gen_time_s": 3.0,
    }
    assert rows[1] == {
        "requests": 6,
        "tokens": 20,
        "trained_responses": 4,
        "trained_tokens": 18.0,
        "engine_busy_s": 2.0,
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
    assert summary["engine_busy_s"] == 3.0 and summary["aborted_tokens"] == 3.0


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
