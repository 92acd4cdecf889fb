"""benchmarks/bench_v1_sampler.py on a tiny scenario: every group accounted for, and the prefetched round of
separate_async overlapping training, over a real TransferQueue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("transfer_queue")

import ray
import transfer_queue as tq

from benchmarks.bench_sampler import Scenario
from benchmarks.bench_v1_sampler import check_targets, format_table, run_benchmark
from tools.verl_fakes.v1_rollout import clear_all, train_keys

pytestmark = pytest.mark.verl

N = 4  # responses per prompt (actor_rollout_ref.rollout.n)
TBS = 4  # data.train_batch_size


@pytest.fixture(scope="module")
def transfer_queue() -> Iterator[None]:
    """Ray with 8 logical CPUs (TQ's two actors take 2; a 2-core machine would leave none), then TQ."""
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False)
    tq.init()
    yield
    tq.close()
    if started_ray:
        ray.shutdown()


def test_bench_v1_sampler_accounts_for_every_group_on_a_tiny_scenario(transfer_queue):
    clear_all()
    tiny = Scenario(num_prompts=64, group_size=N, train_batch_size=TBS, steps=3)
    result = run_benchmark(tiny, seeds=[0], strategies=["verl_sync", "verl_async", "dapo_carry"])
    summaries = {name: entry["summary"] for name, entry in result["strategies"].items()}
    assert summaries["verl_sync"]["fewer_than_verl_sync"]["mean"] == 1.0
    for summary in summaries.values():
        assert summary["responses_trained"]["mean"] == 3 * TBS * N  # every step full (accounting checked inside)
        assert summary["generated_per_trained"]["mean"] >= 1.0 and summary["waves_mean"]["mean"] >= 0
    assert summaries["verl_sync"]["off_policy_share"]["mean"] == 0.0  # sync drains and discards
    assert set(check_targets(result)) == {"dapo_carry"}
    assert format_table(result).count("\n") == 2 + 3 - 1
    assert not train_keys()


def test_bench_v1_sampler_with_training_time_shows_the_prefetched_round_overlapping_it(transfer_queue):
    clear_all()
    tiny = Scenario(num_prompts=64, group_size=N, train_batch_size=TBS, steps=3)
    strategies = ["dapo_default", "dapo_separate"]  # verl's separate_async buffer: bench_v1_sampler --strategies
    result = run_benchmark(tiny, seeds=[0], strategies=strategies, train_budgets=1.0)
    summaries = {name: result["strategies"][name]["summary"] for name in strategies}
    for summary in summaries.values():
        assert summary["responses_trained"]["mean"] == 3 * TBS * N  # accounting is checked inside the run
    # A training step as long as the slowest generation: the prefetched round is finished when the next step samples,
    # so separate_async waits for less generation than the same buffer in sync mode, on groups one step old.
    assert summaries["dapo_separate"]["gen_time_mean"]["mean"] < summaries["dapo_default"]["gen_time_mean"]["mean"]
    assert (
        summaries["dapo_separate"]["off_policy_share"]["mean"]
        > 0
        == summaries["dapo_default"]["off_policy_share"]["mean"]
    )
    assert result["train_budgets"] == 1.0
    clear_all()
