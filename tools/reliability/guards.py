"""The guards around a run's outputs, tried the way users trip them: together, again, halfway, damaged, Ctrl-C.

Each check returns a :class:`GuardResult`: attempts, how many were handled as promised, and every problem.

* :func:`concurrent_writers` -- a real ``dapo-verl train`` holds a run directory while a second one starts on
  it: the second must exit 2 naming the holder's pid, and write nothing. The holder is then SIGKILLed and a
  third run must take over the lock it left, resume from its checkpoint and finish.
* :func:`changed_reruns` -- a finished run is started again with a changed setting (clip_ratio_high; data.seed
  and the model size even with ``--allow-config-change``) and with a checkpoint copied in from another seed: each
  must be refused naming the key,
  with ``config.yaml``, ``summary.json`` and ``metrics.jsonl`` byte for byte unchanged; the change accepted with
  ``--allow-config-change`` must continue and be recorded in ``history.jsonl``.
* :func:`failed_prepare_data` -- ``dapo-verl prepare-data`` over earlier good outputs with a bad row, a disk that
  fills halfway through, ``--out`` on the input's folder, and text that is not UTF-8: each must exit 2 with one
  line, and leave the earlier outputs and the inputs byte for byte unchanged.
* :func:`damaged_model_cache` -- the cached initial model with a flipped byte, truncated, without its
  checksums, with a stray file, and with a planted pickle: each must be detected, rebuilt to the same weights,
  and the pickle never run.
* :func:`interrupted_by_sigint` -- a real ``dapo-verl train`` gets SIGINT: it must exit 2 with one line after
  writing the checkpoint of the step it was on, and the same command must resume from that step and end with
  the metrics of the uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_verl.lifetime import dying_with_this_process

__all__ = [
    "GUARD_CHECKS",
    "GuardResult",
    "changed_reruns",
    "cli_command",
    "concurrent_writers",
    "damaged_model_cache",
    "failed_prepare_data",
    "interrupted_by_sigint",
    "one_line_error",
    "write_problems",
]

logger = logging.getLogger(__name__)

_TIMEOUT_S = 600


@dataclass
class GuardResult:
    """Outcome of one guard check.

    Attributes:
        name: The check.
        tried: Attempts made (hostile starts, damaged copies, interrupted runs, ...).
        held: Attempts handled as promised.
        problems: One line per broken promise; empty when ``held == tried``.
        wall_s: Seconds the check took (printed, never written to the README).
    """

    name: str
    tried: int = 0
    held: int = 0
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def attempt(self, what: str, failures: Sequence[str]) -> None:
        """Count one attempt; it held when ``failures`` is empty, else each is recorded under ``what``."""
        self.tried += 1
        self.held += not failures
        self.problems += [f"{what}: {f}" for f in failures]

    @property
    def passed(self) -> bool:
        """Every attempt held."""
        return self.tried > 0 and self.held == self.tried


def _tiny(steps: int, cache: Path, seed: int = 0) -> list[str]:
    from tools.reliability.runs import tiny_overrides

    return tiny_overrides(steps=steps, seed=seed, cache_dir=cache)


def cli_command(*args: str) -> list[str]:
    """The command line that runs ``dapo-verl ARGS...`` as a user would, with this interpreter; the process dies
    with this one (more arguments may be appended)."""
    return dying_with_this_process([sys.executable, "-m", "dapo_verl.cli", *args])


def _train_command(out: Path, overrides: Sequence[str], *flags: str) -> list[str]:
    return cli_command("train", "--out", str(out), *flags, *overrides)


def one_line_error(stderr: str) -> str | None:
    """The last stderr line when it is a ``dapo-verl ...:`` error and no traceback was printed, else None."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if not lines or "Traceback" in stderr or not lines[-1].startswith("dapo-verl "):
        return None
    return lines[-1]


def _wait_for(condition: Callable[[], bool], process: subprocess.Popen[Any] | None = None) -> bool:
    deadline = time.monotonic() + _TIMEOUT_S
    while time.monotonic() < deadline:
        if condition():
            return True
        if process is not None and process.poll() is not None:
            return condition()
        time.sleep(0.05)
    return False


