"""docs/reliability.md's table is what the checks produce now, and every check meets its target."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.config_docs import update_generated_section
from tools.reliability.report import TABLE_END, TABLE_START, check_lines, render_markdown, run_all

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def report():
    """One run of every check (about five minutes on 2 cores); the tests below read their parts of it."""
    return run_all()


def test_reliability_table_matches_the_checks_ci_runs(report):
    assert report.passed, check_lines(report)
    page = PAGE.read_text()
    regenerated = update_generated_section(
        page, render_markdown(report), start_marker=TABLE_START, end_marker=TABLE_END
    )
    assert regenerated == page, "docs/reliability.md's table is stale: run `dapo-verl reliability --write`"


def test_the_full_fuzz_run_meets_every_contract(report):
    from tests.property.test_fuzz import _check
    from tools.reliability.report import FUZZ_CASES_PER_TARGET

    _check(report.fuzz, FUZZ_CASES_PER_TARGET)  # run_fuzz(cases_per_target=2000, seed=0): the one full fuzz run


def test_the_long_stress_run_holds_every_invariant(report):
    from tests.unit.test_stress import _check
    from tools.reliability.report import STRESS_STEPS

    _check(report.stress, STRESS_STEPS)  # run_stress(steps=2000, steps_per_phase=100): the long stress run


def test_default_fault_injection_survives_every_fault(report):
    result = report.faults
    assert result.failures == []
    assert sum(result.injected.values()) == 12 and result.survived == result.injected
    assert result.lost_groups == result.duplicated_groups == 0 and result.corruptions_detected == 2
    assert 0 < result.recomputed_steps <= 2 * 2 * len(result.trials)  # save_freq=2, doubled by a skipped checkpoint


@pytest.mark.parametrize(
    ("name", "tried"),
    [
        ("changed re-runs", 5),  # refused with the keys and the two ways forward, relabelling nothing
        ("concurrent writers", None),  # a second writer refused, a killed writer's lock taken over
        ("SIGINT", 3),  # Ctrl-C stops with a checkpoint; the run ends as if uninterrupted
        ("failed prepare-data", 4),
        ("damaged model cache", 5),
        ("pre-flight refusals", 5),  # doctor, the dry run, rehearse and train refuse what a run refuses
        ("honest reports", 4),  # compare, prepare-data, re-runs and resumes never report ok over bad input
        ("silent changes", 4),  # deletions, a moved held-out split, inf inputs, bad schedules: refused
        ("edge errors", 5),  # a failed checkpoint write, toy --out, seeds, clip bounds, sampler contracts
    ],
)
def test_every_guard_held(report, name, tried):
    (result,) = [g for g in report.guards if g.name == name]
    assert result.passed, result.problems
    assert result.held == result.tried > 0
    assert tried is None or result.tried == tried
