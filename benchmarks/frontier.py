"""Every strategy across its own in-flight knob at the paper's scale, on the same KV memory: the frontier of generation
time against tokens generated per trained token, and a clairvoyant scheduler's time beside it.

Run: ``.venv/bin/python -m benchmarks.frontier --seeds 10 11 12`` (``--settings`` to run some; ``--report`` prints
the declared test over ``--out``'s lines). The test was declared in ``benchmarks/README.md`` ("Frontier at equal
budgets") before its runs. Scenario and engine are ``bench_stream``'s paper scenario: 32 replicas routed as verl
routes, each with the KV cache vLLM gets at ``gpu_memory_utilization`` 0.8, the cost model's fitted ``t_sched``.

Knobs: verl's ``trainer.v1.colocate_async.num_warmup_batches``; slime's ``--over-sampling-batch-size`` (in batches)
with and without ``--partial-rollout``; dapo_verl's ``stream_oversample`` with ``surplus=carry`` and ``discard``, and
rounds with either surplus. ``clairvoyant`` knows every group's verdict before generating it: it generates the
step's first 512 informative groups in the pool's order, all at once, and nothing else (one token generated per
trained token), so its time is what a batch takes when no group is wasted, without choosing short groups.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import bench_stream
from benchmarks.bench_stream import Dapo, Slime, StepRecord, StreamScenario, VerlColocateAsync, VerlSync
from benchmarks.sampler_report import commit_id
from dapo_verl.core import DropReason, group_drop_reasons
from dapo_verl.report.stats import paired_t_test
from dapo_verl.sampler import PromptStream
from dapo_verl.sampler.engine import PartialGroup, Request
from dapo_verl.sampler.simulated_engine import SimulatedEngine

MARGIN = 0.05
"""A setting lies below verl's frontier when it takes at least 5% less time at its tokens per trained token."""


def full_engine_rate(scenario: StreamScenario, cost: bench_stream.RooflineCost, draws: int = 200_000) -> float:
    """Tokens per second all replicas decode when every replica is as full as its sequence cap and KV cache allow,
    at the scenario's lengths: the rate no scheduling can beat. A decoded token's mean context is the prompt plus
    ``E[L^2] / (2 E[L])`` of its response (the lengths drawn as the engine draws them, truncated at the limit)."""
    lengths, capacity, rng = scenario.lengths, scenario.kv_capacity(cost), random.Random(0)
    drawn = [min(scenario.max_response_length, lengths.draw(i % scenario.num_prompts, 0, rng)) for i in range(draws)]
    context = scenario.prompt_tokens + sum(x * x for x in drawn) / (2 * sum(drawn))
    running = scenario.max_num_seqs if capacity is None else max(1, min(scenario.max_num_seqs, int(capacity / context)))
    return cost.replicas * running / cost.decode_time(running, round(running * context), 1)


class Clairvoyant:
    """Generates exactly the step's first ``train_batch_size`` informative groups of the pool, known in advance."""

    def __init__(self, scenario: StreamScenario, engine: SimulatedEngine, seed: int) -> None:
        self.s, self.engine = scenario, engine
        self.prompts = PromptStream(scenario.num_prompts, seed=seed)
        self.requests = bench_stream._Requests()

    def step(self, step: int) -> StepRecord:
        s, engine = self.s, self.engine
        engine.step, start = step, engine.clock
        chosen: list[Request] = []
        while len(chosen) < s.train_batch_size:
            (request,) = self.requests.fresh(self.prompts.take(1)[0], step)
            responses = engine._draw(request)  # the group this prompt would give now, seen before generating it
            metric = torch.tensor([[r.correct for r in responses]], dtype=torch.float32)
            if DropReason(int(group_drop_reasons(metric)[0])) == DropReason.KEEP:
                partial = PartialGroup(request.prompt_id, 0, 0, s.group_size, responses)
                chosen.append(Request(request.request_id, request.prompt_id, step, partial))
        engine.submit(chosen)
        groups: list[Any] = []
        while len(groups) < s.train_batch_size:
            groups += [g for _, g in engine.collect()]
        return StepRecord(engine.clock - start, sum(g.num_tokens for g in groups), len(groups) * s.group_size, 1)


Factory = Callable[[StreamScenario, SimulatedEngine, int], Any]

