"""Local-backend benchmark: dynamic sampling's cost with real generation, against verl-recipe's sampler and TRL.

Run: ``.venv/bin/python -m benchmarks.bench_local`` (8 runs of 200 steps; about 10 minutes on 2 CPU cores
with ``--jobs 2``; ``--help``). Prints one JSON line per measurement (with commit, torch version and device):

* ``sampler_run`` -- one line per strategy and seed: ``dapo-verl train`` with the strategy's overrides for
  ``--steps`` steps (default 200, the default run's length), real generation by the tiny model. Strategies:
  ``recipe_barrier_discard`` (verl-recipe's sampler: ``refill=barrier``, ``surplus=discard``,
  ``data.gen_batch_size = 3 x train_batch_size = 48``, no skipping, no revisits) and ``default``
  (``dapo-verl train`` as shipped).
  The headline is ``generated_per_trained``, responses generated per response trained, over the whole run
  and over the late phase (``late``, steps 101-200: the policy has learned the task and almost every group
  is all-correct or all-wrong); ``early`` is steps 1-50 (most groups informative). Also: rounds per step,
  partial steps, prompts revisited, the final held-out accuracy, and the training time (``train_s``, the
  sum of ``timing_s/step``).
* ``default_run`` -- the speed of the first seed's ``default`` run, which starts from an empty model cache:
  wall time (model building included), training steps per second (``steps / sum(timing_s/step)``) and
  generated response tokens per second of generation time.
* ``sampler_comparison`` -- per strategy, the mean over seeds, and for ``default`` the ratios
  ``x_fewer_whole`` and ``x_fewer_late`` (recipe's generated per trained / ours, per seed, then averaged)
  and the accuracy difference.
* ``accuracy_test`` -- the science guard of every strategy but ``default`` and the recipe: its final held-out
  accuracy minus the default's, paired by seed (:func:`accuracy_test`).
* ``cost_test`` -- responses generated per trained of each of ours and each candidate minus the default's and each
  peer's, paired by seed (:func:`cost_test`).
* ``trl_grpo`` -- with ``--trl-python PATH`` (a separate virtual environment with TRL; see
  :mod:`benchmarks.trl_grpo`), TRL's GRPOTrainer on the same task, model and hyper-parameters, per seed;
  without it, one line saying it was skipped.

``--override KEY=VALUE`` (repeatable) changes the experiment of every run, e.g. ``local.task.heldout_size=9500``
trains on a pool of 500 prompts that each run revisits many times (the default pool of 9,800 is visited about once
in 200 steps). ``--merge FILE...`` runs nothing: it reads the ``sampler_run`` lines of earlier outputs (seeds run
in chunks, say) and prints the comparison and the tests over all of them.

The strategies change which groups are trained, so their training trajectories (and accuracies) differ;
that is why the comparison runs several seeds. Timings depend on the machine and on other load (parallel
jobs share the cores); counts and accuracies are exactly reproducible on one CPU machine (another machine may
give other trajectories: benchmarks/README.md), so compare strategies only within one measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.candidates import FOREIGN, foreign_sampler
from benchmarks.peers import PEERS

STRATEGIES: dict[str, list[str]] = {
    "recipe_barrier_discard": [
        "algorithm.filter_groups.refill=barrier",
        "algorithm.filter_groups.surplus=discard",
        "data.gen_batch_size=48",
        "algorithm.filter_groups.skip_uninformative=false",
        "algorithm.filter_groups.revisit_informative=false",
    ],
    "predicted": ["algorithm.filter_groups.prompt_selection=predicted"],
    "predicted_prefer": [
        "algorithm.filter_groups.prompt_selection=predicted",
        "algorithm.filter_groups.prefer_informative=true",
        "algorithm.filter_groups.explore_fraction=0.2",
    ],
    "greso": [],
    "mopps_math": [],
    "mopps_countdown": [],
    "logit_belief": [],
    "logit_lookahead": [],
    "oracle": [],
    "oracle_capped": [],
    "oracle_skip": [],
    "default": [],
}
"""Strategy -> overrides of the default experiment (its train_batch_size is 16, so 3 x 16 = 48). ``greso`` and
``mopps_*`` run the default experiment with that peer's prompt choice (:mod:`benchmarks.peers`); ``predicted``
chooses prompts by prediction (``prompt_selection=predicted``) and ``predicted_prefer`` also ranks known informative
prompts above fresh ones (``prefer_informative=true``); ``logit_belief`` and ``logit_lookahead`` are candidate
predictors kept out of the package (:mod:`benchmarks.candidates`), built into the default experiment's sampler the
way a peer's is; ``oracle``, ``oracle_capped`` and ``oracle_skip`` know every prompt's exact pass rate under the
current policy (:mod:`benchmarks.oracle`): bounds on what prediction can save, not strategies."""

RECIPE, OURS, PREDICTED = "recipe_barrier_discard", "default", "predicted"
ACCURACY_MARGIN = 0.05
"""The accuracy drop the guard is powered to detect: the held-out accuracy of ``predicted`` against ``default``,
paired by seed, final evaluation at step 200 (declared before the main run)."""
EARLY_STEPS = 50
ROOT = Path(__file__).resolve().parents[1]


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=ROOT
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _window(history: list[dict[str, Any]], first: int, last: float) -> dict[str, Any]:
    """Responses generated per trained, rounds, partial steps and keep rate over steps ``first..last``."""
    rows = [r["data"] for r in history if first <= r["step"] <= last and "timing_s/step" in r["data"]]

    def total(key: str) -> float:
        return sum(row.get(key) or 0.0 for row in rows)

    trained = total("dapo/sampler/responses_trained")
    steps = len(rows)
    return {
        "steps": f"{first}-{first + steps - 1}" if steps else None,
        "generated_per_trained": round(total("dapo/sampler/responses_generated") / trained, 3) if trained else None,
        "responses_generated": int(total("dapo/sampler/responses_generated")),
        "responses_trained": int(trained),
        "rounds_mean": round(total("dapo/sampler/gen_rounds") / steps, 3) if steps else None,
        "partial_steps": int(total("dapo/sampler/partial")),
        "mean_keep_rate": round(total("dapo/sampler/keep_rate") / steps, 4) if steps else None,
    }


def measure(history: list[dict[str, Any]], *, late_from: int) -> dict[str, Any]:
    """Whole-run, early (steps 1-50) and late (``late_from`` on) sampler costs of one run's metric history."""
    rows = [r["data"] for r in history if "timing_s/step" in r["data"]]
    whole = _window(history, 1, float("inf"))
    vals = [r["data"]["val-core/copy3/acc/mean@1"] for r in history if "val-core/copy3/acc/mean@1" in r["data"]]
    train_s = sum(row["timing_s/step"] for row in rows)
    gen_s = sum(row.get("timing_s/gen") or 0.0 for row in rows)
    return {
        **{k: v for k, v in whole.items() if k != "steps"},
        "steps": len(rows),
        "prompts_revisited": int(sum(row.get("dapo/sampler/prompts_revisited") or 0.0 for row in rows)),
        "prompts_skipped": int(rows[-1].get("dapo/sampler/prompts_skipped") or 0) if rows else 0,
        "predicted": bool(rows) and "dapo/sampler/predicted_keep_rate" in rows[-1],
        **{
            key: rows[-1].get(f"dapo/sampler/{key}") if rows else None
            for key in ("pool_trained_fraction", "pool_solved_fraction", "pool_failed_fraction")
        },
        "initial_accuracy": vals[0] if vals else None,
        "final_accuracy": vals[-1] if vals else None,
        "train_s": round(train_s, 2),
        "steps_per_s": round(len(rows) / train_s, 3) if train_s else None,
        "generated_tokens_per_s": round(sum(row.get("perf/generated_tokens") or 0.0 for row in rows) / gen_s, 1)
        if gen_s
        else None,
        "early": _window(history, 1, EARLY_STEPS),
        "late": _window(history, late_from, float("inf")),
    }


