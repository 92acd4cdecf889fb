"""Dynamic sampling on verl's real v1 trainer with real vLLM: verl's built-in filter_groups against DapoReplayBuffer.

Both strategies run the same recipe -- verl's ``ppo_trainer`` with the README's ``loss_mode=dapo`` overrides and
``algorithm.filter_groups`` on ``acc`` -- through ``dapo-verl rehearse`` (verl's trainer, FSDP2 workers, agent
loop, TransferQueue and verl's own vLLM rollout on vLLM's CPU build, the stand-in model and data), with the same
seeds and steps. They differ in one key: ``trainer.v1.sampler.custom_sampler`` unset (verl's ``ReplayBuffer``
with its streaming refill; surplus discarded) or set to dapo_verl's ``DapoReplayBuffer`` (the batch
replenisher, shipped defaults).

What is counted, the same way for both, from what verl and vLLM recorded:

* **responses generated** per training step: every request vLLM's server answered with the weights of the
  step before (the rehearsal records each request at the engine: ``runN/engine/requests-*.jsonl``); validation
  is off, and the weight-sync probe's requests are not recorded;
* **responses trained**: ``data.train_batch_size x rollout.n`` per step;
* **generation rounds** per step: DapoReplayBuffer's own ``dapo/sampler/gen_rounds``; verl's streaming refill
  replaces each evicted group as it finishes and logs no round count (only ``filter_groups/evicted_samples``,
  given), so its column is empty. Request timestamps cannot stand in for it: verl's agent loop does not start a
  round's requests together, so requests of one round start after others of the same round have finished;
* **engine busy time** per step: how long vLLM's server had at least one of the step's requests in flight (the
  union of their start-to-end intervals in the engine's own records), from step 2 on (step 1 includes vLLM's
  warm-up). verl's ``timing_s/gen`` is reported beside it but does not compare the buffers: it includes the
  buffers' sleeps between polls of TransferQueue (verl's ``ReplayBuffer`` sleeps its 2-second ``poll_interval``,
  ``DapoReplayBuffer`` 0.05 s), which decide it at this size.

Run: ``python -m benchmarks.bench_rehearsal_sampler --seeds 0 1 --steps 6`` (about 3-4 min per run on 2 cores);
prints one JSON line per run and per strategy, writes ``--out`` and a Markdown table. ``--reuse`` recomputes
from the rehearsal folders of an earlier run instead of rehearsing again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.sampler_report import commit_id, spread, write_result

README_OVERRIDES = (
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.policy_loss.loss_mode=dapo",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "algorithm.adv_estimator=dapo",
    "reward.reward_manager.name=dapo_verl",
    "+reward.reward_kwargs.overlong_tokens=2",
    "+reward.reward_kwargs.overlong_penalty_factor=1.0",
)
SIZES = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
)
DYNAMIC_SAMPLING = (
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.metric=acc",
    "algorithm.filter_groups.max_num_gen_batches=10",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)
_OURS = (
    "trainer.v1.sampler.custom_sampler.path=pkg://dapo_verl.adapter.v1_sampler",
    "trainer.v1.sampler.custom_sampler.name=DapoReplayBuffer",
    "trainer.checkpoint_callback_class=dapo_verl.adapter.v1_sampler.DapoCheckpointCallback",
)
STRATEGIES = {
    "verl_filter_groups": ("verl v1 ReplayBuffer, filter_groups (streaming refill, surplus discarded)", ()),
    "dapo_replay_buffer": ("DapoReplayBuffer, shipped defaults (adaptive refill, surplus discarded)", _OURS),
}
"""name -> (label, the overrides that select it). dapo_verl's own sampler keys (``surplus=carry`` ...) cannot be set
through verl's ``main_ppo``: verl builds ``FilterGroupsConfig`` from ``algorithm.filter_groups`` and refuses keys it
does not know (the pre-flight check says so before a run starts); they need ``python -m dapo_verl.main``, another entry
point, so this benchmark compares the shipped defaults only."""


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals: the time at least one of them was in flight."""
    busy, reached = 0.0, -float("inf")
    for start, end in sorted(intervals):
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return busy


