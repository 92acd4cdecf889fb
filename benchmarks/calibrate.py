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
* ``sweep``: a published vLLM serving sweep (:data:`SWEEP_PUBLISHED`) on the engine alone -- one replica, fixed
  lengths, C requests kept in flight -- with the fitted ``t_sched`` and nothing fitted: the time per output token of
  one request, and how much output throughput 8 requests in flight buy over one. It checks what every comparison of
  in-flight budgets rests on, how a replica's speed changes as sequences join it, prefills included.

Each line of ``--out`` is one run; ``--report`` prints the calibration table from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_stream
from benchmarks.bench_stream import RooflineCost, StepRecord, StreamScenario, _Requests
from benchmarks.sampler_report import commit_id
from dapo_verl.report.stats import paired_t_test
from dapo_verl.sampler import PromptStream
from dapo_verl.sampler.engine import Request
from dapo_verl.sampler.simulated_engine import SimulatedEngine

VERL_PUBLISHED = {32: 357.41, 64: 150.72, 128: 177.85}
"""verl ``docs/advance/fully_async.md``, 7B table, ``gen`` of the colocate-sync rows (seconds per step)."""

FIT_AT = 64
TOLERANCE = 0.20
APRIL_PUBLISHED = 0.17  # APRIL README, Qwen3-4B on DAPO-Math-17k: +17% rollout throughput

H20 = {"gpu_bandwidth": 4.0e12, "gpu_flops": 148e12, "gpu_memory": 96e9}
"""NVIDIA H20 datasheet: 4.0 TB/s HBM3, 148 dense bf16 TFLOPS, 96 GB."""


A100_40GB = {"gpu_bandwidth": 1.555e12, "gpu_flops": 312e12, "gpu_memory": 40e9}
"""NVIDIA A100 SXM 40GB datasheet: 1,555 GB/s HBM2, 312 dense bf16 TFLOPS, 40 GB."""

SWEEP_PUBLISHED = {"tpot_c1_s": 1 / 75, "gain_c8": 6.6}
"""J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100" (johnmusgrave.com): Llama-3.1-8B-Instruct in bf16 on one
A100 40GB, vLLM 0.23.0 with its default scheduling, ``vllm bench serve`` on random prompts of a fixed 1024 tokens and
outputs of a fixed 128 (``--ignore-eos``) at ``--max-concurrency`` C with 20 C prompts: one request at a time decodes
about 75 tokens/s; output throughput at C = 8 is 6.6x that at C = 1."""

SWEEP_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
SWEEP_PROMPT_TOKENS, SWEEP_OUTPUT_TOKENS = 1024, 128


@dataclass(frozen=True)
class FixedLengths:
    """Every response is ``tokens`` long (a serving benchmark's ``--ignore-eos`` output length)."""

    tokens: int

    def draw(self, prompt_id: int, seed: int, rng: random.Random) -> float:
        return float(self.tokens)


def sweep_cost(t_sched: float) -> RooflineCost:
    """Llama-3.1-8B (8.03e9 parameters; 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 131,072 bytes a token) on
    one A100 40GB, the cost model's efficiencies."""
    return RooflineCost(
        params=8.03e9, kv_bytes_per_token=131_072.0, gpus_per_replica=1, replicas=1, t_sched=t_sched, **A100_40GB
    )


