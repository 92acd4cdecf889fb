"""The rehearsal's report: what verl logged, which DAPO parts ran, the resume check, what still needs a GPU.

Everything here is read from what verl itself wrote -- the file logger's JSONL of each run -- plus the composed
recipe; nothing is taken from dapo_verl's own objects.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dapo_verl.rehearsal.bridges.weight_probe import weight_sync_check
from dapo_verl.rehearsal.engine import Engine
from dapo_verl.rehearsal.memory import gib
from dapo_verl.rehearsal.options import RehearsalResult
from dapo_verl.rehearsal.processes import RunRecord
from dapo_verl.rehearsal.recipe import component_settings
from dapo_verl.rehearsal.resume_check import REPLICAS_ROUTE, STREAMING_TIMES, resume_check, resume_verdict

__all__ = [
    "PREDICTION_METRICS",
    "REQUIRED_METRICS",
    "ROLLOUT_DIFF_LIMIT",
    "ROLLOUT_METRICS",
    "build_report",
    "read_jsonl",
    "write_report",
]

REQUIRED_METRICS = {
    "dapo/sampler/gen_rounds": "dynamic sampling: generation rounds",
    "dapo/sampler/keep_rate": "dynamic sampling: share of groups kept",
    "dapo/sampler/generated_per_trained": "dynamic sampling: responses generated per response trained",
    "actor/dapo/clip_upper_fraction": "clip-higher: share of tokens clipped at 1 + eps_high",
    "dapo/overlong/penalty_mean": "soft overlong punishment: mean penalty",
    "timing_s/gen": "generation time, every round of the step",
}
"""Metrics a DAPO recipe's rehearsal must find in every training step verl logged."""

PREDICTION_METRICS = (
    "dapo/sampler/predicted_keep_rate",
    "dapo/sampler/prediction_calibration",
    "dapo/sampler/prediction_brier",
)
"""The predictor's calibration metrics (predicted against observed informative groups), logged every step where
the recipe selects prompts by prediction (``algorithm.filter_groups.prompt_selection=predicted``, the default)."""

ROLLOUT_METRICS = (
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_actor_probs_pearson_corr",
)
"""verl's rollout-versus-actor metrics (``verl/utils/debug/metrics.py``): every rehearsal step must log them."""
ROLLOUT_DIFF_LIMIT = 1e-3
"""Largest |p_rollout - p_actor| a rehearsal accepts: float32 on both sides, the same weights (~1e-6 seen)."""

GPU_ONLY = (
    "vLLM on a GPU: its CUDA kernels and bfloat16 sampling, CUDA graphs, sleep mode (free_cache_engine), chunked "
    "prefill with seeded requests, tensor and pipeline parallelism, gpu_memory_utilization and the KV-cache size, "
    "and the CUDA-IPC weight transport (the rehearsal's weights go through shared memory)",
    "FSDP1 (the recipe's strategy=fsdp) and NCCL collectives; the rehearsal runs FSDP2 over gloo",
    "bfloat16 numerics, flash-attention and Ulysses sequence parallelism",
    "the real model's memory and speed: whether it fits with the recipe's offload and micro-batch settings",
    "multi-node placement and the recipe's full batch and sequence sizes",
)


