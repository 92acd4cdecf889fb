"""docs/reliability.md's table is what the checks produce now, and every check meets its target."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_verl.config_docs import update_generated_section
from dapo_verl.reliability.report import TABLE_END, TABLE_START, check_lines, render_markdown, run_all

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_reliability_table_matches_the_checks_ci_runs():
    report = run_all()
    assert report.passed, check_lines(report)
    page = PAGE.read_text()
    regenerated = update_generated_section(page, render_markdown(report), start_marker=TABLE_START,
                                           end_marker=TABLE_END)
    assert regenerated == page, "docs/reliability.md's table is stale: run `dapo-verl reliability --write`"
