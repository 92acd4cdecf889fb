"""`dapo-verl ablate` end to end on a tiny size: run directories, report files, reuse, resume and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo_verl.cli import main
from dapo_verl.local.ablate import run_ablation
from dapo_verl.local.arms import CLIP_ACTS_STUDY, CLIP_STUDY, LADDER_STUDY

pytestmark = pytest.mark.e2e

TINY = [
    "trainer.test_freq=2",
    "trainer.save_freq=2",
    "data.train_batch_size=4",
    "data.gen_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "local.task.heldout_size=50",
]
REPORT_FILES = (
    "report.md",
    "report.json",
    "ablation.md",
    "curves.png",
    "accuracy.png",
    "entropy.png",
    "clip_fractions.png",
    "clipped_probability.png",
)  # pass_at_k.png only when val_kwargs.n > 1


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return f"local.cache_dir={tmp_path_factory.mktemp('cache')}"


@pytest.fixture(scope="module")
def clip(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("clip")
    lines = []
    result = run_ablation(
        CLIP_STUDY,
        [0, 1],
        out,
        steps=2,
        extra_overrides=[*TINY, cache],
        jobs=1,
        on_run=lambda outcome, done, total: lines.append((outcome.arm, outcome.seed, done, total)),
    )
    return {"out": out, "result": result, "lines": lines}


def test_every_arm_and_seed_trains_into_its_own_directory(clip):
    out = clip["out"]
    assert clip["lines"] == [
        ("eps_high_0.2", 0, 1, 4),
        ("eps_high_0.28", 0, 2, 4),
        ("eps_high_0.2", 1, 3, 4),
        ("eps_high_0.28", 1, 4, 4),
    ]
    for arm in ("eps_high_0.2", "eps_high_0.28"):
        for seed in (0, 1):
            summary = json.loads((out / arm / f"seed{seed}" / "summary.json").read_text())
            assert (summary["seed"], summary["steps"]) == (seed, 2)
            assert (
                f"clip_ratio_high: {arm.removeprefix('eps_high_')}"
                in (out / arm / f"seed{seed}" / "config.yaml").read_text()
            )


def test_the_report_files_hold_both_arms(clip):
    out, result = clip["out"], clip["result"]
    assert {path.name for path in result.files.values()} == set(REPORT_FILES)
    for name in REPORT_FILES:
        assert (out / name).is_file(), name
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((out / "report.json").read_text())
    assert list(report["arms"]) == ["eps_high_0.2", "eps_high_0.28"]
    assert all(len(arm["runs"]) == 2 for arm in report["arms"].values())
    assert "val-aux/copy3/exact/mean@1" in report["metrics"]
    summary = (out / "ablation.md").read_text()
    assert "| eps_high_0.28 | 2 |" in summary
    assert "4 runs of 2 steps" in summary
    paired = next(line for line in summary.splitlines() if line.startswith("| eps_high_0.28 | eps_high_0.2 |"))
    assert sum(int(n) for n in paired.rstrip(" |").rsplit("|", 1)[1].split("/")) == 2  # better + same + worse


def test_a_second_call_reuses_finished_runs_without_training(clip):
    out = clip["out"]
    metrics = out / "eps_high_0.2" / "seed0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    elsewhere = f"local.cache_dir={out / 'another_cache'}"  # where models are cached changes no metric
    again = run_ablation(CLIP_STUDY, [0, 1], out, steps=2, extra_overrides=[*TINY, elsewhere], jobs=1)
    assert all(o.reused for o in again.outcomes)
    assert metrics.stat().st_mtime_ns == before
    assert [o.final_accuracy for o in again.outcomes] == [o.final_accuracy for o in clip["result"].outcomes]


def test_a_changed_configuration_is_refused_before_any_run(clip, cache):
    with pytest.raises(ValueError, match=r"seed0 holds a run of another configuration .*optim\.lr"):
        run_ablation(
            CLIP_STUDY,
            [0, 1, 2],
            clip["out"],
            steps=2,
            jobs=1,
            extra_overrides=[*TINY, cache, "actor_rollout_ref.actor.optim.lr=0.01"],
        )
    assert not (clip["out"] / "eps_high_0.2" / "seed2").exists()


def test_an_interrupted_run_continues_from_its_checkpoint(tmp_path, cache):
    study = CLIP_STUDY
    run_ablation(study, [0], tmp_path / "whole", steps=4, extra_overrides=[*TINY, cache], jobs=1)
    part = tmp_path / "part"
    run_ablation(study, [0], part, steps=2, extra_overrides=[*TINY, cache], jobs=1)
    (part / "eps_high_0.2" / "seed0" / "summary.json").unlink()  # as if killed after its step-2 checkpoint
    resumed = run_ablation(study, [0], part, steps=4, extra_overrides=[*TINY, cache], jobs=1)
    assert not any(o.reused for o in resumed.outcomes)

    def records(root):
        lines = (root / "eps_high_0.2" / "seed0" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line)["data"].items() if not k.startswith("timing_s/")} for line in lines]

    assert records(part) == records(tmp_path / "whole")


def test_cli_runs_the_ladder_and_prints_the_table(tmp_path, cache, capsys):
    out = tmp_path / "ladder"
    code = main(
        ["ablate", *TINY, cache, "--ladder", "--seed-list", "3", "--steps", "2", "--jobs", "1", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0
    for arm in LADDER_STUDY.arms:
        assert (out / arm.name / "seed3" / "summary.json").is_file()
        assert f"| {arm.name} | 1 |" in printed
    assert f"[6/6] {LADDER_STUDY.arms[-1].name} seed 3: held-out accuracy" in printed
    assert str(out / "ablation.md") in printed
    assert main(["compare", *map(str, sorted(out.glob("*/seed*"))), "--out", str(tmp_path / "compare")]) == 0
    compared = json.loads((tmp_path / "compare" / "report.json").read_text())
    assert list(compared["arms"]) == [arm.name for arm in LADDER_STUDY.arms]


@pytest.mark.slow
def test_cli_runs_the_clip_acts_setting_with_its_diagnostics_and_paired_test(tmp_path, cache, capsys):
    out = tmp_path / "clip-acts"
    code = main(
        [
            "ablate",
            *TINY,
            cache,
            "local.warm_start.steps=10",
            "--setting",
            "clip-acts",
            "--seed-list",
            "3",
            "5",
            "--steps",
            "2",
            "--jobs",
            "1",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/seed*")) == [
        "eps_high_0.2/seed3",
        "eps_high_0.2/seed5",
        "eps_high_0.28/seed3",
        "eps_high_0.28/seed5",
    ]  # --seed-list
    for arm in CLIP_ACTS_STUDY.arms:
        config = (out / arm.name / "seed5" / "config.yaml").read_text()
        assert "correct_prob: 0.05" in config and "steps: 10" in config  # the setting, with the test's overrides
        records = [json.loads(line) for line in (out / arm.name / "seed5" / "metrics.jsonl").read_text().splitlines()]
        logged = {key for record in records for key, value in record["data"].items() if value is not None}
        assert {
            "val-core/copy3/acc/mean@1",
            "val-core/copy3/acc/best@8/mean",
            "val-aux/copy3/acc/best@4/mean",
            "actor/entropy",
            "actor/dapo/clip_upper_tokens",
            "actor/dapo/positive_advantage_tokens",
            "actor/dapo/clip_upper_old_prob_sum",
            "actor/dapo/clip_upper_old_prob_max",
            "actor/dapo/clip_upper_positive_share",
            "dapo/warm_start/heldout_correct_prob",
        } <= logged
        assert {record["step"] for record in records if "val-core/copy3/acc/mean@1" in record["data"]} == {0, 2}
    analysis = json.loads((out / "report.json").read_text())["analysis"]["primary"]
    assert analysis["test_name"] == "Student's paired t-test, two-sided" and analysis["test"]["n"] == 2
    assert set(analysis["differences"]) == {"3", "5"}
    assert analysis["power"]["seeds"] == CLIP_ACTS_STUDY.power.seeds
    assert f"Underpowered: 2 of the {CLIP_ACTS_STUDY.power.seeds} planned seeds ran." in analysis["reading"]
    summary = (out / "ablation.md").read_text()
    assert "## Primary metric and paired test" in summary and analysis["reading"] in summary
    assert "The runs evaluated it at steps 0, 2." in summary and analysis["evaluation_steps"] == [0, 2]
    assert "trainer.total_training_steps=2 " in summary and "trainer.total_training_steps=40" not in summary
    assert "**Reading.**" in printed
    assert all((out / name).is_file() for name in ("pass_at_k.png", "clipped_probability.png", "entropy.png"))


def test_cli_reports_a_bad_override_with_exit_code_2(tmp_path, capsys):
    code = main(["ablate", "actor_rollout_ref.actor.clip_ratio_high=0.3", "--out", str(tmp_path)])
    assert code == 2
    assert "clip study varies" in capsys.readouterr().err


@pytest.mark.slow
def test_two_jobs_give_the_same_runs_as_one(tmp_path, cache):
    one = run_ablation(CLIP_STUDY, [0], tmp_path / "one", steps=3, extra_overrides=[*TINY, cache], jobs=1)
    two = run_ablation(CLIP_STUDY, [0], tmp_path / "two", steps=3, extra_overrides=[*TINY, cache], jobs=2)
    for a, b in zip(one.outcomes, two.outcomes, strict=True):
        assert (a.arm, a.seed, a.final_accuracy) == (b.arm, b.seed, b.final_accuracy)
        lines = [(o.run_dir / "metrics.jsonl").read_text().splitlines() for o in (a, b)]
        strip = [
            [{k: v for k, v in json.loads(x)["data"].items() if not k.startswith("timing_s/")} for x in ls]
            for ls in lines
        ]
        assert strip[0] == strip[1]


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (an ablation's worker processes)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 2), (signal.SIGKILL, -signal.SIGKILL)],
)
def test_a_stopped_ablation_starts_no_queued_run_and_ends_its_workers(tmp_path, cache, signum, status):
    # Runs far longer than the test: without the stop, the command would wait for them, or they would outlive it.
    # SIGINT goes to the whole process group, as a terminal's Ctrl-C does; SIGTERM and SIGKILL to the command.
    out = tmp_path / "ablate"
    command = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dapo_verl.cli",
            "ablate",
            *TINY,
            cache,
            "--seeds",
            "2",
            "--steps",
            "5000",
            "--jobs",
            "2",
            "--out",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    workers: list[int] = []
    arms = ("eps_high_0.2", "eps_high_0.28")
    try:
        deadline = time.monotonic() + 300
        logs = [out / arm / "seed0" / "metrics.jsonl" for arm in arms]
        while not all(log.exists() and log.read_text().count("\n") >= 1 for log in logs):
            assert command.poll() is None and time.monotonic() < deadline, command.stderr.read()
            time.sleep(0.5)
        workers = [
            pid for pid in _children(command.pid) if b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(workers) >= 2, workers
        if signum == signal.SIGINT:
            os.killpg(command.pid, signum)
        else:
            command.send_signal(signum)
        assert command.wait(60) == status
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)]
        assert not any((out / arm / "seed1").exists() for arm in arms)  # the queued runs never started
        if signum != signal.SIGKILL:
            by = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
            assert command.stderr.read().splitlines() == [
                f"dapo-verl ablate: stopped by {by}: 2 run(s) in training stopped at a step boundary with a "
                "checkpoint and 2 queued run(s) were not started. Run the same command to continue (finished runs "
                "are reused, stopped ones continue from their checkpoint)."
            ]
            for arm in arms:  # each run stopped after a step, with its checkpoint, as `dapo-verl train` does
                events = [json.loads(line) for line in (out / arm / "seed0" / "history.jsonl").read_text().splitlines()]
                assert events[-1]["event"] == "interrupted"
                assert (out / arm / "seed0" / "checkpoints" / f"global_step_{events[-1]['step']}").is_dir()
    finally:
        if command.poll() is None:
            command.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