def engine_requests(records: Path) -> list[dict[str, Any]]:
    """Every request the rehearsal's engine recorded (``requests-*.jsonl`` in ``records``), one dict each."""
    return [
        json.loads(line)
        for file in sorted(records.glob("requests-*.jsonl"))
        for line in file.read_text().splitlines()
        if line.strip()
    ]


def logged_metrics(metrics: Path) -> dict[int, dict[str, Any]]:
    """verl's JSONL metrics log as ``{step: {key: value}}``, later records of a step updating earlier ones."""
    logged: dict[int, dict[str, Any]] = {}
    for line in metrics.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            logged.setdefault(int(record["step"]), {}).update(record["data"])
    return logged


def step_counts(records: Path, metrics: Path, steps: int, trained_per_step: int) -> list[dict[str, Any]]:
    """Per training step: responses generated (engine requests with the previous step's weights), the engine's busy
    time for them, the sampler's rounds where it logs them, groups verl's filter evicted, and verl's
    ``timing_s/gen``."""
    requests = engine_requests(records)
    logged = logged_metrics(metrics)
    rows = []
    for step in range(1, steps + 1):
        mine = [r for r in requests if r["weights"] == step - 1]
        if step not in logged or "timing_s/gen" not in logged[step]:
            raise RuntimeError(f"step {step} missing from verl's log {metrics}; see the run's log.txt")
        data = logged[step]
        evicted = next((v for k, v in data.items() if k.endswith("filter_groups/evicted_samples")), 0)
        rows.append(
            {
                "generated": len(mine),
                "trained": trained_per_step,
                "rounds": data.get("dapo/sampler/gen_rounds"),
                "evicted": evicted,
                "gen_time_s": float(data["timing_s/gen"]),
                "engine_busy_s": busy_seconds([(r["start"], r["end"]) for r in mine]),
            }
        )
    return rows


def rehearsed(options: Any, *, reuse: bool, what: str) -> dict[str, Any]:
    """The report of the rehearsal ``options`` describes: the one saved in its ``out_dir`` with ``reuse``, else a new
    run's (progress on stderr). Raises RuntimeError naming ``what`` and the log when its first run failed."""
    from dapo_verl.rehearsal.run import rehearse

    saved = options.out_dir / "report.json"
    if reuse and saved.is_file():
        report = json.loads(saved.read_text())
    else:
        report = rehearse(options, echo=lambda line: print(f"  {line}", file=sys.stderr, flush=True)).report
    if not report["runs"] or report["runs"][0]["returncode"] != 0:
        raise RuntimeError(
            f"{what} failed: {report['runs'][0]['error'] if report['runs'] else ''}; see {options.out_dir}/run1/log.txt"
        )
    return report


def add_run_arguments(parser: argparse.ArgumentParser, strategies: Sequence[str], name: str) -> None:
    """The options every rehearsal benchmark takes: strategies, rehearsal folders, result file, reuse."""
    parser.add_argument("--strategies", nargs="+", default=list(strategies), choices=list(strategies))
    parser.add_argument("--work", type=Path, default=Path(f"runs/bench/{name}"), help="rehearsal folders")
    parser.add_argument("--out", type=Path, default=Path(f"runs/bench/bench_{name}.json"))
    parser.add_argument("--reuse", action="store_true", help="recompute from earlier rehearsal folders in --work")


