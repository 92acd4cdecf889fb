"""The guards around a run's outputs hold when tried the way users trip them (tools.reliability.guards)."""

from __future__ import annotations

import pytest

from tools.reliability.guards import GUARD_CHECKS, damaged_model_cache, failed_prepare_data

pytestmark = pytest.mark.e2e


def _held(result):
    assert result.passed, result.problems
    assert result.held == result.tried > 0


def test_every_guard_check_has_a_row_in_the_reliability_table():
    from tools.reliability.refusals import REFUSAL_CHECKS
    from tools.reliability.report import _GUARD_ROWS

    assert set(GUARD_CHECKS) | set(REFUSAL_CHECKS) == set(_GUARD_ROWS)


def test_failed_prepare_data_leaves_earlier_outputs_and_inputs_alone(tmp_path):
    result = failed_prepare_data(tmp_path)
    _held(result)
    assert result.tried == 4


def test_a_damaged_model_cache_is_rebuilt_and_a_planted_pickle_never_runs(tmp_path):
    result = damaged_model_cache(tmp_path)
    _held(result)
    assert result.tried == 5


def test_the_cache_check_notices_when_verification_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr("dapo_verl.local.model.cache_problem", lambda path: None)
    result = damaged_model_cache(tmp_path)
    assert not result.passed
    assert any("loaded, not rebuilt" in p or "loading crashed" in p for p in result.problems)


# The slow guard checks (changed re-runs, concurrent writers, Ctrl-C) and the refusals:
# tests/e2e/test_reliability_report.py.
