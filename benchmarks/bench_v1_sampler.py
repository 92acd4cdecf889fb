"""Dynamic sampling in verl's v1 trainer: verl's own replay buffers against DapoReplayBuffer, over TransferQueue.

Run: ``.venv/bin/python -m benchmarks.bench_v1_sampler`` (48 minutes on 2 CPU cores shared with other jobs for
the four default strategies, Ray and TQ start-up included; ``--steps 30`` for a 5-minute look; ``--help`` for
sizes and the other strategies). Each strategy prints a progress line every tenth of its steps.
It starts Ray (8 logical CPUs) and a CPU TransferQueue (TQ), then runs each strategy through
:class:`~tools.verl_fakes.v1_trainer.SimulatedTrainer`: verl 0.9.1's trainer code for submission, ``step()`` and
sampling, with the replay buffer that verl's ``_build_replay_buffer`` builds from the config -- the real
classes over the real TQ, not a model of them -- and :class:`~tools.verl_fakes.v1_rollout.SimulatedRollout` as the
agent loop (verl's TQ protocol, simulated model).

Scenario: :class:`benchmarks.bench_sampler.Scenario` and its pass rates, with the batch scaled down by 8: 512
prompts, 16 prompts x G = 16 responses per step, 300 steps (bench_sampler: 4096, 128, 16, 300; the same
prompts-per-batch ratio and run length, so the data is revisited as often, and the share of informative groups
falls from 54% to 25% over the run). ``--steps 30`` spreads the same drift over a tenth of the run, where the
data is barely revisited. One seed by default (bench_sampler runs three).

Every strategy gets the same groups for the same (prompt, step): a group's outcome is drawn from a generator
seeded by (seed, prompt index, step, occurrence) with bench_sampler's :class:`SimulatedPolicy`, its latency
``U(0.5, 1)`` generation budgets from bench_sampler's latency draw. Generation runs on a virtual clock: it
advances ``tick`` budgets (default 0.05) each time a buffer sleeps between two polls, so verl's 2 s poll and
dapo_verl's 0.05 s poll cost the same, and the counts do not depend on machine load. Training takes
``--train-budgets`` of virtual time (default 0): prompts still in flight when sampling ends keep generating
meanwhile, which is what separate_async's rollout pool does while the trainer trains.

Strategies (``trainer.v1.trainer_mode``; everything else is verl's default or dapo_verl's shipped default):

* ``verl_sync`` -- verl's ``ReplayBuffer`` with ``algorithm.filter_groups`` (metric ``acc``): ``prepare_step``
  submits ``train_batch_size`` prompts; each evicted zero-variance group earns 2 refill credits, dispatched
  through verl's ``_add_prompts_to_generate`` while fewer than ``max_inflight_gen_batches (1) x
  train_batch_size`` prompts are pending or running; once the batch is full it drains what is in flight and
  discards the surplus.
* ``verl_async`` -- verl's ``ReplayBufferAsync`` with ``algorithm.filter_groups`` in ``colocate_async``: one
  warm-up batch, then per step one batch submitted and each evicted group refilled with one prompt; finished
  groups wait in TQ for later steps (``max_off_policy_threshold`` 8, ``drop``).
* ``dapo_default`` / ``dapo_carry`` -- :class:`~dapo_verl.adapter.v1_sampler.DapoReplayBuffer` in ``sync``
  with the shipped sampler defaults (adaptive refill, surplus discarded, measured skipping and revisits), and
  with ``surplus=carry`` (``max_staleness_steps=1``).
* ``verl_separate`` / ``dapo_separate`` / ``dapo_separate_carry`` -- the same buffers in ``separate_async``
  (``parameter_sync_step=1``), where DapoReplayBuffer submits the next step's first round at the end of each
  step's sampling (not run by default; use with ``--train-budgets``).
* ``dapo_plain`` / ``dapo_plain_carry`` -- the same without skipping and revisits: adaptive sizing alone
  (not run by default).

Metrics, per strategy over the run:

* ``generated_per_trained`` -- responses generated (every group that finished generating) / responses trained.
* ``fewer_than_verl_sync`` -- ``verl_sync``'s generated_per_trained / this strategy's.
* ``waves_mean``, ``waves_max`` -- sequential generations a step waited for: a group already in flight when
  the step began is in wave 1, a group dispatched during the step is in wave ``1 +`` the highest wave among
  the groups that had finished before it was dispatched; a step's waves are the highest wave among the groups
  that finished during it (0 when it waited for none).
* ``gen_time_mean`` -- virtual generation budgets a step waited for (training time excluded).
* ``sample_ms_median`` / ``step_ms_median`` -- driver wall time of one ``sample()`` call / of ``step()``
  (``prepare_step``'s submission plus sampling), minus the simulated rollout's own time (dispatching and
  writing groups). Absolute times on a shared machine are noisy; compare within one run.
* ``off_policy_share`` -- trained groups submitted in an earlier step (carried or prefetched).
* ``partial_steps``, ``left_in_tq`` -- steps with fewer than ``train_batch_size`` groups; finished groups left
  unserved in TQ at the end (carried or prefetched).

Each run checks its accounting: every finished group is trained, evicted/discarded (verl's metrics) or
dropped (the replenisher's), or left in TQ.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks import sampler_report
from benchmarks.bench_sampler import Scenario
from benchmarks.sampler_report import commit_id, spread, write_result

VERL_BUFFER = ("trainer.v1.sampler.custom_sampler.path=null", "trainer.v1.sampler.custom_sampler.name=null")
_PLAIN = ("algorithm.filter_groups.skip_uninformative=false", "algorithm.filter_groups.revisit_informative=false")
_CARRY = ("algorithm.filter_groups.surplus=carry", "algorithm.filter_groups.max_staleness_steps=1")

STRATEGIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "verl_sync": ("verl v1 ReplayBuffer, filter_groups (sync)", "sync", VERL_BUFFER),
    "verl_async": ("verl v1 ReplayBufferAsync, filter_groups (colocate_async)", "colocate_async", VERL_BUFFER),
    "dapo_default": ("DapoReplayBuffer, default (adaptive, discard, skip, revisit)", "sync", ()),
    "dapo_carry": ("DapoReplayBuffer, default + surplus=carry", "sync", _CARRY),
    "dapo_plain": ("DapoReplayBuffer, adaptive, discard (no skip/revisit)", "sync", _PLAIN),
    "dapo_plain_carry": ("DapoReplayBuffer, adaptive, carry (no skip/revisit)", "sync", (*_PLAIN, *_CARRY)),
    "verl_separate": ("verl v1 ReplayBufferAsync, filter_groups (separate_async)", "separate_async", VERL_BUFFER),
    "dapo_separate": (
        "DapoReplayBuffer, default, separate_async (next step's first round prefetched)",
        "separate_async",
        (),
    ),
    "dapo_separate_carry": (
        "DapoReplayBuffer, default + surplus=carry, separate_async (prefetched)",
        "separate_async",
        _CARRY,
    ),
}
"""Strategy name -> (table label, trainer mode, config overrides)."""


def _separate_overrides(scenario: Scenario) -> tuple[str, ...]:
    """separate_async needs train_batch_size = parameter_sync_step x ppo_mini_batch_size (verl asserts it)."""
    return (
        "trainer.v1.separate_async.parameter_sync_step=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={scenario.train_batch_size}",
    )


DEFAULT_SCENARIO = replace(Scenario(), num_prompts=512, train_batch_size=16)  # bench_sampler's 300 steps, batch / 8
BASELINE = "verl_sync"
TARGETS = {"fewer_than_verl_sync": 1.5}
TARGET_STRATEGIES = ("dapo_default", "dapo_carry")
DEFAULT_STRATEGIES = ("verl_sync", "verl_async", "dapo_default", "dapo_carry")

COLUMNS = (
    ("generated_per_trained", "gen/trained", 2),
    ("fewer_than_verl_sync", "x fewer than verl sync", 2),
    ("waves_mean", "waves/step", 2),
    ("waves_max", "max waves", 0),
    ("gen_time_mean", "gen time/step", 2),
    ("sample_ms_median", "driver ms/sample()", 0),
    ("step_ms_median", "driver ms/step", 0),
    ("off_policy_share", "off-policy share", 2),
    ("partial_steps", "partial steps", 0),
    ("left_in_tq", "left in TQ", 0),
)
"""(metric, column title, decimals) of the table."""


def run_strategy(
    name: str,
    scenario: Scenario,
    seed: int,
    workdir: Path,
    *,
    tick: float = 0.05,
    dapo_overrides: Sequence[str] = (),
    train_budgets: float = 0.0,
) -> dict[str, Any]:
    """Run one strategy through the scenario; TransferQueue must be up (``tq.init()``) and is left empty.

    ``dapo_overrides`` (Hydra ``KEY=VALUE``) apply to the DapoReplayBuffer strategies only; ``train_budgets`` is
    each step's training time in generation budgets (generation in flight goes on meanwhile; 0: no overlap).

    Returns:
        The metrics of the module docstring plus raw counts.

    Raises:
        RuntimeError: if the run's accounting does not add up.
    """
    from tools.verl_fakes.v1_rollout import SimulatedRollout, clear_all, train_keys
    from tools.verl_fakes.v1_trainer import SimulatedTrainer, compose_v1_config

    _, mode, overrides = STRATEGIES[name]
    config = compose_v1_config(
        workdir / f"{name}_{seed}",
        f"data.train_batch_size={scenario.train_batch_size}",
        f"actor_rollout_ref.rollout.n={scenario.group_size}",
        f"data.seed={seed}",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=acc",
        f"algorithm.filter_groups.max_num_gen_batches={scenario.max_num_gen_batches}",
        "algorithm.filter_groups.on_shortfall=partial",
        f"trainer.total_training_steps={scenario.steps}",
        *(_separate_overrides(scenario) if mode == "separate_async" else ()),
        *overrides,
        *(dapo_overrides if name.startswith("dapo") else ()),
        mode=mode,
    )
    clear_all()
    rollout = SimulatedRollout(
        config, scenario.pass_rates(seed), seed=seed, timing="virtual", writer="batched", tick=tick
    )
    trainer = SimulatedTrainer(config, rollout, dataset_size=scenario.num_prompts, train_budgets=train_budgets)
    started = time.perf_counter()
    every = max(1, scenario.steps // 10)
    with rollout.virtual_time():
        trainer.begin()
        for step in range(1, scenario.steps + 1):
            trainer.train_step()
            if step % every == 0 or step == scenario.steps:
                print(
                    f"[{name} seed {seed}] step {step}/{scenario.steps} ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    wall = time.perf_counter() - started
    metrics = _metrics(trainer, scenario)
    left = {key.split("_")[0] for key, tag in train_keys().items() if tag.get("status") == "finished"}
    metrics["left_in_tq"] = float(len(left))
    _check_accounting(name, trainer, metrics)
    metrics["wall_s"] = wall
    rollout.wait_idle(timeout_s=600)
    clear_all()
    rollout.close()
    return metrics


def _metrics(trainer: Any, scenario: Scenario) -> dict[str, Any]:
    records = trainer.records
    finished = [g for g in trainer.rollout.groups.values() if g.completion_seq is not None]
    generated = sum(len(g.correct) for g in finished)
    trained = sum(len(r.keys) for r in records)
    trained_groups = sum(len(r.groups) for r in records)
    off_policy = sum(
        1
        for r in records
        for batch, _ in r.slices
        for uid in {k.split("_")[0] for k in batch.keys}
        if trainer.rollout.groups[uid].step + 1 < r.step
    )
    sample_ms = [1000 * s for r in records for s in r.sample_s]
    waves = [r.waves for r in records]
    return {
        "generated_per_trained": generated / max(trained, 1),
        "waves_mean": statistics.fmean(waves),
        "waves_max": float(max(waves)),
        "gen_time_mean": statistics.fmean(r.gen_time for r in records),
        "sample_ms_median": statistics.median(sample_ms),
        "step_ms_median": statistics.median(1000 * r.driver_s for r in records),
        "off_policy_share": off_policy / max(trained_groups, 1),
        "partial_steps": float(sum(len(r.groups) < scenario.train_batch_size for r in records)),
        "responses_generated": float(generated),
        "responses_trained": float(trained),
        "groups_finished": float(len(finished)),
        "groups_dispatched": float(len(trainer.rollout.groups)),
        "groups_trained": float(trained_groups),
        "polls": float(round(trainer.rollout.now / trainer.rollout.tick)),
    }


def _check_accounting(name: str, trainer: Any, metrics: dict[str, Any]) -> None:
    """Finished groups = trained + removed by the buffer + finished groups left in TQ."""
    replenisher = getattr(trainer.replay_buffer, "_replenisher", None)
    if replenisher is not None:
        removed = sum(replenisher.dropped.values())
        if replenisher.conservation_gap() or replenisher.counters["groups_generated"] != metrics["groups_finished"]:
            raise RuntimeError(f"{name}: the replenisher's accounting does not match the groups generated.")
    else:
        removed = sum(
            m.get(k, 0)
            for r in trainer.records
            for _, m in r.slices
            for k in (
                "training/filter_groups/evicted_samples",
                "training/filter_groups/discarded_surplus_samples",
                "training/off_policy/evicted_samples",
                "training/rollout_failure/evicted_samples",
            )
        )
    gap = metrics["groups_finished"] - (metrics["groups_trained"] + removed + metrics["left_in_tq"])
    if gap:
        raise RuntimeError(f"{name}: {gap:+.0f} finished groups are neither trained, removed nor left in TQ.")


def run_benchmark(
    scenario: Scenario,
    seeds: Sequence[int],
    strategies: Sequence[str] = tuple(STRATEGIES),
    *,
    tick: float = 0.05,
    dapo_overrides: Sequence[str] = (),
    train_budgets: float = 0.0,
) -> dict[str, Any]:
    """Run every strategy on every seed (TransferQueue must be up); per-seed metrics and their spread.

    Returns:
        ``{"scenario": {...}, "strategies": {name: {"label", "mode", "per_seed": [...], "summary": {...}}}}``.
    """
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        raise ValueError(f"Unknown strategies {unknown}. Known: {list(STRATEGIES)}.")
    result: dict[str, Any] = {
        "scenario": asdict(scenario),
        "tick": tick,
        "train_budgets": train_budgets,
        "dapo_overrides": list(dapo_overrides),
        "strategies": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench_v1_sampler_") as workdir:
        for name in strategies:
            label, mode, _ = STRATEGIES[name]
            per_seed = [
                {
                    "seed": seed,
                    **run_strategy(
                        name,
                        scenario,
                        seed,
                        Path(workdir),
                        tick=tick,
                        dapo_overrides=dapo_overrides,
                        train_budgets=train_budgets,
                    ),
                }
                for seed in seeds
            ]
            result["strategies"][name] = {"label": label, "mode": mode, "per_seed": per_seed}
    baseline = result["strategies"].get(BASELINE)
    for entry in result["strategies"].values():
        if baseline is not None:
            for base, metrics in zip(baseline["per_seed"], entry["per_seed"]):
                metrics["fewer_than_verl_sync"] = base["generated_per_trained"] / metrics["generated_per_trained"]
        keys = [k for k in entry["per_seed"][0] if k != "seed"]
        entry["summary"] = {k: spread([float(m[k]) for m in entry["per_seed"]]) for k in keys}
    return result


def check_targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets in sync mode: >= 1.5x fewer responses per trained one than verl_sync, no more waves."""
    baseline = result["strategies"].get(BASELINE)
    if baseline is None:
        return {}
    checks: dict[str, Any] = {}
    for name in TARGET_STRATEGIES:
        summary = result["strategies"].get(name, {}).get("summary")
        if summary is None:
            continue
        fewer = summary["fewer_than_verl_sync"]["mean"]
        waves, base_waves = summary["waves_mean"]["mean"], baseline["summary"]["waves_mean"]["mean"]
        checks[name] = {
            "fewer_than_verl_sync": {"measured": fewer, "target": 1.5, "met": fewer >= 1.5},
            "waves_mean": {"measured": waves, "target": base_waves, "met": waves <= base_waves},
        }
    return checks


