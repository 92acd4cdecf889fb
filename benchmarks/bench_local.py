"""Local-backend benchmark: speed of the default run, and dynamic sampling's cost with real generation.

Run: ``.venv/bin/python -m benchmarks.bench_local`` (about 2-3 minutes on 2 CPU cores; ``--help``).
Prints one JSON line per measurement (with commit, torch version and device):

* ``default_run`` -- ``dapo-verl train`` with no overrides, from an empty model cache: wall time (model
  building included), training steps per second (``steps / sum(timing_s/step)``), generated response
  tokens per second of generation time (``sum(perf/generated_tokens) / sum(timing_s/gen)``), and the
  held-out accuracy before and after.
* ``sampler_efficiency`` -- the same experiment for ``--efficiency-steps`` steps under three sampler
  strategies, same seed, real generation by the tiny model: ``recipe_barrier_discard`` (verl-recipe:
  ``refill=barrier``, ``surplus=discard``, ``data.gen_batch_size = 3 x train_batch_size``),
  ``adaptive_discard`` (ours, the default) and ``adaptive_carry`` (ours with ``surplus=carry``). The
  headline is ``generated_per_trained``, responses generated per response trained, over the whole run and
  separately over the learning phase (``early``, steps 1-50, most groups mixed) and the rest (``late``,
  most groups all-correct, so every strategy exhausts ``max_num_gen_batches`` rounds). The strategies
  change which groups are trained, so their training trajectories (and accuracies) differ too.

Timings depend on the machine and on other load; counts and accuracies are exactly reproducible on CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dapo_verl.local.train import RunResult, run

STRATEGIES: dict[str, list[str]] = {
    "recipe_barrier_discard": ["algorithm.filter_groups.refill=barrier", "algorithm.filter_groups.surplus=discard",
                               "data.gen_batch_size=48"],
    "adaptive_discard": ["algorithm.filter_groups.refill=adaptive", "algorithm.filter_groups.surplus=discard"],
    "adaptive_carry": ["algorithm.filter_groups.refill=adaptive", "algorithm.filter_groups.surplus=carry"],
}
"""Strategy -> overrides of the default experiment (its train_batch_size is 16, so 3 x 16 = 48)."""


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _total(result: RunResult, key: str) -> float:
    return sum(value for _, value in result.series(key))


def _window(result: RunResult, first: int, last: float) -> dict[str, Any]:
    """Responses generated per trained and rounds per step over steps ``first..last``."""

    def total(key: str) -> float:
        return sum(value for step, value in result.series(key) if first <= step <= last)

    steps = sum(1 for step, _ in result.series("timing_s/step") if first <= step <= last)
    trained = total("dapo/sampler/responses_trained")
    return {
        "generated_per_trained": round(total("dapo/sampler/responses_generated") / trained, 3) if trained else None,
        "rounds_mean": round(total("dapo/sampler/gen_rounds") / steps, 3) if steps else None,
        "mean_keep_rate": round(total("dapo/sampler/keep_rate") / steps, 3) if steps else None,
    }


def _measure(result: RunResult, early_steps: int = 50) -> dict[str, Any]:
    steps = len(result.series("timing_s/step"))
    train_s = _total(result, "timing_s/step")
    gen_s = _total(result, "timing_s/gen")
    generated, trained = _total(result, "dapo/sampler/responses_generated"), _total(result,
                                                                                   "dapo/sampler/responses_trained")
    return {
        "steps": steps,
        "wall_s": round(result.wall_s, 2),
        "train_s": round(train_s, 2),
        "steps_per_s": round(steps / train_s, 3) if train_s else None,
        "generated_tokens_per_s": round(_total(result, "perf/generated_tokens") / gen_s, 1) if gen_s else None,
        "responses_generated": int(generated),
        "responses_trained": int(trained),
        "generated_per_trained": round(generated / trained, 3) if trained else None,
        "rounds_mean": round(_total(result, "dapo/sampler/gen_rounds") / steps, 3) if steps else None,
        "partial_steps": int(_total(result, "dapo/sampler/partial")),
        "initial_accuracy": result.initial_accuracy,
        "final_accuracy": result.final_accuracy,
        "early": {"steps": f"1-{early_steps}", **_window(result, 1, early_steps)},
        "late": {"steps": f"{early_steps + 1}-{steps}", **_window(result, early_steps + 1, steps)},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the measurements and print one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="local.device")
    parser.add_argument("--seed", type=int, default=0, help="data.seed of every run")
    parser.add_argument("--default-steps", type=int, help="training steps of the default run (default: its config)")
    parser.add_argument("--efficiency-steps", type=int, default=150, help="training steps per sampler strategy")
    parser.add_argument("--skip-default-run", action="store_true", help="only the sampler comparison")
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args(argv)
    meta = {"commit": _commit(), "torch": torch.__version__, "device": args.device,
            "python": platform.python_version(), "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="bench_local_") as tmp:
        root = args.out or Path(tmp)
        common = [f"local.device={args.device}", f"data.seed={args.seed}", "trainer.resume_mode=disable",
                  "trainer.save_freq=-1"]
        if not args.skip_default_run:
            began = time.perf_counter()
            steps = [f"trainer.total_training_steps={args.default_steps}"] if args.default_steps else []
            result = run([*common, *steps, f"local.cache_dir={root / 'empty_cache'}"], root / "default_run")
            line = {"benchmark": "bench_local", "measurement": "default_run", **meta, **_measure(result),
                    "process_s": round(time.perf_counter() - began, 2)}
            print(json.dumps(line), flush=True)
        for name, overrides in STRATEGIES.items():
            result = run([*common, *overrides, f"local.cache_dir={root / 'cache'}",
                          f"trainer.total_training_steps={args.efficiency_steps}"], root / name)
            line = {"benchmark": "bench_local", "measurement": "sampler_efficiency", "strategy": name, **meta,
                    **_measure(result)}
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
