"""What a run would refuse is refused before it starts, and nothing reports ok over bad input -- tried as users trip it.

Each check returns a :class:`~tools.reliability.guards.GuardResult`, one attempt per way a user (or a caller
of the Python API) gets it wrong; the commands run as a user runs them, each in a process of its own.

* :func:`preflight_refusals` -- ``dapo-verl doctor``, ``python -m dapo_verl.main --cfg job`` (the recipes' dry
  run), ``dapo-verl rehearse`` and ``dapo-verl train`` given overrides a run refuses (a misspelt key, a deletion,
  a name verl does not know, a group of one): each refused with a non-zero exit and one line per problem naming
  its key, ``doctor`` printing no ``[ok]`` for the config; ``dapo_trainer`` as shipped passes.
* :func:`honest_reports` -- ``compare`` of a run whose accuracy went NaN, ``prepare-data`` twice into one folder,
  a finished run started again, a resume after ``metrics.jsonl`` lost steps: the final value reported missing
  and flagged, the first manifest entry kept, nothing rewritten, the gap refused.
* :func:`silent_changes` -- a deletion (``~key``), ``data.seed`` changed under a checkpoint with
  ``--allow-config-change``, infinite log-probs and rewards given to the core API, overlong schedules that
  leave [0, 1]: each refused naming the key, argument or schedule.
* :func:`edge_errors` -- a checkpoint write that fails (a real ``EFBIG`` from the kernel under a file-size limit),
  ``toy --out`` naming a file, a seed too large, a clip bound beyond float32, broken ``generate`` callbacks and
  damaged sampler states: one line and exit 2 (or a clear error from the API), nothing half-written, the clip
  run finishing.
"""

from __future__ import annotations

import json
import math
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.reliability.guards import GuardResult, cli_command, one_line_error

__all__ = ["REFUSAL_CHECKS", "edge_errors", "honest_reports", "preflight_refusals", "silent_changes"]

_TIMEOUT_S = 600