def format_table(result: dict[str, Any]) -> str:
    """Markdown table: mean (± sd with several seeds; max waves: the largest over all seeds)."""
    return sampler_report.format_table(result, COLUMNS, max_key="waves_max", plain_without_spread=True)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = DEFAULT_SCENARIO
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_v1_sampler", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default: 0)")
    parser.add_argument("--steps", type=int, default=d.steps, help="training steps per run")
    parser.add_argument("--train-batch-size", type=int, default=d.train_batch_size, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=d.group_size, help="responses per prompt (G)")
    parser.add_argument("--num-prompts", type=int, default=d.num_prompts, help="prompts in the data set")
    parser.add_argument("--start-logit-mean", type=float, default=d.start_logit_mean)
    parser.add_argument("--start-logit-std", type=float, default=d.start_logit_std)
    parser.add_argument("--logit-gain", type=float, default=d.logit_gain, help="pass-rate logit gain over the run")
    parser.add_argument("--max-num-gen-batches", type=int, default=d.max_num_gen_batches)
    parser.add_argument("--tick", type=float, default=0.05, help="generation budgets per buffer poll")
    parser.add_argument(
        "--train-budgets",
        type=float,
        default=0.0,
        help="each step's training time in generation budgets, during which generation in flight "
        "goes on (default 0: no overlap)",
    )
    parser.add_argument("--strategies", nargs="+", default=list(DEFAULT_STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument(
        "--dapo-overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra overrides for the DapoReplayBuffer strategies only (e.g. sampler settings)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench/bench_v1_sampler.json"), help="JSON result path")
    return parser.parse_args(argv)


def _print_report(result: dict[str, Any]) -> None:
    """One JSON line per strategy (the table's metrics, mean over seeds), the table, the targets."""
    for name, entry in result["strategies"].items():
        line = {
            **result["meta"],
            "measurement": name,
            "label": entry["label"],
            "mode": entry["mode"],
            "scenario": result["scenario"],
            **{key: round(entry["summary"][key]["mean"], 4) for key, _, _ in COLUMNS if key in entry["summary"]},
        }
        print(json.dumps(line, sort_keys=True))
    print(
        f"\nscenario: {json.dumps(result['scenario'])}, tick {result['tick']}, "
        f"dapo overrides {result['dapo_overrides']}"
    )
    print(format_table(result))
    for name, checks in result["targets"].items():
        for metric, check in checks.items():
            verdict = "met" if check["met"] else "NOT met"
            print(f"target {name} {metric}: measured {check['measured']:.2f} vs {check['target']:.2f} -> {verdict}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: start Ray and TransferQueue, run, print, write ``--out``."""
    import ray
    import transfer_queue as tq
    import verl

    args = _parse_args(argv)
    scenario = replace(
        DEFAULT_SCENARIO,
        num_prompts=args.num_prompts,
        group_size=args.group_size,
        train_batch_size=args.train_batch_size,
        steps=args.steps,
        start_logit_mean=args.start_logit_mean,
        start_logit_std=args.start_logit_std,
        logit_gain=args.logit_gain,
        max_num_gen_batches=args.max_num_gen_batches,
    )
    torch.set_num_threads(1)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False)  # TQ's two actors need CPUs a 2-core machine would not offer
    tq.init()
    started = time.perf_counter()
    try:
        result = run_benchmark(
            scenario,
            args.seeds,
            args.strategies,
            tick=args.tick,
            dapo_overrides=args.dapo_overrides,
            train_budgets=args.train_budgets,
        )
    finally:
        tq.close()
        if started_ray:
            ray.shutdown()
    result["meta"] = {
        "benchmark": "bench_v1_sampler",
        "commit": commit_id(),
        "torch": torch.__version__,
        "verl": verl.__version__,
        "transfer_queue": tq.__version__,
        "device": "cpu",
        "python": platform.python_version(),
        "seeds": list(args.seeds),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result["targets"] = check_targets(result)
    _print_report(result)
    write_result(result, args.out)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
