"""bench_rehearsal_sampler's counting, on records written as a rehearsal writes them (no verl run)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_rehearsal_sampler import STRATEGIES, busy_seconds, step_counts


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_generated_responses_are_counted_at_the_engine_per_weights_version(tmp_path):
    records = tmp_path / "engine"
    records.mkdir()
    # Step 1 generates with the initial weights (global step 0), step 2 with step 1's; two server processes.
    _write(records / "requests-1.jsonl", [{"start": 0, "end": 1, "weights": 0, "tokens": 3}] * 24)
    _write(
        records / "requests-2.jsonl",
        [{"start": 5, "end": 6, "weights": 1, "tokens": 3}] * 16
        + [{"start": 9, "end": 9.5, "weights": 2, "tokens": 3}] * 4,
    )  # after the last step: no step's
    _write(
        tmp_path / "metrics.jsonl",
        [
            {"step": 1, "data": {"timing_s/gen": 7.0, "dapo/sampler/gen_rounds": 2.0}},
            {"step": 2, "data": {"timing_s/gen": 1.0, "train/filter_groups/evicted_samples": 3}},
        ],
    )
    rows = step_counts(records, tmp_path / "metrics.jsonl", steps=2, trained_per_step=16)
    assert rows == [
        {"generated": 24, "trained": 16, "rounds": 2.0, "evicted": 0, "gen_time_s": 7.0, "engine_busy_s": 1.0},
        {"generated": 16, "trained": 16, "rounds": None, "evicted": 3, "gen_time_s": 1.0, "engine_busy_s": 1.0},
    ]


def test_engine_busy_time_is_the_union_of_the_requests_in_flight():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 1), (0.5, 2), (3, 4)]) == 3.0  # overlapping requests count once; the gap not at all
    assert busy_seconds([(2, 5), (3, 4), (0, 1)]) == 4.0  # nested and out of order


def test_a_step_verl_did_not_log_is_an_error_naming_the_log(tmp_path):
    (tmp_path / "engine").mkdir()
    _write(tmp_path / "metrics.jsonl", [{"step": 1, "data": {"timing_s/gen": 1.0}}])
    with pytest.raises(RuntimeError, match=r"step 2 missing from verl's log .*metrics\.jsonl"):
        step_counts(tmp_path / "engine", tmp_path / "metrics.jsonl", steps=2, trained_per_step=4)


def test_the_strategies_differ_only_in_the_sampler():
    ours = set(STRATEGIES["dapo_replay_buffer"][1])
    assert STRATEGIES["verl_filter_groups"][1] == ()
    assert {k.split("=")[0] for k in ours} == {
        "trainer.v1.sampler.custom_sampler.path",
        "trainer.v1.sampler.custom_sampler.name",
        "trainer.checkpoint_callback_class",
    }
    assert set(STRATEGIES) == {"verl_filter_groups", "dapo_replay_buffer"}  # main_ppo refuses dapo_verl's own keys
