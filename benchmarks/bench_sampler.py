"""Dynamic-sampling cost benchmark: how many responses each refill strategy generates per response trained.

Run: ``.venv/bin/python -m benchmarks.bench_sampler`` (under two minutes on 2 CPU cores; ``--help`` for sizes).
It counts, it does not time: no model runs, a seeded :class:`~dapo_verl.sampler.simulation.SimulatedPolicy`
stands in for one, so the numbers are the same on every machine (device "cpu" in the JSON lines).

Scenario (defaults, the same for every strategy and seed). A DAPO-like run scaled down 4x in batch and data:
4096 prompts (DAPO-Math-17k has ~17k prompts for a 512-prompt batch; 4096 / 128 keeps the ratio), a
training batch of 128 prompts, G = 16 responses per prompt (paper §4.1), 300 training steps. Prompt i is
answered correctly with probability ``sigmoid(l_i + gain * step / steps)``, ``l_i ~ N(-1.5, 4^2)`` drawn
from the seed, ``gain = 7.5`` logits over the run (:func:`~dapo_verl.sampler.simulation.drifting_pass_rates`).
Expected group outcomes at G = 16: mixed (informative) 54% at the start and 25% at the end; all-correct
12% -> 74% (the rise the paper shows in Fig. 3b); all-wrong 34% -> 1%. The pass rate follows the training
step, never the generation round, so every strategy faces the same policy at the same step.

Strategies:

* ``recipe_barrier_discard`` -- verl-recipe's ``RayDAPOTrainer``: rounds of ``data.gen_batch_size = 3 x
  train_batch_size`` prompts (the published 32B run), ``max_num_gen_batches = 10``, surplus discarded; run
  through :class:`~dapo_verl.sampler.BatchReplenisher` with ``refill=barrier, surplus=discard`` and no skipping
  or revisits.
* ``v1_streaming_discard`` -- verl v1's sync ``ReplayBuffer`` with ``algorithm.filter_groups`` (simulated
  here by :class:`StreamingRefill`, written from its documented behaviour): a step submits
  ``train_batch_size`` prompts; every finished zero-variance group is evicted and adds 2 refill credits;
  credits are dispatched one prompt at a time while fewer than ``max_inflight_gen_batches x
  train_batch_size`` prompts are in flight; once ``train_batch_size`` informative groups are ready it stops
  dispatching, drains the requests in flight, and discards every informative group beyond the batch.
  verl v1 has no round limit (it ignores ``max_num_gen_batches``); as a simulation guard a step stops
  dispatching after ``100 x train_batch_size`` prompts and counts as partial.
* ``adaptive_discard`` / ``adaptive_carry`` / ``adaptive_carry_skip`` -- ours: adaptive refill (default
  ``SamplerConfig`` sizing) with surplus discarded, carried one step (``max_staleness_steps=1``), and carried
  plus measured skipping (``skip_uninformative=true``); no revisits.
* ``adaptive_revisit`` / ``adaptive_skip_revisit`` -- adaptive refill, surplus discarded, revisits of
  informative prompts while they are rare (``revisit_informative=true``), without and with skipping; the
  latter is the shipped default.

* ``logit_belief`` -- a candidate predictor kept out of the package (:mod:`benchmarks.candidates`): Gaussian logit
  beliefs with a fitted drift and training shift, through the same replenisher with ``prompt_selection=predicted``;
  ``logit_lookahead`` the same beliefs with ranking keys that look one training ahead.

Metrics, per strategy over the whole run, then mean / sd / min / max over seeds:

* ``generated_per_trained`` -- responses generated / responses trained.
* ``oracle_share`` -- responses an oracle that generates only informative prompts would need (= responses
  trained) / responses generated, i.e. 1 / generated_per_trained.
* ``rounds_mean``, ``rounds_max``, ``multi_round_share`` -- generation rounds per training step (a step served
  entirely from carried groups has 0 rounds). For the streaming baseline a round is a *refill wave*: the
  step's first ``train_batch_size`` prompts are wave 1 and a prompt dispatched on a credit from evicting a
  wave-w group is in wave w + 1; a step's rounds are the highest wave it dispatched, i.e. the number of
  generations that had to finish one after another -- what a barrier round costs the recipe.
* ``gen_time_mean`` -- generation latency per step in units of one full-budget generation. Assumption of this
  benchmark: a group finishes ``U(0.5, 1)`` budgets after dispatch (its slowest response); a barrier or
  adaptive round lasts as long as its slowest group; the streaming baseline polls after every completion.
* ``partial_steps``, ``shortfall_groups`` -- steps that hit the round limit (run with ``on_shortfall=partial``;
  verl-recipe would raise "Generated too many" there; the streaming guard above) and the groups they lacked.
* ``carried_share`` -- trained groups that were generated one step earlier (the off-policy price of carry).
* ``fewer_than_recipe`` -- recipe's generated_per_trained / this strategy's, seed by seed.

Conservation is checked for every run: generated groups = trained + carried at the end + dropped (by reason:
``all_correct``, ``all_wrong``, ``surplus``, ``stale``, ``shortfall``).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import platform
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.candidates import foreign_sampler
from benchmarks.sampler_report import HEADLINE, check_targets, commit_id, format_table, spread, write_result
from dapo_verl.config import SamplerConfig
from dapo_verl.core import DropReason, group_drop_reasons
from dapo_verl.sampler import BatchReplenisher, GroupResult, PromptStream
from dapo_verl.sampler.simulation import LATENCY_SEED_OFFSET, SimulatedPolicy, drifting_pass_rates, group_latencies

_STREAMING_PROMPT_LIMIT = 100  # simulation guard, x train_batch_size per step: verl v1 has no bound (it ignores
# max_num_gen_batches) and would keep generating on hopeless data; here the step ends partial instead
_RECIPE = "recipe_barrier_discard"


@dataclass(frozen=True)
class Scenario:
    """The simulated training run every strategy faces (see the module docstring for the defaults' origin)."""

    num_prompts: int = 4096
    group_size: int = 16
    train_batch_size: int = 128
    steps: int = 300
    start_logit_mean: float = -1.5
    start_logit_std: float = 4.0
    logit_gain: float = 7.5
    gen_batch_factor: int = 3
    max_num_gen_batches: int = 10
    max_inflight_gen_batches: int = 1
    train_gain: float = 0.0

    def pass_rates(self, seed: int) -> LearningPassRates:
        """``pass_rate(prompt_id, step)`` for this seed, drifting by ``logit_gain`` over ``steps``, plus ``train_gain``
        logits for each training batch that held one of the prompt's groups (:class:`LearningPassRates`)."""
        return LearningPassRates(
            drifting_pass_rates(
                self.num_prompts,
                seed=seed,
                start_logit_mean=self.start_logit_mean,
                start_logit_std=self.start_logit_std,
                drift_per_step=self.logit_gain / self.steps,
            ),
            self.train_gain,
        )

    def outcome_shares(self, seed: int, step: int) -> dict[str, float]:
        """Expected share of mixed, all-correct and all-wrong groups over all prompts at ``step`` (without what
        training on particular prompts adds: that depends on the strategy)."""
        rate = self.pass_rates(seed)
        p = torch.tensor([rate(i, step) for i in range(self.num_prompts)], dtype=torch.float64)  # (num_prompts,)
        all_correct = float((p**self.group_size).mean())
        all_wrong = float(((1 - p) ** self.group_size).mean())
        return {"mixed": 1 - all_correct - all_wrong, "all_correct": all_correct, "all_wrong": all_wrong}


class LearningPassRates:
    """Pass rates that drift with the training step and rise for the prompts training holds.

    ``rate(i, step) = sigmoid(logit of the drifting rates + train_gain * n_i)``, with n_i the training batches
    that held a group of prompt i so far (:meth:`trained`). With ``train_gain = 0`` it is the drifting rates.

    Args:
        drifting: ``pass_rate(prompt_id, step)`` before any prompt-specific learning.
        train_gain: Logits a prompt gains each time a training batch holds one of its groups.
    """

    def __init__(self, drifting: Callable[[int, int], float], train_gain: float) -> None:
        self._drifting = drifting
        self.train_gain = train_gain
        self._bonus: dict[int, float] = {}

    def __call__(self, prompt_id: int, step: int) -> float:
        bonus = self._bonus.get(prompt_id)
        rate = self._drifting(prompt_id, step)
        if not bonus:
            return rate
        rate = min(max(rate, 1e-12), 1.0 - 1e-12)
        return 1.0 / (1.0 + math.exp(-(math.log(rate / (1.0 - rate)) + bonus)))

    def trained(self, prompt_ids: Sequence[int]) -> None:
        """One training batch held a group of each of ``prompt_ids`` (a prompt twice in it gains twice)."""
        if self.train_gain:
            for prompt_id in prompt_ids:
                self._bonus[prompt_id] = self._bonus.get(prompt_id, 0.0) + self.train_gain


_SPECIFIC_GAIN = 7.5 * 4096 / (128 * 300)
"""The default scenario's drift (7.5 logits over the run) spread over the trainings a prompt gets on average
(128 groups a step for 300 steps over 4096 prompts: 9.4 each): 0.8 logits per training."""

SCENARIOS: dict[str, dict[str, float]] = {
    "default": {},
    "late_easy": {"logit_gain": 10.0},
    "hard_start": {"start_logit_mean": -3.0},
    "slow_drift": {"logit_gain": 4.0},
    "alike": {"start_logit_mean": -3.0, "start_logit_std": 0.0, "logit_gain": 0.0},
    "learns": {"logit_gain": 0.0, "train_gain": _SPECIFIC_GAIN},
    "learns_half": {"logit_gain": 3.75, "train_gain": _SPECIFIC_GAIN / 2},
}
"""Named scenarios (``--scenario``), as changes to :class:`Scenario`'s defaults: ``default``; ``late_easy``, most
prompts easy late in training (informative groups 54% -> 11%); ``hard_start``, most prompts all wrong at first;
``slow_drift``, a policy that barely moves (informative 54% -> 50%); ``alike``, every prompt the same (54%
informative throughout), where no history can predict anything. In those five a prompt's pass rate follows the
training step alone, so training on a prompt never changes it, and a rule that keeps choosing the prompts known
to be informative is never punished for it. ``learns``: the default's learning on average, all of it specific to
the prompts trained (0.8 logits per training batch holding the prompt, no drift); ``learns_half``: half the
default's drift and half that specific gain. Both were fixed by this rule before they were run."""


@dataclass
class RunRecord:
    """Counts of one strategy on one seed, accumulated over the run."""

    rounds: list[int] = field(default_factory=list)
    gen_time: list[float] = field(default_factory=list)
    responses_generated: int = 0
    responses_trained: int = 0
    groups_generated: int = 0
    groups_trained: int = 0
    groups_from_carry: int = 0
    groups_carried_at_end: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    partial_steps: int = 0
    shortfall_groups: int = 0
    prompts_skipped: int = 0
    pool_trained_fraction: float = 0.0
    pool_solved_fraction: float = 0.0
    pool_failed_fraction: float = 0.0

    def conservation_gap(self) -> int:
        """generated - (trained + carried at the end + dropped); 0 unless a group went missing."""
        return self.groups_generated - (self.groups_trained + self.groups_carried_at_end + sum(self.dropped.values()))

    def metrics(self) -> dict[str, float]:
        """The per-run metrics of the module docstring, plus the raw counts."""
        steps = max(len(self.rounds), 1)
        return {
            "generated_per_trained": self.responses_generated / max(self.responses_trained, 1),
            "oracle_share": self.responses_trained / max(self.responses_generated, 1),
            "rounds_mean": sum(self.rounds) / steps,
            "rounds_max": float(max(self.rounds, default=0)),
            "multi_round_share": sum(r > 1 for r in self.rounds) / steps,
            "gen_time_mean": sum(self.gen_time) / steps,
            "partial_steps": float(self.partial_steps),
            "shortfall_groups": float(self.shortfall_groups),
            "carried_share": self.groups_from_carry / max(self.groups_trained, 1),
            "prompts_skipped": float(self.prompts_skipped),
            "pool_trained_fraction": self.pool_trained_fraction,
            "pool_solved_fraction": self.pool_solved_fraction,
            "pool_failed_fraction": self.pool_failed_fraction,
            "responses_generated": float(self.responses_generated),
            "responses_trained": float(self.responses_trained),
            "groups_generated": float(self.groups_generated),
            "groups_trained": float(self.groups_trained),
            "groups_carried_at_end": float(self.groups_carried_at_end),
            **{f"dropped_{reason}": float(count) for reason, count in sorted(self.dropped.items())},
        }


class _TimedPolicy:
    """Wraps a simulated policy; records each round's latency (its slowest group)."""

    def __init__(self, policy: SimulatedPolicy, seed: int) -> None:
        self.policy = policy
        self.round_latencies: list[float] = []
        self._gen = torch.Generator().manual_seed(seed + LATENCY_SEED_OFFSET)

    def __call__(self, prompt_ids: Sequence[int]) -> list[GroupResult]:
        groups = self.policy(prompt_ids)
        self.round_latencies.append(max(group_latencies(self._gen, len(groups)), default=0.0))
        return groups


def _policy(scenario: Scenario, seed: int) -> tuple[SimulatedPolicy, LearningPassRates]:
    rates = scenario.pass_rates(seed)
    return SimulatedPolicy(rates, group_size=scenario.group_size, seed=seed), rates


def run_replenisher(scenario: Scenario, seed: int, *, peer: str | None = None, **overrides: Any) -> RunRecord:
    """Run :class:`BatchReplenisher` through the scenario with ``SamplerConfig(**overrides)`` (``peer``: with that
    peer's prompt choice or a candidate predictor's, :func:`benchmarks.candidates.foreign_sampler`)."""
    config = SamplerConfig(
        **{
            "train_batch_size": scenario.train_batch_size,
            "max_num_gen_batches": scenario.max_num_gen_batches,
            "on_shortfall": "partial",
            "seed": seed,
            **overrides,
        }
    )
    simulated, rates = _policy(scenario, seed)
    policy = _TimedPolicy(simulated, seed)
    sampler = (
        foreign_sampler(peer, config, scenario.num_prompts, policy)
        if peer
        else BatchReplenisher(config, scenario.num_prompts, policy)
    )
    record = RunRecord()
    for step in range(scenario.steps):
        policy.policy.step = step
        policy.round_latencies.clear()
        batch = sampler.next_batch()
        rates.trained([group.prompt_id for group in batch.groups])
        record.rounds.append(int(batch.metrics["dapo/sampler/gen_rounds"]))
        record.gen_time.append(sum(policy.round_latencies))
        record.groups_from_carry += int(batch.metrics["dapo/sampler/groups_from_carry"])
        record.partial_steps += int(batch.is_partial)
        record.shortfall_groups += scenario.train_batch_size - len(batch.groups)
    counters = sampler.counters
    record.responses_generated = int(counters["responses_generated"])
    record.responses_trained = int(counters["responses_trained"])
    record.groups_generated = int(counters["groups_generated"])
    record.groups_trained = int(counters["groups_trained"])
    record.groups_carried_at_end = len(sampler.carried)
    record.dropped = {reason: count for reason, count in sampler.dropped.items() if count}
    record.prompts_skipped = sampler.stream.prompts_skipped
    last = batch.metrics
    record.pool_trained_fraction = last["dapo/sampler/pool_trained_fraction"]
    record.pool_solved_fraction = last["dapo/sampler/pool_solved_fraction"]
    record.pool_failed_fraction = last["dapo/sampler/pool_failed_fraction"]
    return record


class StreamingRefill:
    """verl v1's sync DAPO refill (evict k, credit 2k, bounded in flight, drain, discard surplus), simulated.

    An event simulation of one training step at a time: every dispatched prompt is generated at once by the
    simulated policy and finishes after its latency; finished groups are handled in completion order, each
    as its own poll. See the module docstring for the wave (round) definition.

    Args:
        scenario: Batch sizes, ``max_inflight_gen_batches`` and the policy's pass rates.
        seed: Seed of the prompt order, the policy's draws and the latencies.
    """

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.policy, self.rates = _policy(scenario, seed)
        self.stream = PromptStream(scenario.num_prompts, seed=seed)  # a shuffled dataloader, no skipping
        self.record = RunRecord(dropped={})
        self._trained_prompts: set[int] = set()
        self._latency_gen = torch.Generator().manual_seed(seed + LATENCY_SEED_OFFSET)
        self._order = itertools.count()

    def _dispatch(self, heap: list, now: float, waves: list[int]) -> None:
        """Generate one prompt per entry of ``waves`` and schedule its completion."""
        prompt_ids, _ = self.stream.take(len(waves))
        groups = self.policy(prompt_ids)
        metric = torch.stack([g.metric.to(torch.float32) for g in groups])  # (P, G)
        reasons = [DropReason(int(code)) for code in group_drop_reasons(metric)]
        latencies = group_latencies(self._latency_gen, len(waves))
        for wave, group, reason, latency in zip(waves, groups, reasons, latencies):
            heapq.heappush(heap, (now + latency, next(self._order), wave, reason, group.prompt_id))
            self.record.groups_generated += 1
            self.record.responses_generated += group.group_size

    def _drop(self, reason: str, count: int = 1) -> None:
        if count:
            self.record.dropped[reason] = self.record.dropped.get(reason, 0) + count

    def run_step(self, step: int) -> None:
        """Fill one training batch, then account for it in :attr:`record`."""
        target = self.scenario.train_batch_size
        capacity = self.scenario.max_inflight_gen_batches * target
        budget = _STREAMING_PROMPT_LIMIT * target
        self.policy.step = step
        heap: list = []
        credits: deque[int] = deque()  # the wave of the prompt each credit will dispatch, oldest first
        self._dispatch(heap, 0.0, [1] * target)
        dispatched, ready, draining, rounds, now = target, 0, False, 1, 0.0
        batch: list[int] = []
        while heap:
            now, _, wave, reason, prompt_id = heapq.heappop(heap)
            if reason == DropReason.KEEP:
                ready += 1
                if ready <= target:  # the first informative groups to finish fill the batch
                    self._trained_prompts.add(prompt_id)
                    batch.append(prompt_id)
            else:
                self._drop(reason.label)
                if not draining:
                    credits.extend((wave + 1, wave + 1))
            if ready >= target or dispatched >= budget:
                draining = True  # stop dispatching; the requests in flight finish and are discarded
                credits.clear()
            free = min(capacity - len(heap), len(credits), budget - dispatched)
            if free > 0:
                waves = [credits.popleft() for _ in range(free)]
                rounds = max(rounds, *waves)
                dispatched += free
                self._dispatch(heap, now, waves)
        trained = min(ready, target)
        self.rates.trained(batch)
        self._drop("surplus", ready - trained)
        self.record.rounds.append(rounds)
        self.record.gen_time.append(now)
        self.record.groups_trained += trained
        self.record.responses_trained += trained * self.scenario.group_size
        self.record.partial_steps += int(trained < target)
        self.record.shortfall_groups += target - trained


def run_streaming(scenario: Scenario, seed: int) -> RunRecord:
    """Run :class:`StreamingRefill` through the scenario."""
    baseline = StreamingRefill(scenario, seed)
    for step in range(scenario.steps):
        baseline.run_step(step)
    baseline.record.pool_trained_fraction = len(baseline._trained_prompts) / scenario.num_prompts
    return baseline.record


def _recipe(scenario: Scenario, seed: int) -> RunRecord:
    gen_batch_size = scenario.gen_batch_factor * scenario.train_batch_size
    return run_replenisher(
        scenario,
        seed,
        refill="barrier",
        surplus="discard",
        gen_batch_size=gen_batch_size,
        skip_uninformative=False,
        revisit_informative=False,
    )


_PLAIN = {"skip_uninformative": False, "revisit_informative": False}
_CARRY = {"surplus": "carry", "max_staleness_steps": 1}
_STREAK = {"prompt_selection": "streak"}
_PREDICTED = {"prompt_selection": "predicted"}

STRATEGIES: dict[str, tuple[str, Callable[[Scenario, int], RunRecord]]] = {
    _RECIPE: ("verl-recipe: barrier 3x, discard", _recipe),
    "v1_streaming_discard": ("verl v1: streaming 2k refill, discard", run_streaming),
    "adaptive_discard": (
        "ours: adaptive, discard",
        lambda s, seed: run_replenisher(s, seed, refill="adaptive", surplus="discard", **_PLAIN),
    ),
    "adaptive_carry": (
        "ours: adaptive, carry",
        lambda s, seed: run_replenisher(s, seed, refill="adaptive", **_CARRY, **_PLAIN),
    ),
    "adaptive_carry_skip": (
        "ours: adaptive, carry, streak skip",
        lambda s, seed: run_replenisher(
            s, seed, refill="adaptive", **_CARRY, skip_uninformative=True, revisit_informative=False, **_STREAK
        ),
    ),
    "adaptive_revisit": (
        "ours: adaptive, discard, revisit",
        lambda s, seed: run_replenisher(
            s, seed, refill="adaptive", surplus="discard", skip_uninformative=False, revisit_informative=True
        ),
    ),
    "adaptive_skip_revisit": (
        "**ours: default** (adaptive, discard, streak skip, revisit)",
        lambda s, seed: run_replenisher(s, seed),
    ),
    "greso": ("GRESO's skip rule (arXiv 2506.02177)", lambda s, seed: run_replenisher(s, seed, peer="greso")),
    "mopps_math": (
        "MoPPS, math scripts (arXiv 2507.04632; 16x candidates, no forgetting)",
        lambda s, seed: run_replenisher(s, seed, peer="mopps_math"),
    ),
    "mopps_countdown": (
        "MoPPS, countdown scripts (8x candidates, lambda 0.5)",
        lambda s, seed: run_replenisher(s, seed, peer="mopps_countdown"),
    ),
    "predicted": (
        "ours: adaptive, discard, predicted, revisit",
        lambda s, seed: run_replenisher(s, seed, **_PREDICTED),
    ),
    "predicted_carry": (
        "ours: adaptive, carry, predicted",
        lambda s, seed: run_replenisher(s, seed, **_CARRY, revisit_informative=False, **_PREDICTED),
    ),
    "predicted_prefer": (
        "ours: predicted, prefer_informative, explore 0.2",
        lambda s, seed: run_replenisher(s, seed, **_PREDICTED, prefer_informative=True, explore_fraction=0.2),
    ),
    "logit_belief": (
        "candidate: logit beliefs, fitted drift and training shift",
        lambda s, seed: run_replenisher(s, seed, peer="logit_belief"),
    ),
    "logit_lookahead": (
        "candidate: logit beliefs, keys looking one training ahead",
        lambda s, seed: run_replenisher(s, seed, peer="logit_lookahead"),
    ),
}
"""Strategy name -> (table label, runner)."""


def run_benchmark(scenario: Scenario, seeds: Sequence[int], strategies: Sequence[str] = tuple(STRATEGIES)) -> dict:
    """Run every strategy on every seed; return per-seed metrics and their spread.

    Returns:
        ``{"scenario": {...}, "outcome_shares": {"start": ..., "end": ...}, "strategies": {name: {"label",
        "per_seed": [metrics per seed], "summary": {metric: {"mean", "sd", "min", "max"}}}}}``.

    Raises:
        RuntimeError: if a run loses track of a group (conservation gap != 0).
    """
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        raise ValueError(f"Unknown strategies {unknown}. Known: {list(STRATEGIES)}.")
    result: dict[str, Any] = {
        "scenario": asdict(scenario),
        "outcome_shares": {
            "start": scenario.outcome_shares(seeds[0], 0),
            "end": scenario.outcome_shares(seeds[0], scenario.steps - 1),
        },
        "strategies": {},
    }
    for name in strategies:
        label, runner = STRATEGIES[name]
        per_seed = []
        for seed in seeds:
            record = runner(scenario, seed)
            if record.conservation_gap():
                raise RuntimeError(f"{name}, seed {seed}: {record.conservation_gap()} groups unaccounted for.")
            per_seed.append({"seed": seed, **record.metrics()})
        result["strategies"][name] = {"label": label, "per_seed": per_seed}
    _add_recipe_ratio(result["strategies"])
    for entry in result["strategies"].values():
        keys = [k for k in entry["per_seed"][0] if k != "seed"]
        entry["summary"] = {k: spread([float(m.get(k, 0.0)) for m in entry["per_seed"]]) for k in keys}
    return result


def _add_recipe_ratio(strategies: dict[str, Any]) -> None:
    """Add ``fewer_than_recipe`` (seed by seed) when the recipe strategy was run."""
    if _RECIPE not in strategies:
        return
    recipe = [m["generated_per_trained"] for m in strategies[_RECIPE]["per_seed"]]
    for entry in strategies.values():
        for base, metrics in zip(recipe, entry["per_seed"]):
            metrics["fewer_than_recipe"] = base / metrics["generated_per_trained"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = Scenario()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sampler", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default: 0 1 2)")
    parser.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        default="default",
        help="a named scenario (SCENARIOS); the options below change it further",
    )
    parser.add_argument("--steps", type=int, default=d.steps, help="training steps per run")
    parser.add_argument("--train-batch-size", type=int, default=d.train_batch_size, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=d.group_size, help="responses per prompt (G)")
    parser.add_argument("--num-prompts", type=int, default=d.num_prompts, help="prompts in the data set")
    parser.add_argument("--start-logit-mean", type=float, help=f"(default: the scenario's; {d.start_logit_mean})")
    parser.add_argument("--start-logit-std", type=float, help=f"(default: the scenario's; {d.start_logit_std})")
    parser.add_argument(
        "--logit-gain", type=float, help=f"pass-rate logit gain over the run (default: the scenario's; {d.logit_gain})"
    )
    parser.add_argument(
        "--train-gain",
        type=float,
        help=f"logits a prompt gains per training batch holding it (default: the scenario's; {d.train_gain})",
    )
    parser.add_argument(
        "--gen-batch-factor",
        type=int,
        default=d.gen_batch_factor,
        help="recipe: data.gen_batch_size = factor x train_batch_size",
    )
    parser.add_argument("--max-num-gen-batches", type=int, default=d.max_num_gen_batches)
    parser.add_argument(
        "--max-inflight-gen-batches",
        type=int,
        default=d.max_inflight_gen_batches,
        help="v1 streaming: in-flight prompt bound, in train batches",
    )
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--out", type=Path, default=Path("runs/bench/bench_sampler.json"), help="JSON result path")
    return parser.parse_args(argv)