def _metric_lines(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _comparable(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    from tools.reliability.runs import comparable_history

    return comparable_history(records)


# -- concurrent writers ----------------------------------------------------------------------------------


def concurrent_writers(work: Path) -> GuardResult:
    """A second ``dapo-verl train`` on a busy directory, then a start after the holder was SIGKILLed."""
    from dapo_verl.local.checkpoint import read_marker
    from dapo_verl.local.train import run

    result, started = GuardResult("concurrent writers"), time.perf_counter()
    out, cache = work / "run", work / "cache"
    overrides = _tiny(400, cache)  # long enough to outlive the second start
    holder = subprocess.Popen(
        _train_command(out, overrides), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        busy = _wait_for(lambda: read_marker(out) is not None, holder)
        second = subprocess.run(_train_command(out, overrides), capture_output=True, text=True, timeout=_TIMEOUT_S)
        line = one_line_error(second.stderr) or ""
        result.attempt(
            "a second writer",
            [
                f
                for ok, f in [
                    (busy and holder.poll() is None, "the first run was not running when the second started"),
                    (second.returncode == 2, f"exit status {second.returncode}, not 2"),
                    (
                        f"pid {holder.pid} " in line,
                        f"the message does not name the holder's pid {holder.pid}: {line!r}",
                    ),
                ]
                if not ok
            ],
        )
    finally:
        holder.kill()
        holder.communicate(timeout=_TIMEOUT_S)
    killed_at = read_marker(out)
    resumed = run(_tiny(killed_at + 2 if killed_at else 2, cache), out)
    result.attempt(
        "a start after the holder was killed",
        [
            f
            for ok, f in [
                (
                    resumed.resumed_from == killed_at,
                    f"resumed from {resumed.resumed_from}, not the killed run's {killed_at}",
                ),
                (
                    [r["step"] for r in resumed.history] == list(range(resumed.steps + 1)),
                    "steps are not one run's 0..N",
                ),
            ]
            if not ok
        ],
    )
    result.wall_s = time.perf_counter() - started
    return result


# -- changed re-runs -------------------------------------------------------------------------------------


_OUTPUTS = ("config.yaml", "summary.json", "metrics.jsonl")


def _snapshot(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in _OUTPUTS}


def _refused_keeping_outputs(out: Path, key: str, start: Callable[[], Any]) -> list[str]:
    before = _snapshot(out)
    try:
        start()
    except ValueError as err:
        failures = [] if f"{key}=" in str(err) and "--out" in str(err) else [f"unclear: {err}"]
    else:
        failures = ["accepted"]
    return failures + ([] if _snapshot(out) == before else ["the run's outputs changed"])


def changed_reruns(work: Path) -> GuardResult:
    """A finished run started again with changed settings, with a foreign checkpoint, and with an allowed change."""
    from dapo_verl.local.checkpoint import STATE_FILE, checkpoint_dir
    from dapo_verl.local.rundir import accepted_changes
    from dapo_verl.local.train import run

    result, started = GuardResult("changed re-runs"), time.perf_counter()
    cache, out = work / "cache", work / "run"
    base = _tiny(4, cache)
    run(base, out)
    changes = {"actor_rollout_ref.actor.clip_ratio_high": "0.2", "data.seed": "1", "local.model.hidden_size": "32"}
    for key, value in changes.items():
        overrides = [o for o in base if not o.startswith(f"{key}=")] + [f"{key}={value}"]
        allow = key != "actor_rollout_ref.actor.clip_ratio_high"  # no flag lets another model or split continue
        result.attempt(
            f"re-run with {key}={value}",
            _refused_keeping_outputs(out, key, lambda o=overrides, a=allow: run(o, out, allow_config_change=a)),
        )
    other = run(_tiny(4, cache, seed=1), work / "other")
    shutil.copyfile(checkpoint_dir(other.run_dir, 4) / STATE_FILE, checkpoint_dir(out, 4) / STATE_FILE)
    result.attempt(
        "a checkpoint copied in from another seed",
        _refused_keeping_outputs(out, "data.seed", lambda: run(_tiny(6, cache), out)),
    )
    run(_tiny(4, cache), work / "allowed")
    allowed = run(
        [*_tiny(6, cache), "actor_rollout_ref.actor.clip_ratio_high=0.2"], work / "allowed", allow_config_change=True
    )
    recorded = accepted_changes(work / "allowed")
    result.attempt(
        "an allowed change",
        [
            f
            for ok, f in [
                (allowed.resumed_from == 4 and allowed.steps == 6, f"did not continue 4 -> 6 ({allowed.resumed_from})"),
                (
                    [c["key"] for c in recorded] == ["actor_rollout_ref.actor.clip_ratio_high"],
                    f"history holds {recorded}",
                ),
            ]
            if not ok
        ],
    )
    result.wall_s = time.perf_counter() - started
    return result


# -- prepare-data ----------------------------------------------------------------------------------------


def write_problems(path: Path, problems: Sequence[tuple[bytes, bytes]]) -> Path:
    """A plain problem/answer parquet whose strings are written byte for byte (invalid UTF-8 included)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def column(values: Sequence[bytes]) -> pa.Array:
        offsets = np.cumsum([0, *(len(v) for v in values)]).astype(np.int32)
        return pa.Array.from_buffers(
            pa.string(), len(values), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
        )

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"problem": column([p for p, _ in problems]), "answer": column([a for _, a in problems])}), path
    )
    return path


_FULL_DISK_AFTER_ONE_FILE = """
import errno, os, runpy, sys
import pyarrow.parquet as pq
real, written = pq.write_table, []
def write(table, where, *args, **kwargs):
    if written:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
    written.append(where)
    real(table, where, *args, **kwargs)
pq.write_table = write
sys.argv = ["dapo-verl", *sys.argv[1:]]
runpy.run_module("dapo_verl.cli", run_name="__main__")
"""
"""``python -m dapo_verl.cli`` with a disk that fills after the first parquet file is written."""


def _prepare(args: Sequence[str], *, full_disk: bool = False) -> tuple[int, str]:
    """Run ``dapo-verl prepare-data`` as a user would, in a process of its own; return its status and stderr."""
    start = [sys.executable, "-c", _FULL_DISK_AFTER_ONE_FILE] if full_disk else cli_command()
    done = subprocess.run([*start, "prepare-data", *args], capture_output=True, text=True, timeout=_TIMEOUT_S)
    return done.returncode, done.stderr


def failed_prepare_data(work: Path) -> GuardResult:
    """``prepare-data`` failing four ways over an earlier run's good outputs."""
    result, started = GuardResult("failed prepare-data"), time.perf_counter()
    good = [(f"Problem {i}: what is {i} + {i}?".encode(), str(2 * i).encode()) for i in range(40)]
    train, aime = (
        write_problems(work / "in" / "train.parquet", good),
        write_problems(work / "in" / "aime.parquet", good[:30]),
    )
    out = work / "out"
    code, err = _prepare(["--dapo-math", str(train), "--aime", str(aime), "--out", str(out)])
    if code != 0:
        result.attempt("the good run", [f"exit {code}: {err.strip()}"])
        return result
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    inputs = {p: p.read_bytes() for p in (train, aime)}
    bad_row = write_problems(work / "bad" / "train.parquet", [*good[:5], (b"Problem X: blank", b""), *good[6:]])
    non_utf8 = write_problems(work / "bad" / "latin1.parquet", [*good[:7], (b"Probl\xe8me 7", b"14"), *good[8:]])
    attempts: dict[str, tuple[list[str], str, bool]] = {
        "a bad row": (["--dapo-math", str(bad_row), "--aime", str(aime), "--out", str(out)], "ground_truth", False),
        "a disk full after the first file": (
            ["--dapo-math", str(train), "--aime", str(aime), "--out", str(out), "--conflicts", "drop"],
            "No space left",
            True,
        ),
        "--out on the inputs' folder": (
            ["--dapo-math", str(train), "--out", str(train.parent)],
            "would overwrite",
            False,
        ),
        "text that is not UTF-8": (["--dapo-math", str(non_utf8), "--out", str(out)], "row 7", False),
    }
    for what, (args, words, full_disk) in attempts.items():
        code, err = _prepare(args, full_disk=full_disk)
        line = one_line_error(err) or ""
        result.attempt(
            what,
            [
                f
                for ok, f in [
                    (code == 2, f"exit status {code}, not 2"),
                    (words in line, f"the message lacks {words!r}: {err!r}"),
                    ({p.name: p.read_bytes() for p in out.iterdir()} == before, "earlier outputs changed"),
                    ({p: p.read_bytes() for p in inputs} == inputs, "an input changed"),
                ]
                if not ok
            ],
        )
    result.wall_s = time.perf_counter() - started
    return result


# -- model cache -----------------------------------------------------------------------------------------


def _damage(path: Path, how: str, marker: Path) -> None:
    import torch

    weights = path / "model.safetensors"
    if how == "flipped byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x10
        weights.write_bytes(bytes(data))
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif how == "no checksums":
        (path / "checksums.json").unlink()
    elif how == "stray file":
        (path / "added_tokens.json").write_text("{}")
    else:  # a planted pickle in place of the weights

        class Payload:
            def __reduce__(self) -> tuple[Any, ...]:
                return os.system, (f"touch {marker}",)

        weights.unlink()
        torch.save({"lm_head.weight": Payload()}, path / "pytorch_model.bin")


def damaged_model_cache(work: Path) -> GuardResult:
    """The cached initial model, damaged five ways, loaded again."""
    import torch

    from dapo_verl.local.config import ModelConfig
    from dapo_verl.local.model import load_or_build

    result, started = GuardResult("damaged model cache"), time.perf_counter()
    reference, _, path, _ = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=work)
    marker = work / "PAYLOAD_RAN"
    for how in ("flipped byte", "truncated", "no checksums", "stray file", "planted pickle"):
        shutil.rmtree(path)
        load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=work)  # a fresh, intact copy
        _damage(path, how, marker)
        try:
            model, _, _, built = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=work)
        except Exception as err:  # a loader that trips over the damage is exactly what this check looks for
            result.attempt(how, [f"loading crashed: {type(err).__name__}: {err}"])
            continue
        same = all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(), model.state_dict().values()))
        result.attempt(
            how,
            [
                f
                for ok, f in [
                    (built, "loaded, not rebuilt"),
                    (same, "other weights"),
                    (not marker.exists(), "the pickle ran"),
                ]
                if not ok
            ],
        )
    result.wall_s = time.perf_counter() - started
    return result


