"""calibrate's serving sweep: the closed loop it drives on the simulated engine, and how the table judges it."""

from __future__ import annotations

import pytest

from benchmarks.calibrate import SWEEP_PUBLISHED, report, serve, sweep_cost


def test_one_request_at_a_time_pays_its_prefill_then_decodes_its_tokens_alone():
    cost = sweep_cost(0.363e-3)
    alone = cost.prefill_time(1024) + cost.decode_time(1, 1024, 128)
    assert serve(1, cost) == pytest.approx(128 / alone)  # 20 requests one after the other: the rate of one


def test_requests_in_flight_share_the_weight_reads_but_never_more_than_multiply_the_rate():
    cost = sweep_cost(0.363e-3)
    one, two, eight = serve(1, cost), serve(2, cost), serve(8, cost)
    assert one < two < 2 * one and two < eight < 8 * one


def test_the_table_judges_both_published_sweep_figures_within_twenty_percent():
    def line(tpot_ms, gain):
        rates = {str(c): 100.0 * (gain if c == 8 else 1 + c / 100) for c in (1, 2, 4, 8)}
        rates["1"] = 100.0
        return {"test": "sweep", "t_sched": 0.363e-3, "tpot_c1_s": tpot_ms / 1e3, "output_tok_s": rates}

    inside = report([line(1e3 * SWEEP_PUBLISHED["tpot_c1_s"] * 1.19, 6.6 * 0.81)]).splitlines()
    assert [row.endswith("| yes |") for row in inside if "A100" in row and "predicted" in row] == [True, True]
    outside = report([line(1e3 * SWEEP_PUBLISHED["tpot_c1_s"] * 1.21, 6.6 * 0.79)]).splitlines()
    assert [row.endswith("| **no** |") for row in outside if "A100" in row and "predicted" in row] == [True, True]