def _print_report(result: dict) -> None:
    """One JSON line per strategy (headline metrics, mean and sd over seeds), the scenario, the table, targets."""
    for name, entry in result["strategies"].items():
        headline = {k: v for k, v in entry["summary"].items() if k in HEADLINE}
        line = {
            **result["meta"],
            "measurement": name,
            "label": entry["label"],
            "scenario": result["scenario"],
            **{k: round(v["mean"], 4) for k, v in headline.items()},
            "sd": {k: round(v["sd"], 4) for k, v in headline.items()},
        }
        print(json.dumps(line, sort_keys=True))
    shares = {when: {k: round(v, 2) for k, v in result["outcome_shares"][when].items()} for when in ("start", "end")}
    print(f"\nscenario: {json.dumps(result['scenario'])}")
    print(f"expected groups (seed {result['meta']['seeds'][0]}): start {shares['start']}, end {shares['end']}")
    print(format_table(result))
    for name, checks in result["targets"].items():
        for metric, check in checks.items():
            verdict = "met" if check["met"] else "NOT met"
            print(f"target {name} {metric}: measured {check['measured']:.2f} vs {check['target']} -> {verdict}")


def main(argv: Sequence[str] | None = None) -> dict:
    """Command-line entry point: run, print one JSON line per strategy and a table, write ``--out``."""
    args = _parse_args(argv)
    named = SCENARIOS[args.scenario]
    given = {
        k: getattr(args, k)
        for k in ("start_logit_mean", "start_logit_std", "logit_gain", "train_gain")
        if getattr(args, k) is not None
    }
    scenario = Scenario(
        **{
            **named,
            **given,
            "num_prompts": args.num_prompts,
            "group_size": args.group_size,
            "train_batch_size": args.train_batch_size,
            "steps": args.steps,
            "gen_batch_factor": args.gen_batch_factor,
            "max_num_gen_batches": args.max_num_gen_batches,
            "max_inflight_gen_batches": args.max_inflight_gen_batches,
        }
    )
    torch.set_num_threads(1)  # tensors of a few dozen elements: threads only add contention
    started = time.perf_counter()
    result = run_benchmark(scenario, args.seeds, args.strategies)
    meta = {
        "benchmark": "bench_sampler",
        "scenario_name": args.scenario,
        "commit": commit_id(),
        "torch": torch.__version__,
        "device": "cpu",
        "python": platform.python_version(),
        "seeds": list(args.seeds),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result = {"meta": meta, **result, "targets": check_targets(result)}
    _print_report(result)
    write_result(result, args.out)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