SETTINGS: dict[str, tuple[str, Factory]] = {
    **{
        f"verl_async(num_warmup_batches={w})": (
            "verl_async",
            lambda s, e, seed, w=w: VerlColocateAsync(s, e, seed, warmup_batches=w),
        )
        for w in (0.5, 1.0, 1.5, 2.0)
    },
    **{
        f"slime(over_sampling={k}, partial_rollout)": (
            "slime",
            lambda s, e, seed, k=k: Slime(s, e, seed, over_sampling=k, partial=True),
        )
        for k in (1.0, 1.5, 2.0)
    },
    "slime(over_sampling=1.0, discard)": ("slime", lambda s, e, seed: Slime(s, e, seed, 1.0, partial=False)),
    **{
        f"dapo_stream(carry, stream_oversample={k})": (
            "dapo_verl",
            lambda s, e, seed, k=k: Dapo(s, e, seed, rounds=False, surplus="carry", stream_oversample=k),
        )
        for k in (1.0, 1.5, 2.0)
    },
    **{
        f"dapo_stream(carry, stream_oversample={k}, max_staleness_steps=2)": (
            "dapo_verl",
            lambda s, e, seed, k=k: Dapo(
                s, e, seed, rounds=False, surplus="carry", stream_oversample=k, max_staleness_steps=2
            ),
        )
        for k in (1.25, 1.5)
    },
    "dapo_stream(discard, stream_oversample=1.0)": ("dapo_verl", lambda s, e, seed: Dapo(s, e, seed, rounds=False)),
    "dapo_rounds(discard) [default]": ("dapo_verl", lambda s, e, seed: Dapo(s, e, seed, rounds=True)),
    "dapo_rounds(carry)": ("dapo_verl", lambda s, e, seed: Dapo(s, e, seed, rounds=True, surplus="carry")),
    "verl_sync": ("verl_sync", VerlSync),
    "clairvoyant": ("bound", Clairvoyant),
}
"""Setting name -> (family, driver factory). The default's name carries ``[default]``."""


def report(lines: list[dict[str, Any]]) -> str:
    """The declared test: each setting's time and tokens, and its time over verl's frontier at its tokens.

    Per seed, verl's frontier at ``x`` tokens per trained token is the least time of a ``verl_async`` setting that
    generates at most ``x`` (the least of all of them where none does). A setting lies below it when the upper end of
    the 95% t-interval of its time over that frontier, minus 1, paired by seed, is at most ``-MARGIN``.
    """
    by = {(line["setting"], line["seed"]): line for line in lines}
    names = [name for name in SETTINGS if any(key[0] == name for key in by)]
    seeds = sorted({seed for _, seed in by if all((name, seed) in by for name in names)})
    verl = [name for name in names if SETTINGS[name][0] == "verl_async"]
    if len(seeds) < 2 or not verl:
        raise ValueError(
            f"the test needs at least one verl_async setting and 2 seeds every setting ran; got settings {names} on "
            f"seeds {seeds}. Run the missing ones with --seeds and --settings."
        )

    def frontier(x: float, seed: int) -> float:
        points = [(by[(v, seed)]["tokens_per_trained"], by[(v, seed)]["gen_s_per_step"]) for v in verl]
        within = [t for tokens, t in points if tokens <= x]
        return min(within or [t for _, t in points])

    bound = ""
    if "clairvoyant" in names:
        scenario, cost = bench_stream.SCENARIOS["paper"]
        trained = statistics.fmean(by[("clairvoyant", seed)]["trained_tokens_per_step"] for seed in seeds)
        rate = full_engine_rate(scenario, cost)
        bound = (
            f"full-engine bound: {rate:,.0f} tokens/s over all replicas; a step's {trained / 1e6:.1f}M trained tokens "
            f"take at least {trained / rate:.1f} s at 1 token generated per trained token (x times that at x)"
        )
    rows = [
        f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)})",
        *([bound] if bound else []),
        "| setting | gen s/step | tokens per trained | running per replica | preemptions/step | over verl's frontier "
        "(95% CI) | at least 5% below |",
        "|---" * 7 + "|",
    ]
    for name in names:
        runs = [by[(name, seed)] for seed in seeds]
        ratio = paired_t_test([r["gen_s_per_step"] / frontier(r["tokens_per_trained"], r["seed"]) - 1 for r in runs])
        below = "yes" if ratio.ci_high <= -MARGIN else "no"
        rows.append(
            f"| {name} | {statistics.fmean(r['gen_s_per_step'] for r in runs):.1f} | "
            f"{statistics.fmean(r['tokens_per_trained'] for r in runs):.3f} | "
            f"{statistics.fmean(r['running_per_replica'] for r in runs):.0f} | "
            f"{statistics.fmean(r['preemptions_per_step'] for r in runs):.0f} | "
            f"{1 + ratio.mean:.3f} [{1 + ratio.ci_low:.3f}, {1 + ratio.ci_high:.3f}] | {below} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS), metavar="SETTING")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/frontier.jsonl"))
    parser.add_argument("--report", action="store_true", help="print the declared test over --out's lines and exit")
    args = parser.parse_args(argv)
    if not args.report:
        scenario, cost = bench_stream.SCENARIOS["paper"]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            for name in args.settings:
                family, factory = SETTINGS[name]
                result = bench_stream.run(
                    name, scenario, seed, cost, echo=lambda line: print(line, file=sys.stderr), driver=factory
                )
                result |= {"setting": name, "family": family, "commit": commit_id()}
                with args.out.open("a") as out:
                    out.write(json.dumps(result) + "\n")
                print(
                    f"{name:45s} seed {seed}: {result['gen_s_per_step']:6.1f} s/step, "
                    f"{result['tokens_per_trained']:.3f} tokens per trained",
                    flush=True,
                )
    if not args.out.is_file():
        parser.error(f"--out {args.out} is not a file of this benchmark's lines; run the benchmark first.")
    print(report([json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
