"""benchmarks/bench_local.py: one JSON line per measurement, with the fields the README tables read."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_local import STRATEGIES, main, measure, summarize


def test_benchmark_prints_one_json_line_per_measurement(capsys, tmp_path):
    assert main(["--seeds", "0", "--steps", "2", "--out", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = [line["measurement"] for line in lines]
    others = len(STRATEGIES) - 1
    assert kinds == (
        ["sampler_run", "default_run"]
        + ["sampler_run"] * others
        + ["sampler_comparison"] * len(STRATEGIES)
        + ["trl_grpo"]
    )  # the empty-cache default run first
    runs = [line for line in lines if line["measurement"] == "sampler_run"]
    assert sorted(line["strategy"] for line in runs) == sorted(STRATEGIES)
    by = {line["strategy"]: line for line in runs}
    # Each peer ran with its own prompt choice; only the predicted strategies (the candidates and oracles among them)
    # predict.
    assert sorted(name for name, line in by.items() if line["predicted"]) == [
        "logit_belief",
        "logit_lookahead",
        "oracle",
        "oracle_capped",
        "oracle_skip",
        "predicted",
        "predicted_prefer",
    ]
    assert by["mopps_math"]["prompts_skipped"] > 0 and by["greso"]["prompts_skipped"] == 0  # ranked vs first epoch
    for line in runs:
        assert {"commit", "torch", "device", "generated_per_trained", "late", "early", "final_accuracy"} <= set(line)
        assert line["steps"] == 2 and line["generated_per_trained"] >= 1.0
    default = next(line for line in lines if line["measurement"] == "default_run")
    assert {"steps_per_s", "generated_tokens_per_s", "wall_s"} <= set(default)
    comparison = {line["strategy"]: line for line in lines if line["measurement"] == "sampler_comparison"}
    assert {"x_fewer_whole", "x_fewer_late", "accuracy_minus_recipe"} <= set(comparison["default"])
    assert lines[-1] == {**lines[-1], "measurement": "trl_grpo", "skipped": "no --trl-python given"}


def _record(step, generated, trained, rounds=1.0, acc=None):
    data = {
        "timing_s/step": 0.1,
        "timing_s/gen": 0.05,
        "perf/generated_tokens": 10.0,
        "dapo/sampler/responses_generated": generated,
        "dapo/sampler/responses_trained": trained,
        "dapo/sampler/gen_rounds": rounds,
        "dapo/sampler/partial": float(trained < 16),
        "dapo/sampler/keep_rate": 0.5,
    }
    if acc is not None:
        data["val-core/copy3/acc/mean@1"] = acc
    return {"step": step, "data": data}


def test_windows_split_the_run_into_early_and_late_phases():
    history = [{"step": 0, "data": {"val-core/copy3/acc/mean@1": 0.0}}]
    history += [_record(s, 32.0, 16.0) for s in range(1, 51)] + [_record(s, 160.0, 8.0, 4.0) for s in range(51, 101)]
    history[-1]["data"]["val-core/copy3/acc/mean@1"] = 0.75
    result = measure(history, late_from=51)
    assert result["early"]["generated_per_trained"] == 2.0 and result["late"]["generated_per_trained"] == 20.0
    assert result["generated_per_trained"] == round((50 * 32 + 50 * 160) / (50 * 16 + 50 * 8), 3)
    assert result["late"]["partial_steps"] == 50 and result["late"]["rounds_mean"] == 4.0
    assert (result["initial_accuracy"], result["final_accuracy"]) == (0.0, 0.75)


def test_summary_ratios_are_per_seed_recipe_over_ours_then_averaged():
    def line(strategy, seed, whole, late, acc):
        return {
            "strategy": strategy,
            "seed": seed,
            "generated_per_trained": whole,
            "rounds_mean": 1.0,
            "partial_steps": 0,
            "final_accuracy": acc,
            "train_s": 1.0,
            "late": {"generated_per_trained": late},
            "early": {"generated_per_trained": 2.0},
        }

    rows = summarize(
        [
            line("recipe_barrier_discard", 0, 16.0, 100.0, 0.8),
            line("default", 0, 8.0, 25.0, 0.9),
            line("recipe_barrier_discard", 1, 12.0, 60.0, 0.9),
            line("default", 1, 12.0, 30.0, 0.9),
        ]
    )
    ours = next(row for row in rows if row["strategy"] == "default")
    assert ours["x_fewer_whole"] == 1.5 and ours["x_fewer_late"] == 3.0
    assert ours["accuracy_minus_recipe"] == 0.05


def test_the_accuracy_guard_pairs_seeds_and_reads_the_interval():
    from benchmarks.bench_local import ACCURACY_MARGIN, accuracy_test

    def lines(ours, previous):
        return [{"strategy": "predicted", "seed": s, "final_accuracy": a} for s, a in enumerate(ours)] + [
            {"strategy": "default", "seed": s, "final_accuracy": a} for s, a in enumerate(previous)
        ]

    same = accuracy_test(lines([0.80, 0.90, 0.85, 0.70], [0.81, 0.89, 0.86, 0.69]))
    assert same["seeds"] == [0, 1, 2, 3] and abs(same["mean"]) < 1e-12
    assert same["reading"].startswith("no lower") and same["ci_low"] > -ACCURACY_MARGIN
    lower = accuracy_test(lines([0.60, 0.70, 0.65, 0.50], [0.81, 0.89, 0.86, 0.69]))
    assert lower["reading"].startswith("lower") and lower["ci_high"] < 0
    noisy = accuracy_test(lines([0.90, 0.50, 0.85, 0.60], [0.60, 0.89, 0.56, 0.90]))
    assert noisy["reading"].startswith("undecided") and noisy["seeds_for_80pct_power"] > 4
    assert accuracy_test(lines([0.9], [0.8])) is None  # one pair: no test


def test_cost_tests_pair_seeds_against_the_default_and_every_peer(tmp_path, capsys):
    from benchmarks.bench_local import analyses, cost_test

    def line(strategy, seed, cost, acc):
        return {
            "measurement": "sampler_run",
            "strategy": strategy,
            "seed": seed,
            "generated_per_trained": cost,
            "final_accuracy": acc,
            "rounds_mean": 1.0,
            "partial_steps": 0,
            "train_s": 1.0,
            "late": {"generated_per_trained": cost * 5},
            "early": {"generated_per_trained": 2.0},
        }

    lines = [
        line(name, seed, cost + seed / 10, 0.8 + seed / 100)
        for name, cost in (("default", 5.0), ("greso", 5.5), ("logit_lookahead", 4.5), ("recipe_barrier_discard", 15.0))
        for seed in range(4)
    ]
    test = cost_test(lines, "logit_lookahead", "greso")
    assert test["seeds"] == [0, 1, 2, 3] and test["mean"] == pytest.approx(-1.0)
    assert cost_test(lines[:1] + lines[4:5], "default", "greso") is None  # one pair: no test
    done = {(row["measurement"], row["treatment"], row["baseline"]) for row in analyses(lines)}
    assert done == {
        ("accuracy_test", "greso", "default"),
        ("accuracy_test", "logit_lookahead", "default"),
        ("cost_test", "default", "greso"),
        ("cost_test", "logit_lookahead", "default"),
        ("cost_test", "logit_lookahead", "greso"),
    }  # peers and the recipe are baselines only

    # --merge reads chunks of seeds printed by earlier runs and tests them together.
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(json.dumps(x) for x in lines[::2]) + "\nnot json, a log line\n")
    second.write_text("\n".join(json.dumps(x) for x in lines[1::2]))
    assert main(["--merge", str(first), str(second)]) == 0
    merged = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    cost = next(
        x
        for x in merged
        if x["measurement"] == "cost_test" and x["baseline"] == "greso" and x["treatment"] == "logit_lookahead"
    )
    assert cost["seeds"] == [0, 1, 2, 3] and cost["mean"] == pytest.approx(-1.0)


def test_merge_refuses_a_run_reported_twice_with_different_results(tmp_path):
    run = {"measurement": "sampler_run", "strategy": "default", "seed": 0, "generated_per_trained": 5.0}
    path = tmp_path / "twice.jsonl"
    path.write_text(json.dumps(run) + "\n" + json.dumps({**run, "generated_per_trained": 6.0}) + "\n")
    with pytest.raises(SystemExit, match="strategy 'default' seed 0 appears twice"):
        main(["--merge", str(path)])
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit, match="found no sampler_run lines"):
        main(["--merge", str(tmp_path / "empty.jsonl")])


def test_overrides_change_every_run_and_are_recorded(capsys, tmp_path):
    assert (
        main(
            [
                "--seeds",
                "0",
                "--steps",
                "2",
                "--strategies",
                "default",
                "greso",
                "--out",
                str(tmp_path),
                "--override",
                "local.task.heldout_size=9500",
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = [line for line in lines if line["measurement"] == "sampler_run"]
    assert len(runs) == 2 and all(line["overrides"] == ["local.task.heldout_size=9500"] for line in runs)
    config = (tmp_path / "greso_seed0" / "config.yaml").read_text()  # the run directory records what ran
    assert "heldout_size: 9500" in config
    # Runs made with other overrides are not merged with these.
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(json.dumps(line) for line in runs))
    second.write_text(json.dumps({**runs[0], "strategy": "mopps_math", "overrides": []}))
    with pytest.raises(SystemExit, match="different --override settings"):
        main(["--merge", str(first), str(second)])
