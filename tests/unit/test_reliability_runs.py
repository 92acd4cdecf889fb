"""Exact comparison of two runs' metrics and checkpoint states, as the reliability checks use it."""

from __future__ import annotations

import math

import torch

from tools.reliability.determinism import sampler_trace
from tools.reliability.runs import history_differences, metric_values, state_differences

HISTORY = [
    {"step": 0, "data": {"acc": 0.0, "timing_s/step": 1.0}},
    {"step": 1, "data": {"acc": 0.25, "loss": 0.1, "timing_s/step": 2.0}},
]


def test_one_ulp_in_one_metric_is_a_difference_and_timings_are_not():
    other = [{"step": r["step"], "data": dict(r["data"])} for r in HISTORY]
    other[1]["data"]["timing_s/step"] = 9.0
    assert history_differences(HISTORY, other) == []
    other[1]["data"]["loss"] = math.nextafter(0.1, 1.0)
    (line,) = history_differences(HISTORY, other)
    assert line.startswith("step 1: 1 metric(s) differ (loss: 0.1 != 0.10000000000000002")
    assert metric_values(HISTORY) == 3


def test_a_missing_step_or_key_is_a_difference():
    assert history_differences(HISTORY, HISTORY[:1])[0] == "steps [0] instead of [0, 1]"
    fewer = [HISTORY[0], {"step": 1, "data": {"acc": 0.25}}]
    assert "loss: 0.1 != missing" in history_differences(HISTORY, fewer)[0]


def test_state_differences_name_the_tensor_and_skip_the_config():
    state = {"model": {"w": torch.ones(3)}, "step": 4, "config": {"dir": "a"}, "ids": [1, 2]}
    same = {"model": {"w": torch.ones(3)}, "step": 4, "config": {"dir": "b"}, "ids": [1, 2]}
    assert state_differences(state, same) == (0.0, [])
    changed = {"model": {"w": torch.tensor([1.0, 1.5, 1.0])}, "step": 5, "config": {}, "ids": [1, 3]}
    worst, diffs = state_differences(state, changed)
    assert worst == 0.5
    assert diffs == ["state.ids[1]: 3 != 2", "state.model.w differs (max abs diff 0.5)", "state.step: 5 != 4"]


def test_the_simulated_sampler_repeats_itself_for_a_seed_and_not_across_seeds():
    a, b, c = sampler_trace(3, steps=30), sampler_trace(3, steps=30), sampler_trace(4, steps=30)
    assert a["history"] == b["history"] and a["batches"] == b["batches"]
    assert state_differences(a["state"], b["state"]) == (0.0, [])
    assert a["batches"] != c["batches"]


def test_quiet_run_logs_collects_info_from_a_module_logger_an_earlier_command_quietened():
    import logging

    from tools.reliability.runs import quiet_run_logs

    module = logging.getLogger("dapo_verl.local.train")
    saved = module.level
    module.setLevel(logging.ERROR)  # what ``dapo-verl ablate`` leaves behind in the same process
    try:
        records: list[logging.LogRecord] = []
        with quiet_run_logs(records):
            module.info("Resumed from step %d (%s).", 3, "somewhere")
        assert [r.getMessage() for r in records] == ["Resumed from step 3 (somewhere)."]
        assert module.level == logging.ERROR  # given back
    finally:
        module.setLevel(saved)