def run_one(strategy: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One rehearsal (no resume) of ``strategy``; its per-step counts and their means."""
    from dapo_verl.rehearsal.run import RehearsalOptions

    out = args.work / f"{strategy}-seed{seed}"
    overrides = (
        *README_OVERRIDES,
        *SIZES,
        *DYNAMIC_SAMPLING,
        f"actor_rollout_ref.rollout.n={args.group_size}",
        f"actor_rollout_ref.rollout.seed={seed}",
        *STRATEGIES[strategy][1],
    )
    options = RehearsalOptions(
        config_name="ppo_trainer",
        overrides=overrides,
        out_dir=out,
        steps=args.steps,
        resume=False,
        overwrite=True,
        seed=seed,
        train_batch_size=args.train_batch_size,
        engine="vllm",
    )
    report = rehearsed(options, reuse=args.reuse, what=f"{strategy} seed {seed}")
    rows = step_counts(
        out / "run1" / "engine", out / "run1" / "metrics.jsonl", args.steps, args.train_batch_size * args.group_size
    )
    generated, trained = sum(r["generated"] for r in rows), sum(r["trained"] for r in rows)
    rounds = [r["rounds"] for r in rows if r["rounds"] is not None]
    return {
        "strategy": strategy,
        "seed": seed,
        "steps": rows,
        "wall_s": report["runs"][0]["wall_s"],
        "generated_per_trained": generated / trained,
        "rounds_mean": statistics.fmean(rounds) if rounds else None,
        "rounds_max": max(rounds, default=None),
        "evicted_per_step": statistics.fmean(r["evicted"] for r in rows),
        "gen_time_mean": statistics.fmean(r["gen_time_s"] for r in rows[1:] or rows),
        "engine_busy_mean": statistics.fmean(r["engine_busy_s"] for r in rows[1:] or rows),
        "rollout_engine": report["rollout_engine"],
    }


def table(result: dict[str, Any]) -> str:
    """Markdown table: mean ± sd over seeds, and the ratio against verl's built-in filter."""
    base = result["strategies"].get("verl_filter_groups", {}).get("summary")
    lines = [
        "| strategy | gen/trained | x fewer than verl | rounds/step (max) | engine busy/step, steps 2+ (s) | "
        "verl timing_s/gen, poll-bound (s) |",
        "|---|---|---|---|---|---|",
    ]
    for entry in result["strategies"].values():
        s = entry["summary"]
        gen, time_s, busy = s["generated_per_trained"], s["gen_time_mean"], s["engine_busy_mean"]
        ratio = f"{base['generated_per_trained']['mean'] / gen['mean']:.2f}" if base else "-"
        rounds = (
            f"{s['rounds_mean']['mean']:.2f} ({s['rounds_max']['max']:.0f})"
            if "rounds_mean" in s
            else "not logged (streaming refill)"
        )
        lines.append(
            f"| {entry['label']} | {gen['mean']:.2f} ± {gen['sd']:.2f} | {ratio} | {rounds} | "
            f"{busy['mean']:.3f} ± {busy['sd']:.3f} | {time_s['mean']:.2f} ± {time_s['sd']:.2f} |"
        )
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_rehearsal_sampler", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds (default: 0 1)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (default: 6)")
    parser.add_argument("--train-batch-size", type=int, default=4, help="prompts per step (default: 4)")
    parser.add_argument("--group-size", type=int, default=4, help="responses per prompt (default: 4)")
    add_run_arguments(parser, list(STRATEGIES), "rehearsal_sampler")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "bench_rehearsal_sampler",
        "commit": commit_id(),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "strategies": {},
    }
    for strategy in args.strategies:
        runs = []
        for seed in args.seeds:
            print(f"[{strategy}] seed {seed}: rehearsing {args.steps} steps on vLLM ...", file=sys.stderr, flush=True)
            run = run_one(strategy, seed, args)
            print(json.dumps({k: v for k, v in run.items() if k != "steps"}), flush=True)
            runs.append(run)
        summary = {
            key: spread([r[key] for r in runs])
            for key in (
                "generated_per_trained",
                "rounds_mean",
                "rounds_max",
                "evicted_per_step",
                "gen_time_mean",
                "engine_busy_mean",
            )
            if all(r[key] is not None for r in runs)
        }
        result["strategies"][strategy] = {"label": STRATEGIES[strategy][0], "runs": runs, "summary": summary}
        print(json.dumps({"strategy": strategy, **{k: round(v["mean"], 3) for k, v in summary.items()}}), flush=True)
    write_result(result, args.out)
    print(table(result))
    return result


if __name__ == "__main__":
    main()