@contextlib.contextmanager
def _foreign_sampler(strategy: str) -> Iterator[None]:
    """For a peer or candidate strategy, the local trainer builds that strategy's sampler during the run (and its own
    after).

    The package has no hook for foreign selection rules, deliberately: a run directory records its config, and a
    peer is not part of it. So this benchmark swaps the one name the trainer builds its sampler with, for the
    length of one run without checkpoints.
    """
    if strategy not in FOREIGN:
        yield
        return
    import dapo_verl.local.train as train

    original = train.BatchReplenisher
    train.BatchReplenisher = lambda config, num_prompts, generate: foreign_sampler(  # type: ignore[misc,assignment]
        strategy, config, num_prompts, generate
    )
    try:
        yield
    finally:
        train.BatchReplenisher = original  # type: ignore[misc]


def _train(job: tuple[str, int, int, str, str, str, tuple[str, ...]]) -> dict[str, Any]:
    """One ``dapo-verl train`` run (in a worker process); returns its measurements."""
    from dapo_verl.local.train import run

    strategy, seed, steps, device, cache, out, overrides = job
    began = time.perf_counter()
    with _foreign_sampler(strategy):
        result = run(
            [
                f"local.device={device}",
                f"data.seed={seed}",
                "trainer.resume_mode=disable",
                "trainer.save_freq=-1",
                f"trainer.total_training_steps={steps}",
                f"local.cache_dir={cache}",
                *overrides,
                *STRATEGIES[strategy],
            ],
            out,
        )
    return {
        "strategy": strategy,
        "seed": seed,
        "wall_s": round(result.wall_s, 2),
        "process_s": round(time.perf_counter() - began, 2),
        "model_built": result.model_built,
        **measure(result.history, late_from=steps // 2 + 1),
    }


def summarize(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy: means over seeds; for ``default``, the per-seed ratios against the recipe, averaged."""
    out = []
    by = {(line["strategy"], line["seed"]): line for line in lines}
    for strategy in dict.fromkeys(line["strategy"] for line in lines):
        runs = [line for line in lines if line["strategy"] == strategy]

        def mean(values: list[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return round(statistics.fmean(known), 4) if known else None

        row = {
            "strategy": strategy,
            "seeds": [r["seed"] for r in runs],
            "generated_per_trained": mean([r["generated_per_trained"] for r in runs]),
            "late_generated_per_trained": mean([r["late"]["generated_per_trained"] for r in runs]),
            "early_generated_per_trained": mean([r["early"]["generated_per_trained"] for r in runs]),
            "rounds_mean": mean([r["rounds_mean"] for r in runs]),
            "partial_steps": mean([r["partial_steps"] for r in runs]),
            "final_accuracy": mean([r["final_accuracy"] for r in runs]),
            **{
                key: mean([r.get(key) for r in runs])
                for key in ("pool_trained_fraction", "pool_solved_fraction", "pool_failed_fraction")
            },
            "train_s": mean([r["train_s"] for r in runs]),
        }
        recipe = [by.get((RECIPE, r["seed"])) for r in runs]
        if strategy != RECIPE and all(recipe):
            row["x_fewer_whole"] = mean(
                [_ratio(b["generated_per_trained"], r["generated_per_trained"]) for b, r in zip(recipe, runs)]
            )  # type: ignore[index]
            row["x_fewer_late"] = mean(
                [
                    _ratio(b["late"]["generated_per_trained"], r["late"]["generated_per_trained"])
                    for b, r in zip(recipe, runs)
                ]
            )  # type: ignore[index]
            row["accuracy_minus_recipe"] = mean(
                [
                    r["final_accuracy"] - b["final_accuracy"]  # type: ignore[index]
                    for b, r in zip(recipe, runs)
                ]
            )
        out.append(row)
    return out


def _paired(
    lines: list[dict[str, Any]], field: str, treatment: str, baseline: str
) -> tuple[list[int], list[float]] | None:
    """The seeds both strategies ran and ``treatment``'s ``field`` minus ``baseline``'s on each; None unless there
    are at least 2 such seeds and every value is known."""
    by = {(line["strategy"], line["seed"]): line[field] for line in lines}
    seeds = sorted(seed for (strategy, seed) in by if strategy == treatment and (baseline, seed) in by)
    pairs = [(by[(treatment, seed)], by[(baseline, seed)]) for seed in seeds]
    if len(pairs) < 2 or any(a is None or b is None for a, b in pairs):
        return None
    return seeds, [a - b for a, b in pairs]


def accuracy_test(lines: list[dict[str, Any]], treatment: str = PREDICTED) -> dict[str, Any] | None:
    """The science guard: ``treatment`` minus ``default`` final held-out accuracy, paired by seed.

    Student's paired t-test, two-sided, with its 95% interval, and the seeds a test needs for 80% power against a
    drop of :data:`ACCURACY_MARGIN` at this spread (``seeds_for_power``). The reading is stated from the interval:
    no lower (its lower end above ``-ACCURACY_MARGIN``), lower (its upper end below 0), or undecided.
    None unless both strategies ran on at least 2 common seeds.
    """
    from dapo_verl.report.stats import paired_t_test, seeds_for_power

    paired = _paired(lines, "final_accuracy", treatment, OURS)
    if paired is None:
        return None
    seeds, differences = paired
    test = paired_t_test(differences)
    needed = seeds_for_power(ACCURACY_MARGIN, test.sd) if test.sd > 0 else 2
    if test.ci_low > -ACCURACY_MARGIN:
        reading = f"no lower: the 95% interval excludes a drop of {ACCURACY_MARGIN}"
    elif test.ci_high < 0:
        reading = "lower: the 95% interval lies below 0"
    else:
        reading = f"undecided: the 95% interval holds a drop of {ACCURACY_MARGIN}"
    return {
        "treatment": treatment,
        "baseline": OURS,
        "seeds": seeds,
        "metric": "final held-out accuracy (step 200)",
        "test": "Student's paired t-test, two-sided",
        **test.to_dict(),
        "margin": ACCURACY_MARGIN,
        "seeds_for_80pct_power": needed,
        "reading": reading,
    }


def cost_test(lines: list[dict[str, Any]], treatment: str, baseline: str) -> dict[str, Any] | None:
    """Responses generated per trained, ``treatment`` minus ``baseline``, paired by seed (Student's paired t-test,
    two-sided, 95% interval). None unless both ran on at least 2 common seeds."""
    from dapo_verl.report.stats import paired_t_test

    paired = _paired(lines, "generated_per_trained", treatment, baseline)
    if paired is None:
        return None
    seeds, differences = paired
    test = paired_t_test(differences)
    return {
        "treatment": treatment,
        "baseline": baseline,
        "seeds": seeds,
        "metric": "responses generated per trained, whole run",
        "test": "Student's paired t-test, two-sided",
        **test.to_dict(),
    }


def analyses(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The declared tests over ``sampler_run`` lines: the accuracy guard of every strategy but the default and the
    recipe, and the cost of each of ours and each candidate against the default and every peer."""
    strategies = list(dict.fromkeys(line["strategy"] for line in lines))
    out = []
    for treatment in strategies:
        if treatment in (OURS, RECIPE):
            continue
        guard = accuracy_test(lines, treatment)
        if guard is not None:
            out.append({"measurement": "accuracy_test", **guard})
    for treatment in strategies:
        if treatment in PEERS or treatment == RECIPE:
            continue
        for baseline in [name for name in (OURS, *PEERS) if name != treatment]:
            cost = cost_test(lines, treatment, baseline)
            if cost is not None:
                out.append({"measurement": "cost_test", **cost})
    return out


def _read_runs(paths: list[Path]) -> list[dict[str, Any]]:
    """The ``sampler_run`` lines of earlier outputs (JSON lines; anything else in them is passed over)."""
    runs = {}
    for path in paths:
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if not text.startswith("{"):
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as error:
                raise SystemExit(
                    f"{path}:{number}: not a JSON line ({error}); --merge reads this benchmark's "
                    "output, one JSON object per line."
                ) from error
            if line.get("measurement") == "sampler_run":
                key = (line["strategy"], line["seed"])
                if key in runs and runs[key] != line:
                    raise SystemExit(
                        f"{path}:{number}: strategy {key[0]!r} seed {key[1]} appears twice with "
                        "different results; merge outputs of one commit, each run once."
                    )
                runs[key] = line
    settings = {json.dumps(line.get("overrides", []), sort_keys=True) for line in runs.values()}
    if len(settings) > 1:
        raise SystemExit(
            f"--merge got runs made with different --override settings ({sorted(settings)}): their "
            "strategies are not comparable; merge one setting at a time."
        )
    if not runs:
        raise SystemExit(
            f"--merge found no sampler_run lines in {[str(p) for p in paths]}: pass files this benchmark printed."
        )
    return list(runs.values())


def _ratio(base: float | None, ours: float | None) -> float | None:
    return base / ours if base is not None and ours else None


def _trl(python: str, seed: int, steps: int, cache: Path) -> dict[str, Any]:
    """Run :mod:`benchmarks.trl_grpo` in another interpreter; its last output line is the JSON result."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [python, "-m", "benchmarks.trl_grpo", "--seed", str(seed), "--steps", str(steps), "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    if proc.returncode:
        return {"measurement": "trl_grpo", "seed": seed, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Run the measurements and print one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="local.device")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="data.seed of the runs")
    parser.add_argument("--steps", type=int, default=200, help="training steps per run (late phase: second half)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (counts are unaffected)")
    parser.add_argument("--trl-python", help="python of a virtual environment with TRL: add TRL GRPOTrainer rows")
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary directory)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every run, before the strategy's own (repeatable), e.g. "
        "local.task.heldout_size=9500 for a 500-prompt pool that each run revisits",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="run nothing: read the sampler_run lines of earlier outputs (e.g. seeds run in chunks) "
        "and print their comparison and tests",
    )
    args = parser.parse_args(argv)
    meta = {
        "benchmark": "bench_local",
        "commit": _commit(),
        "torch": torch.__version__,
        "device": args.device,
        "python": platform.python_version(),
        **({"overrides": args.override} if args.override else {}),
    }
    if args.merge:
        lines = _read_runs(args.merge)
        commits = sorted({line.get("commit", "unknown") for line in lines})
        merged = {
            **meta,
            "merged_from": [str(p) for p in args.merge],
            "run_commits": commits,
            "overrides": lines[0].get("overrides", []),
        }  # the runs' own (one setting: _read_runs checks)
        for row in [{"measurement": "sampler_comparison", **row} for row in summarize(lines)] + analyses(lines):
            print(json.dumps({**merged, **row}), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_local_") as tmp:
        root = args.out or Path(tmp)
        jobs = [
            (
                strategy,
                seed,
                args.steps,
                args.device,
                str(root / ("empty_cache" if (strategy, seed) == (OURS, args.seeds[0]) else "cache")),
                str(root / f"{strategy}_seed{seed}"),
                tuple(args.override),
            )
            for seed in args.seeds
            for strategy in args.strategies
        ]
        jobs.sort(key=lambda job: job[4].endswith("empty_cache"), reverse=True)  # the empty-cache run first
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                lines = list(pool.map(_train, jobs))
        else:
            lines = [_train(job) for job in jobs]
        for line in lines:
            print(json.dumps({**meta, "measurement": "sampler_run", **line}), flush=True)
            if (line["strategy"], line["seed"]) == (OURS, args.seeds[0]) and OURS in args.strategies:
                speed = {
                    k: line[k]
                    for k in (
                        "steps",
                        "wall_s",
                        "train_s",
                        "steps_per_s",
                        "generated_tokens_per_s",
                        "responses_generated",
                        "responses_trained",
                        "generated_per_trained",
                        "rounds_mean",
                        "partial_steps",
                        "initial_accuracy",
                        "final_accuracy",
                    )
                }
                print(json.dumps({**meta, "measurement": "default_run", "seed": line["seed"], **speed}), flush=True)
        for row in summarize(lines):
            print(json.dumps({**meta, "measurement": "sampler_comparison", **row}), flush=True)
        for row in analyses(lines):
            print(json.dumps({**meta, **row}), flush=True)
        if not args.trl_python:
            print(json.dumps({**meta, "measurement": "trl_grpo", "skipped": "no --trl-python given"}), flush=True)
            return 0
        for seed in args.seeds:
            print(json.dumps({**meta, **_trl(args.trl_python, seed, args.steps, root / "cache")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
