"""Same seed, bit-identical metrics: the local backend and the sampler, each run twice (CPU)."""

from __future__ import annotations

import pytest

from tools.reliability.determinism import run_determinism

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_determinism(seed=0, steps=6, sampler_steps=100, work_dir=tmp_path_factory.mktemp("determinism"))


def test_the_same_seed_gives_bit_identical_local_runs(result):
    assert result.local_differences == []
    assert result.local_metric_values > 300  # 7 records of about 55 keys each


def test_the_same_seed_gives_bit_identical_sampler_runs(result):
    assert result.sampler_differences == []
    assert result.sampler_metric_values == 100 * 54  # 54 dapo/sampler/* metrics per step (streak selection)
    assert result.identical


def test_another_seed_changes_the_metrics_so_the_check_can_fail(result):
    assert result.local_other_seed_steps >= 6 and result.sampler_other_seed_steps > 90
    assert result.seed_sensitive


def test_it_is_measured_where_it_is_documented_to_hold(result):
    assert (result.device, result.num_threads) == ("cpu", 1)