def read_jsonl(path: Path) -> dict[int, dict[str, Any]]:
    """verl file-logger records by step (later records of a step update earlier ones)."""
    steps: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def _training_steps(steps: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {k: v for k, v in steps.items() if "training/global_step" in v}


def _components(result: RehearsalResult, logged: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each DAPO component as the recipe sets it (:func:`.recipe.component_settings`), and whether verl's log shows
    it acted."""
    recipe = result.recipe
    seen = set().union(*logged.values()) if logged else set()
    evidence = {
        "decoupled-clip loss": (
            recipe.get("actor_rollout_ref.actor.policy_loss.loss_mode") == "dapo"
            and "actor/dapo/clip_upper_fraction" in seen,
            "actor/dapo/clip_*_fraction logged",
        ),
        "group advantage": ("critic/advantages/mean" in seen, "critic/advantages/* logged"),
        "reward manager": ("critic/score/mean" in seen, "critic/score/* logged"),
        "soft overlong punishment": (
            "dapo/overlong/penalty_mean" in seen or any(k.endswith("/overlong_penalty/mean@1") for k in seen),
            "dapo/overlong/penalty_mean logged (verl's own trainer: the validation's overlong_penalty)",
        ),
        "overlong filtering": (
            bool(recipe.get("algorithm.overlong_filtering")) and "dapo/overlong/filtered_fraction" in seen,
            "dapo/overlong/filtered_fraction logged",
        ),
        "dynamic sampling (batch replenisher)": ("dapo/sampler/gen_rounds" in seen, "dapo/sampler/* logged"),
        "prompt prediction": (
            all(key in seen for key in PREDICTION_METRICS),
            "dapo/sampler/predicted_keep_rate, prediction_calibration, prediction_brier logged",
        ),
    }
    return [
        {"component": name, "setting": setting, "active": evidence[name][0], "evidence": evidence[name][1]}
        for name, setting in component_settings(recipe).items()
    ]


def _engine_label(result: RehearsalResult, run: RunRecord | None) -> tuple[str, bool]:
    """The engine as the run ran it -- the version vLLM's own processes recorded, or ``stand-in`` -- and whether
    it started."""
    if result.engine.engine is Engine.STAND_IN:
        return Engine.STAND_IN.value, True
    records = sorted(run.records.glob("engine-*.json")) if run is not None and run.records else []
    versions = sorted({json.loads(path.read_text())["distribution"] for path in records})
    return (f"vllm {', '.join(versions)}", True) if versions else ("vllm (no vLLM process started)", False)


def _rollout_check(trained: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """verl's rollout-versus-actor metrics of every step, and whether each is logged and within the limit."""
    steps = {step: {key: data.get(key) for key in ROLLOUT_METRICS} for step, data in sorted(trained.items())}
    bad = [
        step
        for step, values in steps.items()
        if not isinstance(values[ROLLOUT_METRICS[0]], (int, float))
        or not math.isfinite(values[ROLLOUT_METRICS[0]])
        or values[ROLLOUT_METRICS[0]] > ROLLOUT_DIFF_LIMIT
        or any(values[key] is None for key in ROLLOUT_METRICS)
    ]
    return {"ok": bool(steps) and not bad, "limit": ROLLOUT_DIFF_LIMIT, "steps": steps, "failed_steps": bad}


def _engine_sections(result: RehearsalResult, trained: dict[int, dict[str, Any]]) -> dict[str, Any]:
    first = result.runs[0] if result.runs else None
    label, started = _engine_label(result, first)
    sections: dict[str, Any] = {
        "rollout_engine": label,
        "engine_started": started,
        "engine_reason": result.engine.reason,
        "environment": {name: value for name, (value, _) in result.environment.items()},
        "rollout_vs_actor": _rollout_check(trained),
        "leftovers_removed": {
            run.name: {"entries": len(run.leftovers_removed), "bytes": sum(size for _, size in run.leftovers_removed)}
            for run in result.runs
        },
    }
    if result.engine.engine is Engine.VLLM and first is not None and first.records is not None:
        sections["weight_sync"] = weight_sync_check(first.records)
    return sections


def _memory(result: RehearsalResult) -> dict[str, Any]:
    """The peak memory of the rehearsal's processes, overall and per run: the sum of their proportional set sizes
    (what they hold) and of their resident set sizes (an upper bound), :mod:`.memory`."""
    peaks = result.memory
    if peaks is None:
        return {"peak_pss_bytes": None, "peak_rss_bytes": None, "runs": {}}
    return {
        "peak_pss_bytes": peaks.pss.bytes,
        "peak_rss_bytes": peaks.total.bytes,
        "peak_processes": peaks.total.processes,
        "available_min_bytes": peaks.available_min_bytes,
        "samples": peaks.samples,
        "interval_s": peaks.interval_s,
        "pss_interval_s": peaks.pss_interval_s,
        "pss_reads": peaks.pss_reads,
        "overlap_resume": result.options.overlap,
        "runs": {
            name: {
                "peak_pss_bytes": peaks.runs_pss[name].bytes,
                "peak_rss_bytes": peak.bytes,
                "peak_processes": peak.processes,
            }
            for name, peak in peaks.runs.items()
        },
    }


def _run_entries(
    result: RehearsalResult, logs: dict[str, dict[int, dict[str, Any]]], memory: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every run that was to start: how it ended (``state``), what it logged, its error and memory peak."""
    runs = []
    for run in result.runs:
        trained = _training_steps(logs[run.name])
        step_times = [v["timing_s/step"] for v in trained.values() if "timing_s/step" in v]
        peak = memory["runs"].get(run.log.parent.name, {})
        runs.append(
            {
                "name": run.name,
                "state": run.state,
                "returncode": run.returncode,
                "wall_s": round(run.wall_s, 1),
                "log": str(run.log),
                "metrics": str(run.metrics),
                "steps_logged": sorted(trained),
                "error": run.error,
                "first_error": run.first_error,
                "stopped_by": run.stopped_by,
                "memory_kill": run.memory_kill,
                "time_per_step_s": round(sum(step_times) / len(step_times), 2) if step_times else None,
                "peak_pss_bytes": peak.get("peak_pss_bytes"),
                "peak_rss_bytes": peak.get("peak_rss_bytes"),
                "peak_processes": peak.get("peak_processes"),
            }
        )
    runs += [
        {
            "name": name,
            "state": "not started",
            "why": why,
            "returncode": None,
            "wall_s": 0.0,
            "log": None,
            "metrics": None,
            "steps_logged": [],
            "error": "",
            "first_error": "",
            "time_per_step_s": None,
            "peak_pss_bytes": None,
            "peak_rss_bytes": None,
        }
        for name, why in result.not_started.items()
    ]
    return runs


def build_report(result: RehearsalResult) -> dict[str, Any]:
    """The report as plain data (``report.json``)."""
    logs = {run.name: read_jsonl(run.metrics) for run in result.runs}
    memory = _memory(result)
    first = _training_steps(logs.get(result.runs[0].name, {})) if result.runs else {}
    missing = {step: [k for k in REQUIRED_METRICS if k not in data] for step, data in first.items()}
    dapo_recipe = result.entry_module == "dapo_verl.main"
    report: dict[str, Any] = {
        "config": result.options.config_name,
        "entry": result.entry,
        "ok": bool(result.runs) and all(r.returncode == 0 for r in result.runs) and not result.not_started,
        "interrupted_by": result.interrupted_by,
        "report": str(result.options.out_dir / "report.md"),
        "runs": _run_entries(result, logs, memory),
        "peak_pss_bytes": memory["peak_pss_bytes"],
        "peak_rss_bytes": memory["peak_rss_bytes"],
        "memory": memory,
        "changes": [
            {"key": c.key, "recipe": c.recipe, "rehearsal": c.rehearsal, "reason": c.reason, "group": c.group}
            for c in result.changes
        ],
        "data": {
            "train_file": str(result.data.train_file),
            "val_file": str(result.data.val_file),
            "recipe_train_rows": result.data.real_train_rows,
            "recipe_val_rows": result.data.real_val_rows,
            "generated_train_rows": result.data.generated_train_rows,
            "recipe_files": list(result.data.sources),
        },
        "model": {"path": result.model_path, "stand_in": result.model_replaced},
        "components": _components(result, logs.get(result.runs[0].name, {}) if result.runs else {}),
        "metrics_logged": sorted(set().union(*first.values())) if first else [],
        "missing_required_metrics": {s: m for s, m in missing.items() if m} if dapo_recipe else {},
        "not_checked": list(GPU_ONLY),
        **_engine_sections(result, first),
    }
    if len(result.runs) > 1 and result.runs[1].returncode == 0:
        second = _training_steps(logs[result.runs[1].name])
        report["resume"] = resume_check(first, second, result.options.steps)
        # One replica regenerates the same groups. With several -- more fake GPUs, or separate_async lending the
        # trainer's replica to generation -- verl routes each request to the less busy one, and taking lent GPUs back
        # aborts what they were generating (trainer_separate_async.py switch_to_trainer), which another replica then
        # finishes from its prefix: which requests that hits depends on timing.
        # Streaming: the batch fills with the groups seen finished first, and which finished between two polls of
        # TransferQueue depends on timing.
        lends = result.recipe.get("trainer.v1.trainer_mode") == "separate_async" and bool(
            result.recipe.get("trainer.v1.separate_async.hybrid_rollout.enable_switch")
        )
        why = (
            REPLICAS_ROUTE
            if result.options.gpus * result.options.nodes != 1 or lends
            else STREAMING_TIMES
            if result.recipe.get("algorithm.filter_groups.streaming")
            else ""
        )
        report["resume"]["required"] = not why
        report["resume"]["why_not_required"] = why
    engine_ok = (
        report["engine_started"] and report["rollout_vs_actor"]["ok"] and report.get("weight_sync", {"ok": True})["ok"]
    )
    resume_ok = "resume" not in report or not report["resume"]["required"] or report["resume"]["data_identical"]
    if result.cluster is not None:
        report["cluster"] = result.cluster
    cluster_ok = result.cluster is None or result.cluster["ok"]
    if (
        (dapo_recipe and report["missing_required_metrics"])
        or (first and not (engine_ok and resume_ok))
        or (not cluster_ok)
    ):
        report["ok"] = False
    report["state"] = "interrupted" if result.interrupted_by else "passed" if report["ok"] else "failed"
    return report


def _per_step(run: dict[str, Any]) -> str:
    return "-" if run["time_per_step_s"] is None else f"{run['time_per_step_s']} s"


def _engine_lines(report: dict[str, Any]) -> list[str]:
    """The engine section of report.md: which engine ran, verl's rollout-versus-actor metrics, the weight sync."""
    check = report["rollout_vs_actor"]
    lines = [
        "",
        "## Rollout engine",
        "",
        f"**{report['rollout_engine']}** ({report['engine_reason']}).",
        "",
        f"verl's rollout-versus-actor metrics (limit: probs diff max <= {check['limit']:g}; "
        f"{'every step within it' if check['ok'] else 'FAILED at steps ' + str(check['failed_steps'])}):",
        "",
        "| step | " + " | ".join(f"`{k}`" for k in ROLLOUT_METRICS) + " |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {step} | " + " | ".join("-" if v is None else f"{v:.3g}" for v in values.values()) + " |"
        for step, values in check["steps"].items()
    ]
    sync = report.get("weight_sync")
    if sync is not None:
        lines += [
            "",
            f"Weight sync: {'reached the engine' if sync['ok'] else 'NOT SHOWN'}: {sync['reason']}.",
            "",
            "| replica | push (global step) | engine = sent weights | max log-prob diff | output changed by it |",
            "|---|---|---|---|---|",
        ]
        for row in sync["rows"]:
            if not row["probed"]:
                lines.append(f"| {row['replica']} | {row['global_steps']} | no request followed | - | - |")
                continue
            changed = (
                "-"
                if "tokens_changed" not in row
                else f"{'tokens changed' if row['tokens_changed'] else 'same tokens'}, "
                f"log-probs by up to {row['logp_max_change']:.2g}"
            )
            lines.append(
                f"| {row['replica']} | {row['global_steps']} | {'yes' if row['tokens_equal'] else 'NO'} | "
                f"{row['logp_max_diff']:.1e} | {changed} |"
            )
    left = {name: v for name, v in report["leftovers_removed"].items() if v["entries"]}
    if left:
        removed = "; ".join(f"{name}: {v['entries']} entries, {v['bytes'] / 2**20:.0f} MiB" for name, v in left.items())
        lines += ["", f"Removed after the runs from /dev/shm, created by their processes and left behind: {removed}."]
    return lines


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Rehearsal of `{report['config']}`",
        "",
        f"Entry point: `python {report['entry']}`, rollout engine `{report['rollout_engine']}`. "
        f"Result: **{_verdict(report)}**.",
        "",
    ]
    lines += [
        "| run | state | exit | wall time | steps logged | time per step | peak memory (PSS / sum of RSS) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        lines.append(
            f"| {run['name']} | {run['state']} | {run['returncode']} | {run['wall_s']} s | "
            f"{run['steps_logged']} | {_per_step(run)} | {gib(run['peak_pss_bytes'])} / "
            f"{gib(run['peak_rss_bytes'])} |"
        )
        if run["state"] == "not started":
            lines += ["", f"**{run['name']} did not start:** {run['why']}.", ""]
        elif run["error"]:
            lines += ["", f"**{run['name']} failed:** `{run['error']}` (full log: `{run['log']}`)", ""]
            if run["first_error"] and run["first_error"] != run["error"]:
                lines += [f"The first error it printed, often the cause: `{run['first_error']}`", ""]
    lines += ["", _memory_line(report)]
    if "cluster" in report:
        from dapo_verl.rehearsal.multinode import cluster_lines

        lines += ["", "## Cluster", "", "```", *cluster_lines(report["cluster"]), "```"]
    lines += ["", "## DAPO components", "", "| component | recipe setting | active | evidence |", "|---|---|---|---|"]
    lines += [
        f"| {c['component']} | {c['setting']} | {'yes' if c['active'] else 'no'} | {c['evidence']} |"
        for c in report["components"]
    ]
    lines += _engine_lines(report)
    if "resume" in report:
        resume = report["resume"]
        lines += [
            "",
            "## Resume",
            "",
            f"Step {resume['step']} trained again after resuming from the checkpoint of "
            f"step {resume['step'] - 1}: {resume['compared']} logged values compared with the uninterrupted run, "
            f"{resume_verdict(resume)}.",
        ]
        lines += [f"- {d}" for d in resume["differences"][:20]]
    if report["missing_required_metrics"]:
        lines += ["", "## Missing metrics", ""]
        lines += [f"- step {s}: {', '.join(m)}" for s, m in report["missing_required_metrics"].items()]
    lines += ["", "## Keys changed for the CPU run", "", "| key | recipe | rehearsal | why |", "|---|---|---|---|"]
    lines += [f"| `{c['key']}` | {c['recipe']} | {c['rehearsal']} | {c['reason']} |" for c in report["changes"]]
    data, model = report["data"], report["model"]
    lines += [
        "",
        "## Data and model",
        "",
        f"- training file: {data['recipe_train_rows']} rows from the recipe's files, "
        f"{data['generated_train_rows']} generated; validation: "
        f"{data['recipe_val_rows'] or 'generated'} rows from the recipe's files",
        f"- model: {'stand-in built in code' if model['stand_in'] else 'the recipe own'} ({model['path']})",
        "",
        "## Not checked here (needs a GPU run)",
        "",
    ]
    lines += [f"- {item}" for item in report["not_checked"]]
    lines += [
        "",
        f"Metrics verl logged each step ({len(report['metrics_logged'])}): "
        + ", ".join(f"`{m}`" for m in report["metrics_logged"]),
    ]
    return "\n".join(lines) + "\n"


def write_report(result: RehearsalResult) -> dict[str, Any]:
    """Write ``report.json`` and ``report.md`` into the rehearsal folder; return the report."""
    report = build_report(result)
    out = result.options.out_dir
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(_markdown(report))
    return report


def _verdict(report: dict[str, Any]) -> str:
    return (
        f"interrupted by {report['interrupted_by']}"
        if report["interrupted_by"]
        else ("passed" if report["ok"] else "FAILED")
    )


def _memory_line(report: dict[str, Any]) -> str:
    memory = report["memory"]
    if memory["peak_rss_bytes"] is None:
        return "memory: not measured"
    runs = ", ".join(
        f"{name} {gib(peak['peak_pss_bytes'])}" for name, peak in memory["runs"].items() if peak["peak_processes"]
    )
    mode = "overlapped" if memory["overlap_resume"] else "after the first run"
    return (
        f"memory: the rehearsal's processes held up to {gib(memory['peak_pss_bytes'])} (sum of their "
        f"proportional set sizes, read {memory['pss_reads']} times; {runs or 'no run'}; resume run {mode}); "
        f"the sum of their RSS, counting shared pages once per process, peaked at "
        f"{gib(memory['peak_rss_bytes'])} over {memory['peak_processes']} processes; this machine had "
        f"{gib(memory['available_min_bytes'])} available at the least"
    )


def _run_status(run: dict[str, Any]) -> str:
    if run["state"] == "not started":
        return f"not started: {run['why']}"
    status = {"finished": "ok", "failed": "FAILED: "}.get(run["state"], f"{run['state']}: ") + (
        "" if run["state"] == "finished" else run["error"]
    )
    if run["state"] == "failed" and run["first_error"] and run["first_error"] != run["error"]:
        status += f" (first error: {run['first_error']})"
    return status


def summary_lines(report: dict[str, Any]) -> list[str]:
    """A short console summary of the report."""
    lines = []
    for run in report["runs"]:
        lines.append(
            f"{run['name']}: steps {run['steps_logged']}, {run['wall_s']} s, {_per_step(run)} per step, "
            f"held up to {gib(run['peak_pss_bytes'])} -- {_run_status(run)}"
        )
    lines.append(_memory_line(report))
    active = [c["component"] for c in report["components"] if c["active"]]
    lines.append(f"DAPO components active: {', '.join(active) or 'none'}")
    check = report["rollout_vs_actor"]
    diffs = [v[ROLLOUT_METRICS[0]] for v in check["steps"].values() if isinstance(v[ROLLOUT_METRICS[0]], float)]
    lines.append(
        f"rollout engine: {report['rollout_engine']}; rollout vs actor probs diff max per step "
        f"{', '.join(f'{d:.1e}' for d in diffs) or '-'} "
        f"({'within' if check['ok'] else 'NOT within'} {check['limit']:g})"
    )
    if "weight_sync" in report:
        lines.append(f"weight sync: {report['weight_sync']['reason']}")
    if "resume" in report:
        r = report["resume"]
        lines.append(
            f"resume: step {r['step']} after the resume vs uninterrupted: {r['compared']} values, {resume_verdict(r)}"
        )
    if "cluster" in report:
        from dapo_verl.rehearsal.multinode import cluster_lines

        lines += cluster_lines(report["cluster"])
    for step, metrics in report["missing_required_metrics"].items():
        lines.append(f"step {step} lacks {', '.join(metrics)}")
    lines.append(f"{_verdict(report).upper()}; report: {report['report']}")
    return lines