# -- SIGINT ----------------------------------------------------------------------------------------------


def interrupted_by_sigint(work: Path, *, points: Sequence[int] = (3, 9)) -> GuardResult:
    """Ctrl-C a real ``dapo-verl train`` once it logged each of ``points`` steps (before its first regular
    checkpoint, at step 10); then run it to the end and compare with the uninterrupted run."""
    from dapo_verl.local.checkpoint import STATE_FILE, checkpoint_dir
    from dapo_verl.local.train import run
    from tools.reliability.runs import quiet_run_logs, tiny_overrides

    result, started = GuardResult("SIGINT"), time.perf_counter()
    cache, steps = work / "cache", 20
    overrides = tiny_overrides(steps=steps, seed=0, cache_dir=cache, save_freq=10)
    reference = run(overrides, work / "reference")
    out = work / "run"
    for point in points:
        process = subprocess.Popen(
            _train_command(out, overrides), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        _wait_for(lambda p=point: _metric_lines(out) >= p + 1, process)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=_TIMEOUT_S)
        line = one_line_error(stderr) or ""
        stopped = json.loads((out / "history.jsonl").read_text().splitlines()[-1]).get("step")
        result.attempt(
            f"Ctrl-C after step {point}",
            [
                f
                for ok, f in [
                    (process.returncode == 2, f"exit status {process.returncode}, not 2; {stderr[-300:]!r}"),
                    ("Ctrl-C" in line and f"step {stopped}" in line, f"unclear message {line!r}"),
                    (stopped is not None and (checkpoint_dir(out, stopped) / STATE_FILE).exists(), "no checkpoint"),
                ]
                if not ok
            ],
        )
    records: list[logging.LogRecord] = []
    with quiet_run_logs(records):
        final = run(overrides, out)
    result.attempt(
        "resuming after Ctrl-C",
        [
            f
            for ok, f in [
                (
                    any(r.getMessage().startswith("Resumed from step") for r in records),
                    "the start did not say it resumed",
                ),
                (
                    _comparable(final.history) == _comparable(reference.history),
                    "metrics differ from the uninterrupted run",
                ),
            ]
            if not ok
        ],
    )
    result.wall_s = time.perf_counter() - started
    return result


GUARD_CHECKS: dict[str, Callable[[Path], GuardResult]] = {
    "concurrent writers": concurrent_writers,
    "changed re-runs": changed_reruns,
    "failed prepare-data": failed_prepare_data,
    "damaged model cache": damaged_model_cache,
    "SIGINT": interrupted_by_sigint,
}
"""Every guard check, by name; each takes a fresh work directory."""
