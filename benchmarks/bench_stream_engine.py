"""Streaming dynamic sampling on verl's real v1 trainer with real vLLM and long-tailed lengths: time and tokens.

Every strategy runs verl's v1 trainer (FSDP2 workers, agent loop, TransferQueue and verl's own vLLM rollout on
vLLM's CPU build, the stand-in model and data) with the dapo loss, advantage and reward manager, through ``dapo-verl
rehearse`` with the same seeds, steps and sizes -- verl's own buffers through ``verl.trainer.main_ppo`` with the
``loss_mode=dapo`` overrides, DapoReplayBuffer through ``python -m dapo_verl.main`` -- and with the stand-in's
DAPO-like response lengths on vLLM (``engine_kwargs.dapo_cpu.response_lengths=long_tail``: most far below the budget,
a tail to it, some truncated; :mod:`dapo_verl.rehearsal.bridges.response_lengths`), so that aborting a tail can change
time. They
differ only in the entry point, the trainer mode and the sampler keys (:data:`STRATEGIES`):

* ``verl_sync`` -- verl's own ``ReplayBuffer`` with ``filter_groups`` (sync: refill two prompts per evicted group,
  drain what is in flight, discard the surplus);
* ``verl_async`` -- verl's own ``colocate_async`` with ``ReplayBufferAsync`` (warm-up batch, abort at full, resume
  after the weight update, keep the surplus);
* ``dapo_rounds`` -- ``DapoReplayBuffer`` with the shipped defaults (sync, adaptive rounds, surplus discarded);
* ``dapo_stream_discard`` -- ``DapoReplayBuffer`` streaming in sync (groups counted as they finish, what is in flight
  topped up, the replicas aborted once the batch is full; verl's sync client cannot continue an aborted request, so
  aborted groups are discarded);
* ``dapo_stream_carry`` -- ``DapoReplayBuffer`` streaming in ``colocate_async`` with ``surplus=carry`` and
  ``stream_oversample=2`` (the candidate default of the simulated study: verl aborts at full and continues the
  unfinished groups after the weight update; the sampler follows them first);
* ``dapo_rounds_carry`` -- ``DapoReplayBuffer`` with rounds in sync and ``surplus=carry``: a round's informative groups
  beyond the batch are served first at the next step (one step old at most) instead of discarded.

For issue 40's equal-budget test (:func:`equal_budget_test`), in ``colocate_async``:

* ``verl_async_warmup2`` -- verl's own buffer with ``trainer.v1.colocate_async.num_warmup_batches=2``, its knob for
  keeping more in flight;
* ``dapo_async_rounds`` -- ``DapoReplayBuffer`` with the shipped defaults (rounds, surplus discarded);
* ``dapo_async_carry`` -- ``DapoReplayBuffer`` streaming with ``surplus=carry`` at ``stream_oversample`` 1, carried
  groups kept as long as verl keeps its surplus (:data:`VERL_OFF_POLICY_THRESHOLD`).

What is counted, the same way for every strategy, from what verl and vLLM recorded:

* **tokens generated per trained token**: the tokens vLLM's server returned for every request made with the previous
  step's weights (``runN/engine/requests-*.jsonl``; a continued request returns only its new tokens), over the
  response tokens of the trained batch (verl's ``response_length/mean`` x ``train_batch_size x n``);
* **requests per trained response**: requests answered (a continued request is a request again) per trained one;
* **engine busy time per step**: how long vLLM's server had at least one of the step's requests in flight (the union
  of their intervals from admission to end: a request verl's closed gate held -- colocate_async continues its aborted
  requests at once, and they wait out the training step there -- is counted from when it was let in, and belongs
  to the step of the weights it was let in under), steps 2 on (step 1 holds vLLM's warm-up). It leaves out the
  time the engine waits for a buffer to poll: verl's buffers sleep 2 s between polls of TransferQueue,
  ``DapoReplayBuffer`` 0.05 s, so verl's idle waits are not charged to it (in its favour);
* **requests in flight** (``in_flight``): the requests vLLM's server held, time-weighted over the busy time -- the
  in-flight budget a strategy actually kept;
* verl's ``timing_s/gen`` beside it (decided by those sleeps, so not a comparison), and ``DapoReplayBuffer``'s own
  ``dapo/sampler/aborted_tokens``, ``resumed_tokens`` and ``gen_rounds``.

Prompts: half the training file is the rehearsal's generated problems (answers 1 or 2: the stand-in is right about a
third of the time, so nearly every group of 8 is mixed), half problems it cannot answer (:func:`write_unsolvable_rows`,
all-wrong groups): about half of a fresh batch is informative, as early in the paper's run.

Run: ``python -m benchmarks.bench_stream_engine --seeds 0`` (a progress line per run; about 3-4 min per run on 2
cores); writes ``--out`` (JSON, one entry per run) and prints a Markdown table. ``--reuse`` recomputes from
the rehearsal folders of an earlier run. The declared test and its seeds: benchmarks/README.md ("Streaming on the
real engine").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_rehearsal_sampler import (
    SIZES,
    add_run_arguments,
    busy_seconds,
    engine_requests,
    logged_metrics,
    rehearsed,
)
from benchmarks.cpu_profile import CpuSampler, cpu_by_role
from benchmarks.sampler_report import commit_id, spread, write_result

_VERL = (
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.policy_loss.loss_mode=dapo",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "algorithm.adv_estimator=dapo",
    "reward.reward_manager.name=dapo_verl",
    "+reward.reward_kwargs.overlong_tokens=12",
    "+reward.reward_kwargs.overlong_penalty_factor=1.0",
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.metric=acc",
    "algorithm.filter_groups.max_num_gen_batches=10",
)
"""verl's own buffers: ``ppo_trainer`` with docs/verl.md's ``loss_mode=dapo`` overrides and ``filter_groups`` on
``acc`` (``python -m dapo_verl.main`` always runs DapoReplayBuffer; its pre-flight check refuses anything else)."""
_OURS = ("reward.reward_kwargs.overlong_tokens=12",)
VERL_OFF_POLICY_THRESHOLD = 8
"""verl's ``trainer.v1.sampler.max_off_policy_threshold`` default: its colocate_async buffer keeps a finished group
until it spans 8 policy versions. ``dapo_async_carry`` keeps carried groups as long (span = 1 +
``max_staleness_steps``), so the two differ in how they schedule, not in how long they may keep a group."""
_STREAM = ("algorithm.filter_groups.streaming=true",)
STRATEGIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "verl_sync": (
        "verl v1 ReplayBuffer, filter_groups (sync: refill 2 per evicted group, drain, discard)",
        "ppo_trainer",
        ("trainer.v1.trainer_mode=sync", *_VERL),
    ),
    "verl_async": (
        "verl v1 colocate_async, ReplayBufferAsync (abort at full, resume, keep surplus)",
        "ppo_trainer",
        ("trainer.v1.trainer_mode=colocate_async", *_VERL),
    ),
    "dapo_rounds": (
        "DapoReplayBuffer, shipped defaults (sync, adaptive rounds, surplus discarded)",
        "dapo_trainer",
        ("trainer.v1.trainer_mode=sync", *_OURS),
    ),
    "dapo_stream_discard": (
        "DapoReplayBuffer streaming in sync (abort at full, discard)",
        "dapo_trainer",
        ("trainer.v1.trainer_mode=sync", *_OURS, *_STREAM),
    ),
    "dapo_stream_carry": (
        "DapoReplayBuffer streaming in colocate_async, carry, 2x in flight",
        "dapo_trainer",
        (
            "trainer.v1.trainer_mode=colocate_async",
            *_OURS,
            *_STREAM,
            "algorithm.filter_groups.surplus=carry",
            "algorithm.filter_groups.stream_oversample=2.0",
        ),
    ),
    "dapo_rounds_carry": (
        "DapoReplayBuffer rounds with surplus=carry (sync; informative surplus served next step)",
        "dapo_trainer",
        ("trainer.v1.trainer_mode=sync", *_OURS, "algorithm.filter_groups.surplus=carry"),
    ),
    "verl_async_warmup2": (
        "verl v1 colocate_async, ReplayBufferAsync, num_warmup_batches=2 (its knob for more in flight)",
        "ppo_trainer",
        ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=2", *_VERL),
    ),
    "dapo_async_rounds": (
        "DapoReplayBuffer, shipped defaults, in colocate_async (adaptive rounds, surplus discarded)",
        "dapo_trainer",
        ("trainer.v1.trainer_mode=colocate_async", *_OURS),
    ),
    "dapo_async_carry": (
        "DapoReplayBuffer streaming in colocate_async, carry, 1x in flight, kept as long as verl keeps (8 versions)",
        "dapo_trainer",
        (
            "trainer.v1.trainer_mode=colocate_async",
            *_OURS,
            *_STREAM,
            "algorithm.filter_groups.surplus=carry",
            f"algorithm.filter_groups.max_staleness_steps={VERL_OFF_POLICY_THRESHOLD - 1}",
        ),
    ),
}
"""name -> (label, config, the overrides that select it). Both configs run verl's v1 trainer with the dapo loss,
advantage and reward manager; the loss and reward settings are the same."""

COMMON = (
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "+actor_rollout_ref.rollout.engine_kwargs.dapo_cpu.response_lengths=long_tail",
)
"""Every strategy: no validation (its requests would count), DAPO-like lengths; the overlong buffer (12 tokens) is
about the recipe's share (20%) of the default 64-token budget."""


