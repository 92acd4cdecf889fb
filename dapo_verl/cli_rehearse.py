"""``dapo-verl rehearse``: its arguments and what it prints (:mod:`dapo_verl.rehearsal.run` does the work)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dapo_verl.cli_errors import fail, os_error

__all__ = ["add_rehearse"]


def _cmd_rehearse(args: argparse.Namespace) -> int:
    from dapo_verl.preflight import ConfigRefused
    from dapo_verl.rehearsal.report import summary_lines
    from dapo_verl.rehearsal.run import RehearsalError, RehearsalOptions, rehearse

    options = RehearsalOptions(
        config_name=args.config_name,
        overrides=tuple(args.overrides),
        out_dir=Path(args.out),
        steps=args.steps,
        gpus=args.gpus,
        nodes=args.nodes,
        overwrite=args.overwrite,
        resume=args.resume,
        overlap=args.overlap_resume,
        engine=args.engine,
    )
    try:
        result = rehearse(options)
    except (RehearsalError, ConfigRefused) as err:
        return fail("rehearse", err)
    except OSError as err:  # an --out on a read-only or full disk
        return fail("rehearse", os_error(err))
    report = result.report
    assert report is not None  # rehearse() writes it before it returns
    print("\n".join(summary_lines(report)))
    return 0 if report["ok"] else 1


def add_rehearse(commands: Any) -> None:
    """Add the ``rehearse`` command to ``commands`` (argparse's sub-parsers)."""
    rehearse = commands.add_parser(
        "rehearse",
        help="run a recipe through verl's real trainer on this CPU machine (scale shrunk), with a "
        "checkpoint and a resume; writes a report",
        description="Compose CONFIG_NAME (a config under configs/, or "
        "verl's ppo_trainer) with the overrides, shrink only scale, hardware and engine keys (printed), and run "
        "verl's real trainer and workers in a private Ray cluster with verl's own vLLM rollout (when vLLM's CPU "
        'build is installed: pip install -e ".[rehearse]") or a CPU stand-in replica; then resume from the '
        "checkpoint before the last step. With --nodes N the cluster has N Ray nodes on this machine and each run is "
        "submitted through recipes/run_ray.sh (ray job submit). Give KEY=VALUE overrides before the options.",
    )
    rehearse.add_argument(
        "config_name",
        metavar="CONFIG_NAME",
        help="e.g. dapo_qwen2.5_32b, dapo_clip_ablation_eps_high_0.2, dapo_trainer, ppo_trainer",
    )
    rehearse.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="the recipe's Hydra overrides")
    rehearse.add_argument(
        "--out",
        default="runs/rehearse",
        metavar="DIR",
        help="output folder (default: "
        "runs/rehearse): data, model, each run's log, metrics.jsonl and checkpoints, report.md",
    )
    rehearse.add_argument(
        "--steps",
        type=int,
        default=3,
        metavar="N",
        help="training steps (default: 3; a checkpoint at N-1 is resumed by a second run)",
    )
    rehearse.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel worker processes per node, each a fake GPU on the CPU (default: 1)",
    )
    rehearse.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="Ray nodes (default: 1, the recipe's "
        "entry point with a Ray cluster of its own); N >= 2 starts a head and N-1 worker nodes on "
        "this machine and submits each run through recipes/run_ray.sh --follow",
    )
    rehearse.add_argument("--overwrite", action="store_true", help="replace an earlier rehearsal in --out")
    rehearse.add_argument(
        "--engine",
        choices=["vllm", "stand-in"],
        default=None,
        help="rollout engine (default: vllm when vLLM's CPU build is installed, else stand-in, "
        "announced): verl's own vLLM rollout, or the CPU replica of dapo_verl",
    )
    rehearse.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="resume from the checkpoint before the last step in a second run (default); --no-resume: the "
        "first run alone, a quicker check",
    )
    rehearse.add_argument(
        "--overlap-resume",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="start the resume run with the first (faster; about twice the memory: docs/rehearse.md, Memory)",
    )
    rehearse.add_argument("--sequential", dest="overlap_resume", action="store_false", help=argparse.SUPPRESS)
    rehearse.set_defaults(func=_cmd_rehearse)
