"""``dapo-verl``: argument parsing and dispatch only; every command's work lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main"]

DEFAULTS_YAML = Path(__file__).parent / "configs" / "dapo_defaults.yaml"


def _cmd_toy(args: argparse.Namespace) -> int:
    from dapo_verl.toy import run_toy, summary_lines

    paths = run_toy(args.out)
    print("\n".join(summary_lines(paths["json"])))
    print(f"\nWrote {paths['json']} and {paths['png']}")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from dapo_verl.config import render_defaults_yaml

    text = render_defaults_yaml()
    if args.write:
        DEFAULTS_YAML.write_text(text)
        print(f"Wrote {DEFAULTS_YAML}")
        return 0
    if args.check:
        if DEFAULTS_YAML.read_text() != text:
            print(f"{DEFAULTS_YAML} is out of date with dapo_verl/config.py; run `dapo-verl config --write`.")
            return 1
        print(f"{DEFAULTS_YAML} matches dapo_verl/config.py.")
        return 0
    print(text, end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapo-verl", description="DAPO for verl, plus a local backend.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    toy = commands.add_parser("toy", help="run the paper's exercises on the core math; writes JSON and a PNG plot")
    toy.add_argument("--out", default="runs/toy", help="output directory (default: runs/toy)")
    toy.set_defaults(func=_cmd_toy)

    config = commands.add_parser("config", help="print the generated DAPO defaults (verl key paths)")
    mode = config.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"regenerate {DEFAULTS_YAML.name}")
    mode.add_argument("--check", action="store_true", help=f"fail if {DEFAULTS_YAML.name} is out of date")
    config.set_defaults(func=_cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dapo-verl`` console script."""
    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
