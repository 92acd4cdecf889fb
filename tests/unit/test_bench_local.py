"""benchmarks/bench_local.py: one JSON line per measurement, with the fields the README table reads."""

from __future__ import annotations

import json

from benchmarks.bench_local import STRATEGIES, main


def test_benchmark_prints_one_json_line_per_measurement(capsys, tmp_path):
    assert main(["--default-steps", "2", "--efficiency-steps", "2", "--out", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["measurement"] for line in lines] == ["default_run"] + ["sampler_efficiency"] * len(STRATEGIES)
    assert [line.get("strategy") for line in lines[1:]] == list(STRATEGIES)
    for line in lines:
        fields = {"commit", "torch", "device", "steps_per_s", "generated_tokens_per_s", "generated_per_trained"}
        assert fields <= set(line)
        assert line["steps"] == 2
        assert line["generated_per_trained"] >= 1.0
