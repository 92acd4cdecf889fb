"""``python -m tools.reliability [--write | --check]`` from the repository root (``dapo-verl reliability`` runs it):
run every reliability check, print the table, and write it into docs/reliability.md or check it is current."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.config_docs import update_generated_section
from tools.reliability.report import TABLE_END, TABLE_START, check_lines, environment_note, render_markdown, run_all

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every check passed (and, with ``--check``, the page's table is current)."""
    parser = argparse.ArgumentParser(prog="dapo-verl reliability", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--write", action="store_true", help="write the table into docs/reliability.md")
    which.add_argument("--check", action="store_true", help="fail if docs/reliability.md's table differs")
    args = parser.parse_args(argv)
    report = run_all()
    table = render_markdown(report)
    print(table)
    print(f"\n({environment_note()}; " + ", ".join(f"{k} {v:.0f} s" for k, v in report.seconds.items()) + ")")
    for line in check_lines(report):
        print(f"FAILED {line}")
    if args.write or args.check:
        current = PAGE.read_text()
        updated = update_generated_section(
            current, table, start_marker=TABLE_START, end_marker=TABLE_END, where=str(PAGE)
        )
        if args.write:
            PAGE.write_text(updated)
            print(f"Wrote the reliability table into {PAGE}")
        elif updated != current:
            print(
                f"{PAGE}'s reliability table differs from what the checks produce; run `dapo-verl reliability --write`."
            )
            return 1
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
