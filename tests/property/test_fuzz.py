"""Fuzzing of every public core function, the config entry point and the sampler's callback contract."""

from __future__ import annotations

import pytest

from dapo_verl.reliability.fuzz import FUZZ_TARGETS, run_fuzz


def _check(results, cases):
    assert [r.target for r in results] == list(FUZZ_TARGETS)
    for result in results:
        assert result.tried == cases
        assert result.correct + result.clear_errors == result.tried, result.failures[:5]
        assert result.correct > 0 and result.clear_errors > 0  # both paths are exercised
        assert result.slowest_s < 5.0  # no case hangs


def test_fuzz_quick():
    _check(run_fuzz(cases_per_target=120, seed=11), 120)


@pytest.mark.slow
def test_fuzz_full():
    _check(run_fuzz(cases_per_target=2000, seed=0), 2000)
