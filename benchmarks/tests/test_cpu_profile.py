"""benchmarks.cpu_profile: roles from command lines, CPU seconds by role over a window, and the real sampler."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.cpu_profile import CpuSampler, cpu_by_role, role_of


def test_roles_come_from_the_command_lines_ray_and_vllm_give_their_processes():
    assert role_of("ray::AgentLoopWorkerTQ.generate_sequences") == "agent_loop"
    assert role_of("ray::vLLMHttpServer.generate") == "vllm_server"
    assert role_of("/venv/bin/python -B -c from multiprocessing.spawn import spawn_main; spawn_main(...)") == (
        "vllm_engine_core"
    )
    assert role_of("VLLM::Worker") == "vllm_worker" and role_of("VLLM::EngineCore") == "vllm_engine_core"
    assert role_of("python -m verl.trainer.main_ppo a=b") == "verl_driver"
    assert role_of("ray::TaskRunnerV1.run") == "trainer_driver"
    assert role_of("ray::SomethingElse") == "ray"
    assert role_of("bash") == role_of("") == "other"


def _write(path, samples):
    path.write_text("".join(json.dumps({"t": t, "p": p}) + "\n" for t, p in samples))


def test_cpu_by_role_sums_each_process_growth_inside_the_window_by_its_last_named_role(tmp_path):
    path = tmp_path / "cpu.jsonl"
    _write(
        path,
        [
            (10.0, {"1": [5.0, "ray::IDLE"], "2": [1.0, "python -B -c from multiprocessing.spawn x"]}),
            (
                11.0,
                {
                    "1": [5.5, "ray::AgentLoopWorkerTQ.run"],
                    "2": [1.8, "python -B -c from multiprocessing.spawn x"],
                    "3": [0.0, "ray::RewardLoopWorker.x"],
                },
            ),
            (
                12.0,
                {"1": [6.5, "ray::IDLE"], "2": [2.0, "python -B -c from multiprocessing.spawn x"], "3": [0.25, ""]},
            ),  # pid 3 ended: an empty command line keeps the role it had
            (13.0, {"1": [9.0, "ray::AgentLoopWorkerTQ.run"]}),
        ],
    )
    assert cpu_by_role(path) == {"agent_loop": 4.0, "vllm_engine_core": 1.0, "reward": 0.25}
    assert cpu_by_role(path, 11.0, 12.0) == pytest.approx({"agent_loop": 1.0, "vllm_engine_core": 0.2, "reward": 0.25})
    with pytest.raises(ValueError, match="no sample between 20.0 and 30.0"):
        cpu_by_role(path, 20.0, 30.0)


def test_the_sampler_records_this_process_burning_cpu_and_stops_with_its_block(tmp_path):
    path = tmp_path / "cpu.jsonl"
    with CpuSampler(path, interval=0.1) as sampler:
        time.sleep(0.3)  # the child's interpreter starts
        end = time.process_time() + 0.5
        while time.process_time() < end:  # burn 0.5 s of this process's CPU
            pass
        time.sleep(0.2)
    assert sampler._child is None
    samples = [json.loads(line) for line in path.read_text().splitlines()]
    mine = [s["p"][str(os.getpid())][0] for s in samples if str(os.getpid()) in s["p"]]
    assert len(mine) >= 3 and mine[-1] - mine[0] >= 0.4
    written = path.stat().st_size
    time.sleep(0.3)
    assert path.stat().st_size == written  # the child is gone: nothing is appended after the block
    with pytest.raises(ValueError, match="interval=0"):
        CpuSampler(path, interval=0)


def test_an_orphaned_sampler_stops_by_itself(tmp_path):
    # A parent killed outright (SIGKILL) cannot stop its sampler; the sampler notices it was orphaned and exits.
    path = tmp_path / "cpu.jsonl"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, subprocess, sys, time; "
                "c = subprocess.Popen([sys.executable, '-m', 'benchmarks.cpu_profile', "
                f"{str(path)!r}, '0.05', str(os.getpid())]); "
                "print(c.pid, flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    parent.kill()  # at once: the sampler may still be importing, and must notice all the same
    parent.wait()
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and os.path.exists(f"/proc/{child}") and "Z" not in _state(child):
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{child}") or "Z" in _state(child)
    finally:  # a sampler that missed its orphaning must not outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
