"""The streaming simulator against figures no one here wrote: verl's published generation times, APRIL's gain.

Run: ``.venv/bin/python -m benchmarks.calibrate`` (``--help``; a few minutes on one core). The test it runs was
declared in ``benchmarks/README.md`` ("Calibration against published figures") before its first run.

* ``verl``: verl's colocate-sync generation time for 7B DAPO at a 28K response limit on 32, 64 and 128 H20 GPUs
  (verl ``docs/advance/fully_async.md``, "Asynchronous Training on 7B Model": 357.41, 150.72 and 177.85 s). The
  per-step overhead ``t_sched`` is fitted to the 64-GPU time by bisection; the 32- and 128-GPU times are predicted with
  it, and each prediction passes within 20% of the published time.
* ``april``: slime's rollout against APRIL's (twice the batch over-sampled, unfinished groups carried) at APRIL's
  setting, Qwen3-4B on 8 H100 at a 16K limit, 32 prompts x 8 (APRIL's README: +17% rollout throughput on
  DAPO-Math-17k), with the fitted ``t_sched``; the gain in trained tokens per generation second, paired by seed.

Each line of ``--out`` is one run; ``--report`` prints the calibration table from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import bench_stream
from benchmarks.bench_stream import RooflineCost, StepRecord, StreamScenario, _Requests
from benchmarks.sampler_report import commit_id
from dapo_verl.report.stats import paired_t_test
from dapo_verl.sampler import PromptStream
from dapo_verl.sampler.simulated_engine import SimulatedEngine

VERL_PUBLISHED = {32: 357.41, 64: 150.72, 128: 177.85}
"""verl ``docs/advance/fully_async.md``, 7B table, ``gen`` of the colocate-sync rows (seconds per step)."""

FIT_AT = 64
TOLERANCE = 0.20
APRIL_PUBLISHED = 0.17  # APRIL README, Qwen3-4B on DAPO-Math-17k: +17% rollout throughput

H20 = {"gpu_bandwidth": 4.0e12, "gpu_flops": 148e12, "gpu_memory": 96e9}
"""NVIDIA H20 datasheet: 4.0 TB/s HBM3, 148 dense bf16 TFLOPS, 96 GB."""


def verl_setting(gpus: int, t_sched: float) -> tuple[StreamScenario, RooflineCost]:
    """Qwen2.5-Math-7B (7.6e9 parameters; 28 layers x 4 KV heads x 128 x (K, V) x 2 bytes = 57,344 bytes a token)
    at rollout TP 4 and ``gpu_memory_utilization`` 0.8 (the published fully_async scripts' ``gen_tp=4`` and 0.80),
    512 prompts x 16, responses up to 28 x 1024 tokens; the paper scenario's lengths, prompts and ``max_num_seqs``."""
    scenario = dataclasses.replace(StreamScenario(), max_response_length=28 * 1024, steps=4, gpu_memory_utilization=0.8)
    cost = RooflineCost(
        params=7.6e9, kv_bytes_per_token=57_344.0, gpus_per_replica=4, replicas=gpus // 4, t_sched=t_sched, **H20
    )
    return scenario, cost


def april_setting(t_sched: float) -> tuple[StreamScenario, RooflineCost]:
    """Qwen3-4B (4.02e9 parameters; 36 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 147,456 bytes a token) on
    8 H100 as 4 engines of 2 GPUs (APRIL's scripts), 32 prompts x 8, responses up to 16,384 tokens; the paper
    scenario's lengths, prompts, pass-rate drift and ``gpu_memory_utilization``."""
    scenario = dataclasses.replace(StreamScenario(), train_batch_size=32, group_size=8, max_response_length=16_384)
    cost = RooflineCost(params=4.02e9, kv_bytes_per_token=147_456.0, gpus_per_replica=2, replicas=4, t_sched=t_sched)
    return scenario, cost


class ColocateSync:
    """verl's colocate sync without dynamic sampling: the batch's prompts generated to their end, every group
    trained (the fully_async scripts set no ``filter_groups``)."""

    def __init__(self, scenario: StreamScenario, engine: SimulatedEngine, seed: int) -> None:
        self.s, self.engine = scenario, engine
        self.prompts = PromptStream(scenario.num_prompts, seed=seed)
        self.requests = _Requests()

    def step(self, step: int) -> StepRecord:
        s, engine = self.s, self.engine
        engine.step, start = step, engine.clock
        engine.submit(self.requests.fresh(self.prompts.take(s.train_batch_size)[0], step))
        groups: list[Any] = []
        while len(groups) < s.train_batch_size:
            groups += [g for _, g in engine.collect()]
        return StepRecord(engine.clock - start, sum(g.num_tokens for g in groups), len(groups) * s.group_size, 1)


def verl_gen_s(gpus: int, t_sched: float, seeds: list[int]) -> list[float]:
    """Mean generation time per step of each seed (steps 2-4)."""
    scenario, cost = verl_setting(gpus, t_sched)
    runs = [
        bench_stream.run("colocate_sync", scenario, seed, cost, warmup=1, echo=_quiet, driver=ColocateSync)
        for seed in seeds
    ]
    return [r["gen_s_per_step"] for r in runs]


def fit_t_sched(seeds: list[int], echo: Callable[[str], None]) -> float:
    """The ``t_sched`` at which the mean over ``seeds`` of the 64-GPU generation time equals the published one."""
    low, high = 0.0, 0.02
    target = VERL_PUBLISHED[FIT_AT]
    for _ in range(14):
        mid = (low + high) / 2
        mean = statistics.fmean(verl_gen_s(FIT_AT, mid, seeds))
        echo(f"  t_sched {mid * 1e3:.3f} ms: {mean:.1f} s at {FIT_AT} GPUs (published {target})")
        low, high = (mid, high) if mean < target else (low, mid)
    return (low + high) / 2


def _quiet(line: str) -> None:
    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the verl fit and predictions")
    parser.add_argument("--april-seeds", type=int, nargs="+", default=list(range(10, 18)))
    parser.add_argument("--out", type=Path, default=Path("runs/bench/calibrate.jsonl"))
    parser.add_argument("--report", action="store_true", help="print the calibration table from --out and exit")
    args = parser.parse_args(argv)
    if args.report:
        if not args.out.is_file():
            parser.error(f"--out {args.out} is not a file of this benchmark's lines; run the benchmark first.")
        print(report([json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def write(line: dict[str, Any]) -> None:
        with args.out.open("a") as out:
            out.write(json.dumps(line | {"commit": commit_id()}) + "\n")

    echo(f"fitting t_sched to verl's {VERL_PUBLISHED[FIT_AT]} s at {FIT_AT} GPUs, seeds {args.seeds}")
    t_sched = fit_t_sched(args.seeds, echo)
    for gpus in sorted(VERL_PUBLISHED):
        gen_s = verl_gen_s(gpus, t_sched, args.seeds)
        write({"test": "verl", "gpus": gpus, "t_sched": t_sched, "seeds": args.seeds, "gen_s": gen_s})
        echo(f"  {gpus} GPUs: {statistics.fmean(gen_s):.1f} s (published {VERL_PUBLISHED[gpus]})")
    scenario, cost = april_setting(t_sched)
    for seed in args.april_seeds:
        for strategy in ("slime", "slime_april"):
            result = bench_stream.run(strategy, scenario, seed, cost, echo=_quiet)
            write({"test": "april", "t_sched": t_sched} | {k: v for k, v in result.items() if k != "gen_s"})
            echo(f"  APRIL setting, {strategy} seed {seed}: {result['gen_s_per_step']:.1f} s/step")
    print(report([json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]))
    return 0


def report(lines: list[dict[str, Any]]) -> str:
    """The calibration table (Markdown): each published figure, what the model gives, and whether it passes."""
    verl = {line["gpus"]: line for line in lines if line["test"] == "verl"}
    rows = ["| published figure | published | model | role | within 20% |", "|---|---|---|---|---|"]
    for gpus in sorted(verl):
        line, published = verl[gpus], VERL_PUBLISHED[gpus]
        model = statistics.fmean(line["gen_s"])
        role = f"fitted (t_sched = {line['t_sched'] * 1e3:.2f} ms)" if gpus == FIT_AT else "predicted"
        ok = "" if gpus == FIT_AT else ("yes" if abs(model / published - 1) <= TOLERANCE else "**no**")
        rows.append(
            f"| verl colocate-sync gen, 7B DAPO 28K, {gpus} H20 | {published:.1f} s | {model:.1f} s "
            f"({model / published - 1:+.0%}) | {role} | {ok} |"
        )
    april = {(line["strategy"], line["seed"]): line for line in lines if line["test"] == "april"}
    seeds = sorted({seed for strategy, seed in april if strategy == "slime" and ("slime_april", seed) in april})
    if len(seeds) >= 2:

        def rate(strategy: str, seed: int, key: str) -> float:
            line = april[(strategy, seed)]
            per_step = line["trained_tokens_per_step"] * (line["tokens_per_trained"] if key == "decoded" else 1)
            return per_step / line["gen_s_per_step"]

        for key, name in (("trained", "trained tokens"), ("decoded", "decoded tokens")):
            gain = paired_t_test([rate("slime_april", s, key) / rate("slime", s, key) - 1 for s in seeds])
            ok = (
                ("yes" if abs(gain.mean / APRIL_PUBLISHED - 1) <= TOLERANCE else "**no**")
                if key == "trained"
                else "(not the declared metric)"
            )
            rows.append(
                f"| APRIL gain, Qwen3-4B 16K on 8 H100, {name} per second (seeds {seeds[0]}-{seeds[-1]}) | "
                f"+{APRIL_PUBLISHED:.0%} | {gain.mean:+.1%} [{gain.ci_low:+.1%}, {gain.ci_high:+.1%}] | predicted | "
                f"{ok} |"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