def serve(
    concurrency: int,
    cost: RooflineCost,
    *,
    prompt_tokens: int = SWEEP_PROMPT_TOKENS,
    output_tokens: int = SWEEP_OUTPUT_TOKENS,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int = 256,
) -> float:
    """Output tokens per second of ``vllm bench serve --max-concurrency C --num-prompts 20C --request-rate inf`` on
    the simulated engine (vLLM's default ``gpu_memory_utilization`` and ``max_num_seqs``): C requests in flight, each
    that finishes replaced at once until 20 C were sent, timed from the first request to the last answer."""
    engine = SimulatedEngine(
        lambda prompt_id, step: 0.5,
        group_size=1,
        lengths=FixedLengths(output_tokens),
        max_response_length=output_tokens + 1,  # not truncated
        prompt_tokens=prompt_tokens,
        max_running=max_num_seqs,
        kv_capacity=cost.kv_capacity(gpu_memory_utilization),
        cost=cost,
    )
    total, sent, answered = 20 * concurrency, 0, 0

    def send(count: int) -> None:
        nonlocal sent
        engine.submit([Request(sent + i + 1, sent + i, 0) for i in range(count)])
        sent += count

    send(concurrency)
    while answered < total:
        finished = len(engine.collect())
        answered += finished
        send(min(finished, total - sent))
    if engine.tokens_generated != total * output_tokens:
        raise RuntimeError(f"the sweep decoded {engine.tokens_generated} tokens, not {total * output_tokens}: a bug")
    return total * output_tokens / engine.clock


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
    parser.add_argument(
        "--tests",
        nargs="+",
        choices=("verl", "april", "sweep"),
        default=["verl", "april", "sweep"],
        help="which figures to run; without verl, t_sched is the fitted value the cost model holds",
    )
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

    t_sched = RooflineCost().t_sched
    if "verl" in args.tests:
        echo(f"fitting t_sched to verl's {VERL_PUBLISHED[FIT_AT]} s at {FIT_AT} GPUs, seeds {args.seeds}")
        t_sched = fit_t_sched(args.seeds, echo)
        for gpus in sorted(VERL_PUBLISHED):
            gen_s = verl_gen_s(gpus, t_sched, args.seeds)
            write({"test": "verl", "gpus": gpus, "t_sched": t_sched, "seeds": args.seeds, "gen_s": gen_s})
            echo(f"  {gpus} GPUs: {statistics.fmean(gen_s):.1f} s (published {VERL_PUBLISHED[gpus]})")
    if "april" in args.tests:
        scenario, cost = april_setting(t_sched)
        for seed in args.april_seeds:
            for strategy in ("slime", "slime_april"):
                result = bench_stream.run(strategy, scenario, seed, cost, echo=_quiet)
                write({"test": "april", "t_sched": t_sched} | {k: v for k, v in result.items() if k != "gen_s"})
                echo(f"  APRIL setting, {strategy} seed {seed}: {result['gen_s_per_step']:.1f} s/step")
    if "sweep" in args.tests:
        cost = sweep_cost(t_sched)
        tpot = cost.decode_time(1, SWEEP_PROMPT_TOKENS, SWEEP_OUTPUT_TOKENS) / SWEEP_OUTPUT_TOKENS
        rates = {c: serve(c, cost) for c in SWEEP_CONCURRENCY}
        write({"test": "sweep", "t_sched": t_sched, "tpot_c1_s": tpot, "output_tok_s": rates})
        echo(
            f"  vLLM sweep: {tpot * 1e3:.2f} ms a token alone; " + ", ".join(f"C={c} {r:.0f}" for c, r in rates.items())
        )
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
    sweeps = [line for line in lines if line["test"] == "sweep"]
    if sweeps:
        line = sweeps[-1]
        rates = {int(c): r for c, r in line["output_tok_s"].items()}
        tpot, published_tpot = line["tpot_c1_s"], SWEEP_PUBLISHED["tpot_c1_s"]
        gain, published_gain = rates[8] / rates[1], SWEEP_PUBLISHED["gain_c8"]
        where = "vLLM serving, Llama-3.1-8B on 1 A100 40GB, 1024 in / 128 out"
        for name, published, model, shown in (
            ("time per output token, 1 request", published_tpot, tpot, lambda x: f"{x * 1e3:.1f} ms"),
            ("output throughput, 8 requests over 1", published_gain, gain, lambda x: f"{x:.2f}x"),
        ):
            ok = "yes" if abs(model / published - 1) <= TOLERANCE else "**no**"
            rows.append(
                f"| {where}: {name} | {shown(published)} | {shown(model)} ({model / published - 1:+.0%}) | "
                f"predicted (t_sched = {line['t_sched'] * 1e3:.3f} ms) | {ok} |"
            )
        rows.append(
            f"| the same, output throughput at C = {', '.join(map(str, rates))} (not published here; reported) | - | "
            f"{' / '.join(f'{r:.0f}' for r in rates.values())} tokens/s | reported | |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