def _run(command: Sequence[str], *, limit_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (optionally under a file-size limit) and capture its output."""

    def limited() -> None:
        assert limit_bytes is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        preexec_fn=limited if limit_bytes is not None else None,
    )


def _failures(checks: Sequence[tuple[bool, str]]) -> list[str]:
    return [why for ok, why in checks if not ok]


def _tiny(cache: Path, steps: int = 4) -> list[str]:
    from tools.reliability.runs import tiny_overrides

    return tiny_overrides(steps=steps, seed=0, cache_dir=cache)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- the pre-flight check ------------------------------------------------------------------------------------

_DOCTOR_REFUSED = {  # override -> the key its line must name
    "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo": "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.clip_ratio_hihg=0.3": "actor_rollout_ref.actor.clip_ratio_hihg",
    "+actor_rollout_ref.actor.optim.lrr=1e-6": "actor_rollout_ref.actor.optim.lrr",
    "~data.train_batch_size": "data.train_batch_size",
    "actor_rollout_ref.rollout.n=1": "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.name=vlm": "actor_rollout_ref.rollout.name",
}


def _names_each(lines: Sequence[str], refused: dict[str, str]) -> list[str]:
    return [f"no line names {key}" for key in refused.values() if not any(key in line for line in lines)]


def preflight_refusals(work: Path) -> GuardResult:
    """Overrides a run refuses, given to doctor, the dry run, rehearse and train (see the module docstring)."""
    result = GuardResult("pre-flight refusals")
    doctor = _run(cli_command("doctor", "dapo_qwen2.5_32b", *_DOCTOR_REFUSED))
    failed = [line for line in doctor.stdout.splitlines() if line.startswith("[FAIL] config:")]
    result.attempt(
        "doctor with six overrides a run refuses",
        _failures(
            [
                (doctor.returncode != 0, "exit status 0"),
                (len(failed) == len(_DOCTOR_REFUSED), f"{len(failed)} lines"),
                ("[ok] config" not in doctor.stdout, "[ok] printed for the config"),
                ("Traceback" not in doctor.stdout + doctor.stderr, "a traceback"),
            ]
        )
        + _names_each(failed, _DOCTOR_REFUSED),
    )
    shipped = _run(cli_command("doctor", "dapo_trainer"))
    result.attempt(
        "doctor on dapo_trainer as shipped",
        _failures(
            [
                (shipped.returncode == 0, f"exit status {shipped.returncode}: {shipped.stdout[-300:]!r}"),
                (
                    "[ok] config: dapo_trainer passes:" in shipped.stdout
                    and "verl's validate_config" in shipped.stdout,
                    "no [ok] line for the checks that ran",
                ),
            ]
        ),
    )
    dry = _run(
        [
            sys.executable,
            "-m",
            "dapo_verl.main",
            "--config-name",
            "dapo_qwen2.5_32b",
            "--cfg",
            "job",
            "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo",
            "actor_rollout_ref.actor.clip_ratio_hihg=0.3",
        ]
    )
    lines = [line for line in dry.stderr.splitlines() if line.startswith("python -m dapo_verl.main: ")]
    result.attempt(
        "the recipes' dry run (python -m dapo_verl.main --cfg job)",
        _failures(
            [
                (dry.returncode == 2, f"exit status {dry.returncode}"),
                (len(lines) == 2, f"{len(lines)} problem lines"),
                ("Traceback" not in dry.stderr, "a traceback"),
            ]
        )
        + _names_each(lines, {"a": "policy_loss.loss_mode", "b": "clip_ratio_hihg"}),
    )
    out = work / "rehearsal"
    rehearse = _run(
        cli_command("rehearse", "dapo_trainer", "actor_rollout_ref.actor.clip_ratio_hihg=0.3", "--out", str(out))
    )
    train = _run(cli_command("train", "actor_rollout_ref.actor.clip_ratio_hihg=0.3", "--print-config"))
    for what, done in (("rehearse", rehearse), ("train", train)):
        line = one_line_error(done.stderr) or ""
        result.attempt(
            f"{what} with a misspelt key",
            _failures(
                [
                    (done.returncode == 2, f"exit status {done.returncode}"),
                    (
                        "did you mean actor_rollout_ref.actor.clip_ratio_high?" in line,
                        f"unclear: {done.stderr[-300:]!r}",
                    ),
                    (what != "rehearse" or not out.exists(), "the rehearsal wrote its --out"),
                ]
            ),
        )
    return result


# -- reports -------------------------------------------------------------------------------------------------


def _write_jsonl(path: Path, records: Sequence[tuple[int, dict[str, Any]]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in records))
    return path


def _compare_nan_final(work: Path) -> list[str]:
    acc = "val-core/copy3/acc/mean@1"
    nan = _write_jsonl(work / "nan" / "metrics.jsonl", [(0, {acc: 0.1}), (5, {acc: 0.6}), (10, {acc: None})])
    good = _write_jsonl(work / "good" / "metrics.jsonl", [(0, {acc: 0.1}), (10, {acc: 0.5})])
    done = _run(cli_command("compare", str(nan.parent), str(good.parent), "--out", str(work / "report")))
    return _failures(
        [
            (done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-300:]!r}"),
            (f"| `{acc}` | nan | 0/1 | n/a |" in done.stdout, "the last finite value shown as final"),
            (done.stdout.count("is NaN, inf or null at step 10") == 1, "no warning, or one printed twice"),
            ('listed under "Warnings"' in done.stderr, "stderr does not say that the report holds warnings"),
        ]
    )


def _prepare_twice(work: Path) -> list[str]:
    from tools.reliability.guards import write_problems

    problems = [(f"Problem {i}: what is {i} + {i}?".encode(), str(2 * i).encode()) for i in range(30)]
    train, aime = (
        write_problems(work / "in" / "t.parquet", problems),
        write_problems(work / "in" / "a.parquet", problems),
    )
    out = work / "data"
    first = _run(cli_command("prepare-data", "--dapo-math", str(train), "--out", str(out)))
    entry = (
        json.loads((out / "prepare_data.json").read_text())["outputs"].get("train.parquet")
        if first.returncode == 0
        else None
    )
    second = _run(cli_command("prepare-data", "--aime", str(aime), "--out", str(out)))
    outputs = json.loads((out / "prepare_data.json").read_text())["outputs"]
    return _failures(
        [
            (first.returncode == second.returncode == 0, f"exit {first.returncode}, {second.returncode}"),
            (outputs.get("train.parquet") == entry and entry is not None, "the first run's entry changed or is lost"),
            ("aime-2024.parquet" in outputs, "the second run's entry is missing"),
        ]
    )


def honest_reports(work: Path) -> GuardResult:
    """Reports and re-runs over bad input (see the module docstring)."""
    from dapo_verl.local.train import run

    result = GuardResult("honest reports")
    result.attempt("compare of a run whose accuracy went NaN", _compare_nan_final(work / "compare"))
    result.attempt("prepare-data twice into one folder", _prepare_twice(work / "prepare"))
    cache, out = work / "cache", work / "run"
    run(_tiny(cache), out)
    before = _snapshot(out)
    again = _run(cli_command("train", "--out", str(out), *_tiny(cache)))
    shorter = _run(cli_command("train", "--out", str(out), *_tiny(cache, steps=3)))
    result.attempt(
        "a finished run started again, the same length and shorter",
        _failures(
            [
                (again.returncode == 0 and shorter.returncode == 2, f"exit {again.returncode}, {shorter.returncode}"),
                (
                    "more than trainer.total_training_steps=3" in (one_line_error(shorter.stderr) or ""),
                    "unclear refusal",
                ),
                (_snapshot(out) == before, "a recorded file changed"),
            ]
        ),
    )
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(lines[:2]))
    before = _snapshot(out)
    gap = _run(cli_command("train", "--out", str(out), *_tiny(cache, steps=6)))
    result.attempt(
        "a resume after metrics.jsonl lost steps",
        _failures(
            [
                (gap.returncode == 2, f"exit {gap.returncode}"),
                ("lacks step(s) 2, 3, 4" in (one_line_error(gap.stderr) or ""), f"unclear: {gap.stderr[-300:]!r}"),
                (_snapshot(out) == before, "the run directory changed"),
            ]
        ),
    )
    return result


# -- silently different runs ---------------------------------------------------------------------------------


def _raises(call: Callable[[], Any], words: str) -> list[str]:
    try:
        call()
    except (ValueError, TypeError) as err:
        return [] if words in str(err) else [f"unclear: {err}"]
    return ["accepted"]


def _core_refusals() -> list[str]:
    import torch

    from dapo_verl import core

    logp, old = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-1.0, -0.7]])
    mask, adv = torch.ones(1, 2, dtype=torch.bool), torch.tensor([1.0])
    return [
        *_raises(lambda: core.dapo_loss(torch.tensor([[math.inf, -0.5]]), old, adv, mask), "logp is inf"),
        *_raises(lambda: core.dapo_loss(logp, torch.tensor([[-math.inf, -0.5]]), adv, mask), "old_logp is -inf"),
        *_raises(lambda: core.dynamic_group_mask(torch.tensor([[1.0, math.inf]])), "rewards contains"),
        *_raises(lambda: core.group_advantages(torch.tensor([[1.0, -math.inf]])), "rewards contains"),
    ]


def _schedule_refusals() -> list[str]:
    import torch

    from dapo_verl import core

    saved = dict(core.OVERLONG_SCHEDULES._entries)
    failures = []
    try:
        for name, ramp in {
            "nan": lambda x: x * math.nan,
            "above_one": lambda x: 1.5 * x,
            "before_buffer": lambda x: x + 0.1,
        }.items():
            core.register_overlong_schedule(f"reliability_{name}")(ramp)
            failures += _raises(
                lambda n=name: core.reward_overlong_penalty(
                    torch.ones(3), torch.tensor([5, 18, 30]), 20, 4, 1.0, schedule=f"reliability_{n}"
                ),
                f"overlong schedule 'reliability_{name}' returned",
            )
    finally:
        core.OVERLONG_SCHEDULES._entries.clear()
        core.OVERLONG_SCHEDULES._entries.update(saved)
    return failures


def silent_changes(work: Path) -> GuardResult:
    """Changes that would make a run silently different (see the module docstring)."""
    from dapo_verl.local.train import run

    result = GuardResult("silent changes")
    deletion = _run(cli_command("train", "~data.train_batch_size", "--print-config"))
    result.attempt(
        "a deletion (~data.train_batch_size)",
        _failures(
            [
                (deletion.returncode == 2, f"exit {deletion.returncode}"),
                (
                    "~data.train_batch_size (16 in the config) deletes the key"
                    in (one_line_error(deletion.stderr) or ""),
                    f"unclear: {deletion.stderr[-300:]!r}",
                ),
            ]
        ),
    )
    cache, out = work / "cache", work / "run"
    run(_tiny(cache), out)
    before = _snapshot(out)
    moved = [o for o in _tiny(cache, steps=6) if not o.startswith("data.seed=")] + ["data.seed=5"]
    seed = _run(cli_command("train", "--out", str(out), "--allow-config-change", *moved))
    result.attempt(
        "data.seed changed under a checkpoint, with --allow-config-change",
        _failures(
            [
                (seed.returncode == 2, f"exit {seed.returncode}"),
                ("held-out split" in (one_line_error(seed.stderr) or ""), f"unclear: {seed.stderr[-300:]!r}"),
                (_snapshot(out) == before, "the run directory changed"),
            ]
        ),
    )
    result.attempt("infinite log-probs and rewards given to the core API", _core_refusals())
    result.attempt("overlong schedules that leave [0, 1] or penalise before the buffer", _schedule_refusals())
    return result


# -- errors at the edges -------------------------------------------------------------------------------------


def _sampler_refusals() -> list[str]:
    import torch

    from dapo_verl.config import SamplerConfig
    from dapo_verl.sampler import BatchReplenisher, GroupResult

    def sampler(generate: Callable[[Any], Any]) -> BatchReplenisher:
        return BatchReplenisher(SamplerConfig(train_batch_size=2), 10, generate)

    def group(i: int, **fields: Any) -> GroupResult:
        return GroupResult(
            i,
            **{
                "metric": torch.tensor([0.0, 1.0]),
                "response_lengths": torch.tensor([3, 4]),
                "truncated": torch.tensor([False, False]),
                **fields,
            },
        )

    good = sampler(lambda ids: [group(i) for i in ids])
    failures = [
        *_raises(lambda: sampler(lambda ids: None).next_batch(), "generate returned NoneType"),
        *_raises(lambda: sampler(lambda ids: [{"prompt_id": i} for i in ids]).next_batch(), "generate returned a dict"),
        *_raises(
            lambda: sampler(lambda ids: [group(i, metric=[0.0, 1.0]) for i in ids]).next_batch(), "metric is a list"
        ),
        *_raises(
            lambda: sampler(lambda ids: [group(i, response_lengths=torch.tensor([-1, 2])) for i in ids]).next_batch(),
            "response_lengths holds",
        ),
        *_raises(lambda: good.load_state_dict(None), "the sampler state is NoneType"),  # type: ignore[arg-type]
        *_raises(
            lambda: good.load_state_dict({k: v for k, v in good.state_dict().items() if k != "stream"}),
            "'stream' is missing",
        ),
    ]
    return failures + ([] if len(good.next_batch().groups) == 2 else ["the refused loads changed the sampler"])


def _failed_checkpoint_write(work: Path) -> list[str]:
    """A checkpoint that outgrows a 1 MiB file-size limit: the kernel's EFBIG, as a full disk would fail it."""
    from dapo_verl.local.train import run

    cache, out = work / "cache", work / "limited"
    run(_tiny(cache, steps=1), work / "warm")  # build the cached model without the limit
    done = _run(cli_command("train", "--out", str(out), *_tiny(cache)), limit_bytes=1 << 20)
    line = one_line_error(done.stderr) or ""
    left = [p.name for p in (out / "checkpoints").rglob("*") if p.is_file()] if (out / "checkpoints").exists() else []
    resumed = run(_tiny(cache), out)
    return _failures(
        [
            (done.returncode == 2, f"exit {done.returncode}: {done.stderr[-300:]!r}"),
            ("File too large" in line and "global_step_2/state.safetensors" in line, f"unclear: {line!r}"),
            (left == [], f"half-written files {left}"),
            (resumed.steps == 4, "the run did not finish afterwards"),
        ]
    )


def edge_errors(work: Path) -> GuardResult:
    """Failures at the edges, each one line (see the module docstring)."""
    from dapo_verl.local.train import run

    result = GuardResult("edge errors")
    result.attempt("a checkpoint write that fails (EFBIG under a file-size limit)", _failed_checkpoint_write(work))
    file = work / "notes.txt"
    file.write_text("mine")
    toy = _run(cli_command("toy", "--out", str(file)))
    seed = _run(cli_command("train", "data.seed=99999999999999999999", "--print-config"))
    for what, done, words in (
        ("toy --out naming a file", toy, "not a file"),
        ("a seed beyond 2**32 - 1", seed, "data.seed=99999999999999999999 must lie in"),
    ):
        result.attempt(
            what,
            _failures(
                [
                    (done.returncode == 2, f"exit {done.returncode}"),
                    (words in (one_line_error(done.stderr) or ""), f"unclear: {done.stderr!r}"),
                ]
            ),
        )
    clip = run(
        [
            *_tiny(work / "cache", steps=2),
            "actor_rollout_ref.actor.clip_ratio_high=1e308",
            "actor_rollout_ref.actor.clip_ratio_c=1e308",
        ],
        work / "clip",
    )
    result.attempt("clip bounds beyond float32 (1e308)", [] if clip.steps == 2 else ["the run did not finish"])
    result.attempt("broken generate callbacks and damaged sampler states", _sampler_refusals())
    shutil.rmtree(work / "clip", ignore_errors=True)
    return result


REFUSAL_CHECKS: dict[str, Callable[[Path], GuardResult]] = {
    "pre-flight refusals": preflight_refusals,
    "honest reports": honest_reports,
    "silent changes": silent_changes,
    "edge errors": edge_errors,
}
"""Every check of this module, by name; each takes a fresh work directory."""
