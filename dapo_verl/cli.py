"""``dapo-verl``: argument parsing and dispatch only; every command's work lives in its own module.

Every command runs under :func:`dapo_verl.lifetime.stop_signals`: SIGTERM and SIGHUP stop it as Ctrl-C does, with
every process it started, and it then exits with 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dapo_verl.cli_errors import fail as _fail
from dapo_verl.cli_errors import os_error as _os_error
from dapo_verl.cli_rehearse import add_rehearse
from dapo_verl.config import CONFIG_DIR
from dapo_verl.lifetime import Stopped, dying_with_this_process, signal_name, stop_signals

__all__ = ["main"]

DEFAULTS_YAML = CONFIG_DIR / "dapo_defaults.yaml"
REPOSITORY = Path(__file__).resolve().parent.parent  # a source checkout's root; site-packages in an installed wheel


def _run_repository_tool(command: str, module: str, arguments: Sequence[str]) -> int:
    """Run ``python -m <module>`` of the source checkout's ``tools/`` (checks and generators, which the installed
    package neither ships nor imports), in the checkout, as a child that stops with this command."""
    if not (REPOSITORY / "tools" / "__init__.py").is_file():
        return _fail(
            command,
            f"`dapo-verl {command}` runs the repository's own tools (tools/ beside dapo_verl/), "
            f"which the installed package does not ship. Run it in a source checkout: clone the "
            f"repository, `pip install -e .` there, and run the command from it.",
        )
    child = subprocess.Popen(dying_with_this_process([sys.executable, "-m", module, *arguments]), cwd=REPOSITORY)
    try:
        return child.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches the child too; SIGTERM and SIGHUP reach only this process
        child.terminate()
        child.wait()
        raise


def _cmd_prepare_data(args: argparse.Namespace) -> int:
    from dapo_verl.data import PrepareOptions, prepare_data, summary_lines

    given = {
        "dedup_key": args.dedup_key,
        "conflicts": args.conflicts,
        "aime_data_source": args.aime_data_source,
        "aime_repeat": args.aime_repeat,
    }
    try:
        options = PrepareOptions(**{name: value for name, value in given.items() if value is not None})
        prepared = prepare_data(out_dir=args.out, dapo_math=args.dapo_math, aime=args.aime, options=options)
    except OSError as err:
        return _fail("prepare-data", _os_error(err))
    except (ValueError, TypeError) as err:
        return _fail("prepare-data", err)
    print("\n".join(summary_lines(prepared)))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import logging

    from tqdm.contrib.logging import logging_redirect_tqdm

    from dapo_verl.local.compose import compose_run
    from dapo_verl.local.rundir import RunDirectoryBusy
    from dapo_verl.local.train import RunInterrupted, run_spec, summary_lines
    from dapo_verl.sampler import ShortfallError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("dapo_verl").setLevel(logging.INFO)
    try:
        spec = compose_run(args.overrides, out_dir=args.out)
        if args.print_config:
            print(spec.to_yaml(), end="")
            return 0
        with logging_redirect_tqdm():
            result = run_spec(spec, progress=True, allow_config_change=args.allow_config_change)
    except OSError as err:
        return _fail("train", _os_error(err, resumable=True))
    except (ValueError, ShortfallError, RunDirectoryBusy, RunInterrupted) as err:
        return _fail("train", err)
    print("\n".join(summary_lines(result)))
    return 0


def _cmd_toy(args: argparse.Namespace) -> int:
    from dapo_verl.toy import run_toy, summary_lines

    try:
        paths = run_toy(args.out)
    except OSError as err:
        return _fail("toy", _os_error(err))
    print("\n".join(summary_lines(paths["json"])))
    print(f"\nWrote {paths['json']} and {paths['png']}")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    if args.write or args.check:
        return _run_repository_tool("config", "tools.config_docs", ["--write" if args.write else "--check"])
    print(DEFAULTS_YAML.read_text(), end="")  # generated from dapo_verl/config.py, and shipped
    return 0


def _cmd_reliability(args: argparse.Namespace) -> int:
    flags = ["--write"] if args.write else ["--check"] if args.check else []
    return _run_repository_tool("reliability", "tools.reliability", flags)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from dapo_verl.doctor import config_checks, describe_run, run_checks

    checks = run_checks()
    plugin_ok = all(check.ok for check in checks)
    config_ok = True
    if args.config_name:
        from dapo_verl.rehearsal.run import RehearsalError

        try:
            found, config, entry = config_checks(args.config_name, args.overrides)
        except RehearsalError as err:
            return _fail("doctor", err)
        config_ok = all(check.ok for check in found)
        checks += found + (describe_run(config, entry) if config is not None and entry else [])
    for check in checks:
        print(f"{check.tag} {check.name}: {check.message}")
        if check.fix:
            print(f"       fix: {check.fix}")
    print("verl sees dapo_verl." if plugin_ok else "verl does not see dapo_verl; see the fixes above.")
    if args.config_name:
        failed = sum(not check.ok for check in checks if check.name == "config")
        print(
            f"{args.config_name} passes every check a run makes before it starts."
            if config_ok
            else f"{args.config_name} would be refused at start-up: {failed} problem(s) above, one per line."
        )
    return 0 if plugin_ok and config_ok else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    import logging

    from dapo_verl.local.ablation_report import check_compare_out
    from dapo_verl.report import build_report, group_runs

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = {"metrics": args.metrics} | ({"last_frac": args.last_frac} if args.last_frac is not None else {})
    try:
        check_compare_out(Path(args.out))
        report = build_report(group_runs(args.runs, args.label), args.out, **options)
    except OSError as err:
        return _fail("compare", _os_error(err))
    except ValueError as err:
        return _fail("compare", err)
    print(report.to_markdown(), end="")
    print(f"\nWrote {', '.join(str(path) for path in report.files.values())}")
    if report.warnings:  # listed once, in the report; stderr says so for a reader of the files only
        print(
            f'dapo-verl compare: {len(report.warnings)} warning(s), listed under "Warnings" in the report.',
            file=sys.stderr,
        )
    return 0


def _ablate_settings() -> str:
    """``--setting`` help: each study the CLI runs, with what it is (arms.py holds them as data)."""
    from dapo_verl.local.arms import SETTINGS  # data only: imports the standard library

    return "; ".join(f"'{name}' = {study.summary}" for name, study in SETTINGS.items())


def _setting_names() -> list[str]:
    from dapo_verl.local.arms import SETTINGS

    return list(SETTINGS)


def _cmd_ablate(args: argparse.Namespace) -> int:
    import logging

    from dapo_verl.local import ablate
    from dapo_verl.local.arms import LADDER_STUDY, SETTINGS
    from dapo_verl.local.rundir import RunDirectoryBusy
    from dapo_verl.local.train import RunInterrupted
    from dapo_verl.sampler import ShortfallError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ablate.QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.ladder and args.setting != "default":
        return _fail(
            "ablate",
            f"--setting {args.setting} is a setting of the clip ablation; the ladder runs the "
            "default setting only. Drop --ladder or --setting.",
        )
    study = LADDER_STUDY if args.ladder else SETTINGS[args.setting]
    if args.pool_with is not None and study.replicates is None:
        return _fail(
            "ablate",
            f"--pool-with {args.pool_with}: the study {study.name!r} replicates no other, so there "
            "is nothing to pool. Drop --pool-with, or run a replication (--setting clip-acts-replication).",
        )
    out = args.out or f"runs/ablate/{study.name}"
    jobs = ablate.DEFAULT_JOBS if args.jobs is None else args.jobs
    try:
        seeds = (
            study.power.main_seeds
            if study.power and args.seeds is None and args.seed_list is None
            else ablate.seed_list(args.seeds, args.seed_list, ablate.DEFAULT_SEEDS)
        )
        print(f"{study.title}: {len(study.arms)} arms x seeds {seeds} -> {out}", flush=True)
        result = ablate.run_ablation(
            study,
            seeds,
            out,
            steps=args.steps,
            extra_overrides=args.overrides,
            jobs=jobs,
            on_run=ablate.Progress(lambda line: print(line, flush=True), jobs=jobs),
            pool_with=None if args.pool_with is None else Path(args.pool_with),
        )
    except OSError as err:
        return _fail("ablate", _os_error(err, resumable=True))
    except (ValueError, ShortfallError, RunDirectoryBusy, RunInterrupted, ablate.AblationInterrupted) as err:
        return _fail("ablate", err)
    print()
    print(result.files["summary"].read_text(), end="")
    print(f"\nDone in {result.wall_s:.0f} s. Wrote {', '.join(str(p) for p in result.files.values())}")
    print(f"Run directories: {out}/<arm>/seed<k> (compare them again with `dapo-verl compare {out}/*/seed*`).")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapo-verl", description="DAPO for verl, plus a local backend.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser(
        "train",
        help="train a tiny model by DAPO on this machine (CPU is fine); writes metrics, plots, checkpoints",
        description="Compose configs/local.yaml with Hydra-style key=value overrides and train with the local backend.",
    )
    train.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, e.g. actor_rollout_ref.actor.clip_ratio_high=0.2 data.seed=1",
    )
    train.add_argument("--out", metavar="DIR", help="run directory (default: trainer.default_local_dir, runs/local)")
    train.add_argument("--print-config", action="store_true", help="print the composed config and exit")
    train.add_argument(
        "--allow-config-change",
        action="store_true",
        help="continue the run in --out although its "
        "configuration differs from this one (the change is recorded in its history.jsonl); without "
        "it such a run is refused",
    )
    train.set_defaults(func=_cmd_train)

    toy = commands.add_parser("toy", help="run the paper's exercises on the core math; writes JSON and a PNG plot")
    toy.add_argument("--out", default="runs/toy", help="output directory (default: runs/toy)")
    toy.set_defaults(func=_cmd_toy)

    prep = commands.add_parser(
        "prepare-data",
        help="convert local DAPO-Math-17k and AIME 2024 parquet files to "
        "verl's RL schema, deduplicated (nothing is downloaded)",
    )
    prep.add_argument(
        "--dapo-math",
        metavar="PATH",
        help="local copy of BytedTsinghua-SIA/DAPO-Math-17k data/dapo-math-17k.parquet; writes train.parquet",
    )
    prep.add_argument(
        "--aime",
        metavar="PATH",
        help="local AIME 2024 parquet (BytedTsinghua-SIA/AIME-2024, "
        "HuggingFaceH4/aime_2024 or Maxwell-Jia/AIME_2024); writes aime-2024.parquet",
    )
    prep.add_argument("--out", required=True, metavar="DIR", help="output folder (also gets prepare_data.json)")
    prep.add_argument(
        "--dedup-key", help="prompt (default; normalised problem text), uuid (extra_info.index) or prompt_answer"
    )
    prep.add_argument("--conflicts", help="keep (default) or drop the rows of a problem seen with different answers")
    prep.add_argument(
        "--aime-data-source",
        metavar="NAME",
        help="data_source of the AIME rows (default: aime-2024; must start with aime or be math_dapo)",
    )
    prep.add_argument(
        "--aime-repeat",
        type=int,
        metavar="N",
        help="also write aime-2024-xN.parquet, each problem N times (N <= 1024), for val_kwargs.n=1",
    )
    prep.set_defaults(func=_cmd_prepare_data)

    config = commands.add_parser("config", help="print the generated DAPO defaults (verl key paths)")
    mode = config.add_mutually_exclusive_group()
    mode.add_argument(
        "--write", action="store_true", help=f"regenerate {DEFAULTS_YAML.name} and docs/configuration.md's tables"
    )
    mode.add_argument("--check", action="store_true", help="fail if either is out of date")
    config.set_defaults(func=_cmd_config)

    reliability = commands.add_parser(
        "reliability",
        help="run the fuzzing, stress, crash-resume, safe-loading, "
        "determinism and output-guard checks; print the reliability table",
    )
    which = reliability.add_mutually_exclusive_group()
    which.add_argument("--write", action="store_true", help="write the table into docs/reliability.md")
    which.add_argument("--check", action="store_true", help="fail if docs/reliability.md's table differs")
    reliability.set_defaults(func=_cmd_reliability)

    add_rehearse(commands)

    doctor = commands.add_parser("doctor", help="check that verl sees the dapo loss, estimator and reward manager")
    doctor.add_argument(
        "config_name",
        nargs="?",
        metavar="CONFIG_NAME",
        help="also say which trainer, sampler, "
        "loss, estimator and reward manager this config runs (a config under configs/, or ppo_trainer)",
    )
    doctor.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="the config's Hydra overrides")
    doctor.set_defaults(func=_cmd_doctor)

    compare = commands.add_parser(
        "compare",
        help="compare runs (arms x seeds) from their metrics logs; writes report.md, report.json and plots",
        description="Summarise held-out accuracy, "
        "entropy, response length, clip fractions and sampler efficiency per arm. Each RUN "
        "is a run directory or log file: verl FileLogger JSONL (the local backend's "
        "metrics.jsonl), TensorBoard events, or verl console output saved to a file. "
        "Runs with the same label are seeds of one arm. Give the RUNs first.",
    )
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run directory or metrics log file")
    compare.add_argument(
        "--label",
        action="extend",
        nargs="+",
        metavar="NAME",
        help="one arm label per RUN, in "
        "order (default: from the path: arm/seedN -> arm, arm_seedN -> arm, metrics.jsonl -> its "
        "directory)",
    )
    compare.add_argument("--out", default="runs/compare", metavar="DIR", help="output folder (default: runs/compare)")
    compare.add_argument(
        "--metrics",
        action="extend",
        nargs="+",
        metavar="KEY",
        help="metric keys or glob patterns "
        "to report instead of the defaults, e.g. 'val-core/*/acc/mean@*' actor/entropy",
    )
    compare.add_argument(
        "--last-frac",
        type=float,
        metavar="F",
        help="share of a training metric's last logged "
        "values averaged into its final value (default: 0.2); validation metrics use the last value",
    )
    compare.set_defaults(func=_cmd_compare)

    ablate = commands.add_parser(
        "ablate",
        help="run the clip ablation (or --ladder) over several seeds on this machine and write the report",
        description="Train every arm of the clip-higher "
        "ablation (eps_high 0.2 vs 0.28) or, with --ladder, of the paper's Table 1 ladder, "
        "once per seed, with the local backend; then write report.md, report.json, "
        "ablation.md and plots. Two settings of the clip ablation: 'default' is the default "
        "local run, where the upper clip almost never binds (0.5% of tokens) and "
        "clip-higher has no measurable effect; 'clip-acts' starts from a warm start that "
        "makes the correct answers unlikely and takes 16 gradient steps per rollout, so the "
        "upper clip binds, logs pass@k and the clipped tokens' probability, and runs the "
        "powered paired test of its declared primary metric (docs/ablation.md). Runs "
        "already finished in --out are reused, interrupted ones continue. Give KEY=VALUE "
        "overrides before the options.",
    )
    ablate.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides applied to every arm, e.g. local.task.name=summod2",
    )
    ablate.add_argument(
        "--ladder",
        action="store_true",
        help="run the ladder: naive GRPO, + overlong filtering, "
        "+ clip-higher, + soft overlong punishment, + token-level loss, + dynamic sampling",
    )
    ablate.add_argument(
        "--setting",
        choices=_setting_names(),
        default="default",
        metavar="SETTING",
        help=f"the study (default: default): {_ablate_settings()}. A setting with a power "
        "calculation runs the seeds it gives, with the paired test of its declared primary metric "
        "(docs/ablation.md)",
    )
    ablate.add_argument(
        "--pool-with",
        metavar="DIR",
        help="for a replication (clip-acts-replication): the folder of "
        "the ablation it replicates (e.g. runs/ablate/clip-acts); the report shows its estimate, "
        "this one's, and both pooled",
    )
    seeds = ablate.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds",
        type=int,
        metavar="N",
        help="seeds 0..N-1 in every arm (default: 10, or the setting's seeds from its power calculation)",
    )
    seeds.add_argument("--seed-list", type=int, nargs="+", metavar="K", help="these seeds in every arm")
    ablate.add_argument(
        "--steps", type=int, metavar="N", help="training steps per run (default: the setting's, 200; clip-acts 40)"
    )
    ablate.add_argument(
        "--out",
        metavar="DIR",
        help="ablation directory (default: runs/ablate/<the study's name>: "
        "clip for the default setting, ladder for --ladder)",
    )
    ablate.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="runs trained at the same time, one torch thread each (default: 2; 1 trains in this process)",
    )
    ablate.set_defaults(func=_cmd_ablate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dapo-verl`` console script; 128 + the signal's number after SIGTERM or SIGHUP."""
    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    with stop_signals() as stop:
        try:
            status = func(args)
        except KeyboardInterrupt as err:
            after = (
                " A run continues from its last checkpoint when started again."
                if args.command in ("train", "ablate")
                else ""
            )
            how = f"stopped by {signal_name(err.signum)}" if isinstance(err, Stopped) else "interrupted by Ctrl-C"
            status = _fail(args.command, f"{how}.{after}")
        except Exception as err:
            if stop.signum is None:
                raise
            with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                _fail(args.command, err)
            status = 1
    return stop.exit_status(status)


if __name__ == "__main__":
    sys.exit(main())
