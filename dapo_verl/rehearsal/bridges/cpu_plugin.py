"""The verl plugin of a CPU rehearsal: ``VERL_USE_EXTERNAL_MODULES=dapo_verl.rehearsal.bridges.cpu_plugin``.

``dapo-verl rehearse`` names this module in ``VERL_USE_EXTERNAL_MODULES`` and sets ``VERL_PLATFORM=cpu``
for every process of the run (driver, TaskRunner, workers, rollout servers); verl imports it first thing in
``import verl``, before any worker module binds the functions patched here. Importing it

* registers the ``cpu`` platform (:mod:`.cpu_platform`), the ``dapo_cpu`` rollout replica (:mod:`.cpu_rollout`)
  and the ``dapo_zmq`` checkpoint engine (:mod:`.cpu_checkpoint_engine`, ``separate_async``'s weight transport
  between processes) -- registrations that are inert until a config names them;
* applies the process-wide CPU patches (:func:`~.cpu_platform.apply_cpu_patches`) **only if**
  ``VERL_PLATFORM=cpu``; there, too, a rehearsal's resume run waits at verl's checkpoint load for the first
  run's checkpoint (:mod:`.resume_barrier`, only with ``DAPO_REHEARSAL_RESUME_AFTER`` set), and the bridges to
  verl's own vLLM rollout are installed (:func:`.cpu_vllm.install_verl_side`, only with the run's record folder
  set), and the process records what it saw (:mod:`.process_record`: its Ray node, the job's variables, verl's
  plugin entry point).

Nothing imports it implicitly: neither ``import dapo_verl`` nor the ``verl.plugins`` entry point
(:mod:`dapo_verl.adapter.register`) reach it, so a GPU run is never touched.
"""

from __future__ import annotations

import os

from verl.workers.rollout.base import _ROLLOUT_REGISTRY
from verl.workers.rollout.replica import RolloutReplicaRegistry

from dapo_verl.rehearsal.bridges import cpu_vllm, process_record, resume_barrier
from dapo_verl.rehearsal.bridges.cpu_platform import CPU_PLATFORM_NAME, apply_cpu_patches

__all__ = ["activate"]

_ROLLOUT_NAME = "dapo_cpu"  # .cpu_rollout.CPU_ROLLOUT_NAME, without importing transformers here


def _load_replica() -> type:
    from dapo_verl.rehearsal.bridges.cpu_rollout import CpuRolloutReplica

    return CpuRolloutReplica


def activate() -> None:
    """Register the CPU rollout replica and checkpoint engine; patch the process for CPU when
    ``VERL_PLATFORM=cpu``. Idempotent."""
    import dapo_verl.rehearsal.bridges.cpu_checkpoint_engine  # noqa: F401  (registers in verl's CheckpointEngineRegistry)

    RolloutReplicaRegistry.register(_ROLLOUT_NAME, _load_replica)
    # verl 0.9.1 has no public registration for the in-worker rollout class; this private dict is the seam.
    _ROLLOUT_REGISTRY[(_ROLLOUT_NAME, "async")] = "dapo_verl.rehearsal.bridges.cpu_rollout.CpuServerAdapter"
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU_PLATFORM_NAME:
        apply_cpu_patches()
        resume_barrier.install()
        cpu_vllm.install_verl_side()
        if (records := cpu_vllm.active()) is not None:
            process_record.record_process(records)


activate()
