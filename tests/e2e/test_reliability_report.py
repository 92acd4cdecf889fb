"""README.md's reliability table is what the checks produce now, and every check meets its target."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_verl.config_docs import update_readme
from dapo_verl.reliability.report import README_END, README_START, check_lines, render_markdown, run_all

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_reliability_table_matches_the_checks_ci_runs():
    report = run_all()
    assert report.passed, check_lines(report)
    readme = README.read_text()
    regenerated = update_readme(readme, render_markdown(report), start_marker=README_START, end_marker=README_END)
    assert regenerated == readme, "README.md's reliability table is stale: run `dapo-verl reliability --write`"
