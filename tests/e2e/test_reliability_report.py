"""The reliability checks that no other test runs, each once: the slow guards (changed re-runs, concurrent writers,
Ctrl-C), the refusals, and the loaders offered a planted pickle.

docs/reliability.md's table comes from the full run (``dapo-verl reliability``: the fuzz, stress and fault runs at
full size, then every check below); ``dapo-verl reliability --check`` says whether the table is current. The suite
runs each of those paths once at a smaller size instead (tests/property/test_fuzz.py, tests/unit/test_stress.py,
tests/e2e/test_faults.py, tests/e2e/test_determinism.py, tests/e2e/test_guards.py) rather than twice.
"""

from __future__ import annotations

import pytest

from tools.reliability.guards import GUARD_CHECKS
from tools.reliability.refusals import REFUSAL_CHECKS
from tools.reliability.report import safe_loading

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHECKS = {**GUARD_CHECKS, **REFUSAL_CHECKS}


@pytest.mark.parametrize(
    ("name", "tried"),
    [
        ("changed re-runs", 5),  # refused with the keys and the two ways forward, relabelling nothing
        ("concurrent writers", None),  # a second writer refused, a killed writer's lock taken over
        ("SIGINT", 3),  # Ctrl-C stops with a checkpoint; the run ends as if uninterrupted
        ("pre-flight refusals", 5),  # doctor, the dry run, rehearse and train refuse what a run refuses
        ("honest reports", 4),  # compare, prepare-data, re-runs and resumes never report ok over bad input
        ("silent changes", 4),  # deletions, a moved held-out split, inf inputs, bad schedules: refused
        ("edge errors", 5),  # a failed checkpoint write, toy --out, seeds, clip bounds, sampler contracts
    ],
)
def test_every_guard_held(tmp_path, name, tried):
    result = CHECKS[name](tmp_path)
    assert result.passed, result.problems
    assert result.held == result.tried > 0
    assert tried is None or result.tried == tried


def test_every_check_is_run_here_or_by_the_fast_suite():
    # test_guards.py runs the two quick guards; a check added to the table without a test fails here.
    here = {"changed re-runs", "concurrent writers", "SIGINT", *REFUSAL_CHECKS}
    assert set(CHECKS) == here | {"failed prepare-data", "damaged model cache"}


def test_no_loader_runs_a_planted_pickle(tmp_path):
    result = safe_loading(tmp_path)
    assert result.executed == 0 and result.refused == len(result.loaders) == 3, result
