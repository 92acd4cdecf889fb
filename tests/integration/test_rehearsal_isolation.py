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
        "plugin_imported": "dapo_verl.adapter.cpu_plugin" in sys.modules,
        "dapo_loss_registered": "dapo" in POLICY_LOSS_REGISTRY,
    }))
""")


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
    seen = _probe(VERL_USE_EXTERNAL_MODULES="dapo_verl.adapter.cpu_plugin")
    assert seen["plugin_imported"] and seen["cpu_replica_registered"] and seen["cpu_rollout_registered"]
    assert not seen["process_group_patched"] and not seen["fsdp_offload_patched"]


def test_a_rehearsal_environment_applies_both_patches():
    seen = _probe(VERL_USE_EXTERNAL_MODULES="dapo_verl.adapter.cpu_plugin", VERL_PLATFORM="cpu")
    assert seen["process_group_patched"] and seen["fsdp_offload_patched"] and seen["cpu_platform_registered"]


def test_patches_refuse_to_apply_outside_a_rehearsal(monkeypatch):
    from dapo_verl.adapter.cpu_platform import apply_cpu_patches

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
    env.update(VERL_USE_EXTERNAL_MODULES="dapo_verl.adapter.cpu_plugin", VERL_PLATFORM=platform,
               DAPO_REHEARSAL_RESUME_AFTER=str(tmp_path / "ready"))
    out = subprocess.run([sys.executable, "-c", _BARRIER_PROBE], capture_output=True, text=True, env=env, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"PPOTrainer": expected, "RayPPOTrainer": expected, "DapoRayTrainer": expected}
