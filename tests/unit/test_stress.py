"""The replenisher under adversarial pass-rate phases: invariants after every step, bounded memory."""

from __future__ import annotations

from tools.reliability.stress import STRESS_CONFIGS, run_stress


def _check(results, steps):
    assert [r.name for r in results] == list(STRESS_CONFIGS)
    for result in results:
        assert result.steps == steps
        assert result.violations == []
        assert result.invariant_checks >= 5 * steps
    by_name = {r.name: r for r in results}
    assert by_name["adaptive + carry + skip, partial"].shortfall_errors == 0
    assert by_name["adaptive + carry + skip, partial"].partial_batches > 0  # hopeless phases were hit
    assert by_name["barrier + discard, error"].shortfall_errors > 0  # ... and raised under on_shortfall=error


def test_stress_quick():
    _check(run_stress(steps=240, steps_per_phase=30), 240)


# The 2000-step run is the reliability report's (`dapo-verl reliability`), not the suite's: the quick run above takes
# the same path.