def write_unsolvable_rows(path: Path, num_rows: int, *, seed: int) -> Path:
    """``num_rows`` DAPO-Math rows whose answers (3 to 9) the stand-in model cannot give: their groups are all wrong.

    The rehearsal takes half its training file from the recipe's files and generates the other half with answers 1
    or 2, which the stand-in gets right about a third of the time (nearly every group of 8 is informative). Given
    these as ``data.train_files``, about half of a fresh batch is informative, the paper's share early in its run
    (54%, falling to 25%).
    """
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dapo_verl.data.schema import OUTPUT_SCHEMA, dapo_prompt

    rng, rows = random.Random(seed), []
    for i in range(num_rows):
        answer, a = rng.randint(3, 9), rng.randint(0, 9)
        problem = f"Hard problem {i}: what is {a + answer} - {a}?"  # distinct from the rehearsal's "Problem i"
        rows.append(
            {
                "data_source": "math_dapo",
                "prompt": [{"content": dapo_prompt(problem), "role": "user"}],
                "ability": "MATH",
                "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
                "extra_info": {"index": i, "source_id": f"unsolvable-{i}", "raw_problem": problem, "split": "train"},
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA), path)
    return path


def step_rows(records: Path, metrics: Path, steps: int, responses_per_step: int) -> list[dict[str, Any]]:
    """Per training step: what the engine answered with the previous step's weights (requests, tokens, busy time),
    what was trained (verl's ``response_length/mean``), verl's ``timing_s/gen`` and the sampler's own counts."""
    requests = engine_requests(records)
    logged = logged_metrics(metrics)
    rows = []
    for step in range(1, steps + 1):
        data = logged.get(step, {})
        if "response_length/mean" not in data or "timing_s/gen" not in data:
            raise RuntimeError(f"step {step} is missing from verl's log {metrics}; see the run's log.txt")
        mine = [r for r in requests if r["weights"] == step - 1]
        rows.append(
            {
                "requests": len(mine),
                "tokens": sum(int(r["tokens"]) for r in mine),
                "trained_responses": responses_per_step,
                "trained_tokens": float(data["response_length/mean"]) * responses_per_step,
                "engine_busy_s": busy_seconds([(r["start"], r["end"]) for r in mine]),
                "request_s": sum(r["end"] - r["start"] for r in mine),
                "gen_time_s": float(data["timing_s/gen"]),
                **{
                    key: float(data[f"dapo/sampler/{key}"])
                    for key in ("gen_rounds", "aborted_tokens", "resumed_tokens")
                    if f"dapo/sampler/{key}" in data
                },
            }
        )
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One run's figures over its steps 2 to N-2: step 1 holds vLLM's warm-up (and colocate_async's warm-up batch);
    the rehearsal checkpoints before the last step, and DapoReplayBuffer lets what is in flight finish before a
    checkpoint and at the end (nothing partial is saved), so the last two steps do not stream.

    ``run_tokens_per_trained`` and ``run_requests_per_trained`` count the whole run instead, steps 1 to N: a buffer
    that keeps surplus trains groups in steps 2 on that step 1 generated (verl's warm-up batch, a carried surplus),
    which the window would count as trained but not as generated; over the whole run nothing generated escapes the
    count, and what is still kept or in flight at the end is charged to it."""
    kept = rows[1:-2] or rows
    summary = {
        "run_tokens_per_trained": sum(r["tokens"] for r in rows) / sum(r["trained_tokens"] for r in rows),
        "run_requests_per_trained": sum(r["requests"] for r in rows) / sum(r["trained_responses"] for r in rows),
        "tokens_per_trained": sum(r["tokens"] for r in kept) / sum(r["trained_tokens"] for r in kept),
        "requests_per_trained": sum(r["requests"] for r in kept) / sum(r["trained_responses"] for r in kept),
        "engine_busy_s": statistics.fmean(r["engine_busy_s"] for r in kept),
        "in_flight": sum(r["request_s"] for r in kept) / sum(r["engine_busy_s"] for r in kept),
        "gen_time_s": statistics.fmean(r["gen_time_s"] for r in kept),
    }
    for key in ("gen_rounds", "aborted_tokens", "resumed_tokens"):
        if all(key in r for r in kept):
            summary[key] = statistics.fmean(r[key] for r in kept)
    return summary


def measured_cpu(profile: Path, records: Path, steps: int) -> dict[str, float]:
    """CPU seconds by role (:func:`~benchmarks.cpu_profile.cpu_by_role`) from the first admission to the last end of
    the requests of the measured steps (2 to N-2, as :func:`summarise`)."""
    if not profile.is_file():
        raise FileNotFoundError(
            f"{profile} is missing: --cpu-profile with --reuse reads the samples of an earlier "
            f"--cpu-profile run; run without --reuse to sample this one"
        )
    measured = [r for r in engine_requests(records) if 1 <= r["weights"] <= steps - 3]
    if not measured:
        raise RuntimeError(f"no request of steps 2 to {steps - 2} in {records}; see the run's log.txt")
    return cpu_by_role(profile, min(r["start"] for r in measured), max(r["end"] for r in measured))


def run_one(strategy: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One rehearsal (no resume) of ``strategy``: its rows and summary."""
    from dapo_verl.rehearsal.run import RehearsalOptions

    out = args.work / f"{strategy}-seed{seed}"
    unsolvable = write_unsolvable_rows(args.work / "unsolvable.parquet", args.train_rows // 2, seed=1234)
    overrides = (
        *SIZES,
        *COMMON,
        f"data.train_files={unsolvable}",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.rollout.n={args.group_size}",
        f"actor_rollout_ref.rollout.max_num_seqs={args.max_num_seqs}",
        f"actor_rollout_ref.rollout.seed={seed}",
        *STRATEGIES[strategy][2],
    )
    options = RehearsalOptions(
        config_name=STRATEGIES[strategy][1],
        overrides=overrides,
        out_dir=out,
        steps=args.steps,
        resume=False,
        overwrite=True,
        seed=seed,
        train_batch_size=args.train_batch_size,
        train_rows=args.train_rows,
        engine="vllm",
    )
    profile = args.work / f"{strategy}-seed{seed}.cpu.jsonl"  # beside the folder, which the rehearsal must create
    if args.cpu_profile and not (args.reuse and (out / "report.json").is_file()):
        with CpuSampler(profile):
            report = rehearsed(options, reuse=False, what=f"{strategy} seed {seed}")
    else:
        report = rehearsed(options, reuse=args.reuse, what=f"{strategy} seed {seed}")
    rows = step_rows(
        out / "run1" / "engine", out / "run1" / "metrics.jsonl", args.steps, args.train_batch_size * args.group_size
    )
    extra = {"cpu_s": measured_cpu(profile, out / "run1" / "engine", args.steps)} if args.cpu_profile else {}
    return {
        "strategy": strategy,
        "seed": seed,
        "wall_s": report["runs"][0]["wall_s"],
        "steps": rows,
        **extra,
        **summarise(rows),
    }


def table(result: dict[str, Any]) -> str:
    """Markdown: mean ± sd over seeds per strategy, and the busy-time ratio against verl_sync on the same seeds."""
    runs = {name: {r["seed"]: r for r in entry["runs"]} for name, entry in result["strategies"].items()}
    base = runs.get("verl_sync", {})
    lines = [
        "| strategy | tokens generated / trained | requests / trained response | engine busy / step (s) | "
        "x verl sync (busy) | aborted / resumed tokens per step | verl timing_s/gen (poll-bound, s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in result["strategies"].items():
        s = entry["summary"]
        ratios = [
            run["engine_busy_s"] / base[seed]["engine_busy_s"] for seed, run in runs[name].items() if seed in base
        ]
        ratio = f"{statistics.fmean(ratios):.2f}" if ratios else "-"
        carried = (
            f"{s['aborted_tokens']['mean']:.0f} / {s['resumed_tokens']['mean']:.0f}"
            if "aborted_tokens" in s
            else "not logged"
        )
        tokens = s["tokens_per_trained"]
        lines.append(
            f"| {entry['label']} | {tokens['mean']:.2f} ± {tokens['sd']:.2f} "
            f"| {s['requests_per_trained']['mean']:.2f} | {s['engine_busy_s']['mean']:.2f} ± "
            f"{s['engine_busy_s']['sd']:.2f} | {ratio} | {carried} | {s['gen_time_s']['mean']:.2f} |"
        )
    return "\n".join(lines)


CANDIDATES = ("dapo_rounds", "dapo_stream_discard", "dapo_stream_carry")
"""The DapoReplayBuffer strategies the declared test judges against verl's two buffers (benchmarks/README.md)."""

BAR_RATIO = 0.67
"""Issue 28's bar: engine busy time per step at most this times verl's sync buffer's (1.5x faster)."""


def declared_test(result: dict[str, Any]) -> str:
    """The declared test over the seeds every strategy ran: a Markdown table and each candidate's verdict.

    Per seed: a strategy's engine busy time over verl_sync's (the ratio), its busy time minus verl_async's, and its
    requests per trained response and tokens per trained token minus verl_sync's; means with 95% t-intervals
    (:func:`~dapo_verl.report.stats.paired_t_test`). A candidate meets the bar when the upper end of the ratio's
    interval is at most :data:`BAR_RATIO` and the upper ends of the differences to verl_async's busy time and to
    verl_sync's requests per trained response are at most 0.

    Raises:
        ValueError: without verl_sync and verl_async runs, or with fewer than 2 seeds every strategy ran.
    """
    from dapo_verl.report.stats import paired_t_test

    runs = {name: {r["seed"]: r for r in entry["runs"]} for name, entry in result["strategies"].items()}
    seeds = sorted(set.intersection(*(set(by_seed) for by_seed in runs.values()))) if runs else []
    if len(seeds) < 2 or not {"verl_sync", "verl_async"} <= set(runs):
        raise ValueError(
            f"the test needs verl_sync and verl_async and at least 2 seeds every strategy ran; got "
            f"strategies {sorted(runs)} on seeds {seeds}. Run the missing ones with --seeds."
        )
    sync, async_ = runs["verl_sync"], runs["verl_async"]

    def versus(name: str, key: str, base: dict[int, dict[str, Any]], *, ratio: bool = False) -> Any:
        values = [runs[name][k][key] / base[k][key] - 1 if ratio else runs[name][k][key] - base[k][key] for k in seeds]
        return paired_t_test(values)

    rows = [
        "| strategy | busy s/step | x verl_sync (95% CI) | minus verl_async, s (95% CI) | requests per trained | "
        "minus verl_sync (95% CI) | tokens per trained | minus verl_sync (95% CI) |",
        "|---" * 8 + "|",
    ]
    verdicts = []
    for name in (n for n in STRATEGIES if n in runs):
        mean = {
            key: statistics.fmean(runs[name][k][key] for k in seeds)
            for key in ("engine_busy_s", "requests_per_trained", "tokens_per_trained")
        }
        if name == "verl_sync":
            rows.append(
                f"| {name} | {mean['engine_busy_s']:.2f} | 1 | - | {mean['requests_per_trained']:.2f} | 0 | "
                f"{mean['tokens_per_trained']:.2f} | 0 |"
            )
            continue
        ratio = versus(name, "engine_busy_s", sync, ratio=True)
        busy = versus(name, "engine_busy_s", async_)
        requests = versus(name, "requests_per_trained", sync)
        tokens = versus(name, "tokens_per_trained", sync)
        against_async = "-" if name == "verl_async" else (f"{busy.mean:+.2f} [{busy.ci_low:+.2f}, {busy.ci_high:+.2f}]")
        rows.append(
            f"| {name} | {mean['engine_busy_s']:.2f} | {1 + ratio.mean:.2f} [{1 + ratio.ci_low:.2f}, "
            f"{1 + ratio.ci_high:.2f}] | {against_async} | {mean['requests_per_trained']:.2f} | "
            f"{requests.mean:+.2f} [{requests.ci_low:+.2f}, {requests.ci_high:+.2f}] | "
            f"{mean['tokens_per_trained']:.2f} | "
            f"{tokens.mean:+.2f} [{tokens.ci_low:+.2f}, {tokens.ci_high:+.2f}] |"
        )
        if name in CANDIDATES:
            met = 1 + ratio.ci_high <= BAR_RATIO and busy.ci_high <= 0 and requests.ci_high <= 0
            verdicts.append(f"{name}: {'meets' if met else 'does not meet'} the bar")
    return "\n".join([f"seeds {', '.join(map(str, seeds))}", *rows, "", *verdicts])


EQUAL_BUDGET_VERL = ("verl_async", "verl_async_warmup2")
"""verl's colocate_async buffer at ``num_warmup_batches`` 1 (its default) and 2: its own knob for what it keeps in
flight."""

EQUAL_BUDGET_ARMS = ("dapo_async_rounds", "dapo_async_carry")
"""DapoReplayBuffer in colocate_async: the shipped default (rounds) and streaming with carry kept as long as verl
keeps (benchmarks/README.md, "colocate_async at equal in-flight budgets")."""

NO_MORE_MARGIN = 0.05
"""An arm generates no more than verl's buffer when its excess, upper end of the 95% interval, is at most 5% of verl's
figure (the test's non-inferiority margin)."""


def equal_budget_test(result: dict[str, Any]) -> str:
    """Issue 40's real-engine test: a Markdown table and each arm's verdict against verl's buffer at equal budget.

    Each arm is compared with the verl setting (:data:`EQUAL_BUDGET_VERL`) whose mean requests in flight at vLLM
    (``in_flight``: time-weighted over the engine's busy time) lie nearest its own -- the equal budget, set by verl's
    own knob -- paired by seed over the seeds both ran. Differences (arm minus verl) in requests per trained response
    and tokens per trained token over the whole run (``run_*``, :func:`summarise`), with 95% t-intervals; the arm
    generates no more than verl's buffer when the upper end of each is at most :data:`NO_MORE_MARGIN` of verl's mean.
    Every verl setting that shares 2 seeds with the arm is shown; the verdict is the matched one's (bold).

    Raises:
        ValueError: without a verl setting and an arm that share 2 seeds.
    """
    from dapo_verl.report.stats import paired_t_test

    runs = {name: {r["seed"]: r for r in entry["runs"]} for name, entry in result["strategies"].items()}

    def common(a: str, b: str) -> list[int]:
        return sorted(set(runs[a]) & set(runs[b]))

    def mean(name: str, key: str, seeds: Sequence[int] | None = None) -> float:
        return statistics.fmean(runs[name][k][key] for k in (runs[name] if seeds is None else seeds))

    verl = [v for v in EQUAL_BUDGET_VERL if v in runs]
    pairs = {a: [v for v in verl if len(common(a, v)) >= 2] for a in EQUAL_BUDGET_ARMS if a in runs}
    pairs = {a: vs for a, vs in pairs.items() if vs}
    if not pairs:
        raise ValueError(
            f"the equal-budget test needs one of {', '.join(EQUAL_BUDGET_VERL)} and one of "
            f"{', '.join(EQUAL_BUDGET_ARMS)} on 2 seeds both ran; got "
            f"{ {name: sorted(by_seed) for name, by_seed in runs.items()} }. Run the missing ones with --strategies "
            f"and --seeds."
        )
    rows = [
        "| strategy | seeds | in flight | requests per trained | tokens per trained | busy s/step | against | "
        "requests minus verl (95% CI) | tokens minus verl (95% CI) | no more than verl |",
        "|---" * 10 + "|",
    ]
    for name in verl:
        rows.append(
            f"| {name} | {len(runs[name])} | {mean(name, 'in_flight'):.1f} | "
            f"{mean(name, 'run_requests_per_trained'):.2f} | {mean(name, 'run_tokens_per_trained'):.2f} | "
            f"{mean(name, 'engine_busy_s'):.2f} | - | - | - | - |"
        )
    for name, against in pairs.items():
        matched = min(against, key=lambda v: abs(mean(v, "in_flight") - mean(name, "in_flight")))
        figures = (
            f"| {name} | {len(runs[name])} | {mean(name, 'in_flight'):.1f} | "
            f"{mean(name, 'run_requests_per_trained'):.2f} | {mean(name, 'run_tokens_per_trained'):.2f} | "
            f"{mean(name, 'engine_busy_s'):.2f}"
        )
        for v in against:
            seeds, cells, met = common(name, v), [], True
            for key in ("run_requests_per_trained", "run_tokens_per_trained"):
                test = paired_t_test([runs[name][k][key] - runs[v][k][key] for k in seeds])
                met = met and test.ci_high <= NO_MORE_MARGIN * mean(v, key, seeds)
                cells.append(f"{test.mean:+.2f} [{test.ci_low:+.2f}, {test.ci_high:+.2f}]")
            verdict = "yes" if met else "no"
            label = f"{v}, seeds {seeds[0]}-{seeds[-1]}"
            if v == matched:
                verdict, label = f"**{verdict}**", f"{label} (equal budget)"
            rows.append(f"{figures} | {label} | {cells[0]} | {cells[1]} | {verdict} |")
            figures = "| | | | | |"
    return "\n".join(rows)


def verdicts(result: dict[str, Any]) -> list[str]:
    """The declared tests whose strategies ``result`` holds on at least 2 common seeds: issue 28's
    (:func:`declared_test`) and issue 40's (:func:`equal_budget_test`)."""
    runs = {name: {r["seed"] for r in entry["runs"]} for name, entry in result["strategies"].items()}

    def ran(names: Sequence[str]) -> bool:
        return set(names) <= set(runs) and len(set.intersection(*(runs[n] for n in names))) >= 2

    out = []
    candidates = [n for n in CANDIDATES if n in runs]
    if candidates and ran(("verl_sync", "verl_async", *candidates)):
        out.append(declared_test(result))
    if any(
        len(runs[a] & runs[v]) >= 2 for a in EQUAL_BUDGET_ARMS for v in EQUAL_BUDGET_VERL if a in runs and v in runs
    ):
        out.append(equal_budget_test(result))
    return out


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_stream_engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default: 0)")
    parser.add_argument(
        "--steps", type=int, default=13, help="training steps per run (default: 13; steps 2 to 11 are measured)"
    )
    parser.add_argument(
        "--train-rows",
        type=int,
        default=1024,
        help="rows of the training file, half of them unsolvable (default: 1024)",
    )
    parser.add_argument("--train-batch-size", type=int, default=16, help="prompts per step (default: 16)")
    parser.add_argument("--group-size", type=int, default=8, help="responses per prompt (default: 8)")
    parser.add_argument("--response-length", type=int, default=64, help="response budget, tokens (default: 64)")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=128,
        help="sequences vLLM runs at once (default: 128, a step's first round at once, as a GPU "
        "replica's 256 hold the paper's)",
    )
    add_run_arguments(parser, list(STRATEGIES), "stream_engine")
    parser.add_argument(
        "--report",
        action="store_true",
        help="print the table and the declared test from --out, without running anything",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to the result already in --out instead of replacing it; a strategy and seed it holds is not rerun "
        "(each run records its commit)",
    )
    parser.add_argument(
        "--cpu-profile",
        action="store_true",
        help="sample every process's CPU time during each run (<work>/<strategy>-seed<k>.cpu.jsonl) "
        "and report each role's CPU seconds over the measured steps (benchmarks/cpu_profile.py)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse_args(argv)
    if args.report:
        result = json.loads(Path(args.out).read_text())
        print("\n\n".join([table(result), *verdicts(result)]))
        return result
    result: dict[str, Any] = {
        "benchmark": "bench_stream_engine",
        "commit": commit_id(),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "strategies": {},
    }
    if args.append and args.out.is_file():
        result = json.loads(args.out.read_text())
    done_before = {(name, r["seed"]) for name, entry in result["strategies"].items() for r in entry["runs"]}
    total, done = len(args.strategies) * len(args.seeds), 0
    for seed in args.seeds:  # seeds outermost: an interrupted run still has every strategy on its first seeds
        for strategy in args.strategies:
            done += 1
            if (strategy, seed) in done_before:
                print(f"[{done}/{total}] {strategy} seed {seed}: already in {args.out}, kept", file=sys.stderr)
                continue
            print(
                f"[{done}/{total}] {strategy} seed {seed}: {args.steps} steps on vLLM ...", file=sys.stderr, flush=True
            )
            run = run_one(strategy, seed, args) | {"commit": commit_id()}
            print(json.dumps({k: v for k, v in run.items() if k != "steps"}), flush=True)
            entry = result["strategies"].setdefault(strategy, {"label": STRATEGIES[strategy][0], "runs": []})
            entry["runs"].append(run)
            entry["summary"] = {
                key: spread([r[key] for r in entry["runs"]])
                for key in entry["runs"][0]
                if key not in ("strategy", "seed", "steps", "cpu_s", "commit") and all(key in r for r in entry["runs"])
            }
            write_result(result, args.out)
    print("\n\n".join([table(result), *verdicts(result)]))
    return result


if __name__ == "__main__":
    main()
