"""A ``cpu`` platform for verl, so verl's real trainer and workers run on a CPU-only machine (rehearsals).

verl 0.9.1 chooses its device through ``verl.plugin.platform``: a registry of ``PlatformBase`` classes picked
with ``VERL_PLATFORM``. It ships ``nvidia``, ``huawei`` and ``rocm``; this module adds ``cpu``. Registering the
class changes nothing by itself -- verl uses it only when ``VERL_PLATFORM=cpu``.

Running verl's FSDP2 workers on CPU also needs two process-wide changes, which :func:`apply_cpu_patches`
makes and :mod:`dapo_verl.rehearsal.bridges.cpu_plugin` applies **only** when ``VERL_PLATFORM=cpu``:

* ``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend string
  ``"cpu:gloo,<device>:<backend>"``, which for ``cpu`` is ``"cpu:gloo,cpu:gloo"`` and torch refuses
  ("Duplicate device type cpu"). The patched function passes plain ``gloo``.
* verl forces ``CPUOffloadPolicy(pin_memory=True)`` for the forward-only reference model (FSDP2), and pinning
  needs an accelerator ("Cannot access accelerator device"). The patch drops ``pin_memory`` from FSDP2's
  offload policy; nothing else about offloading changes.

Neither change may ever reach a GPU run: ``tests/integration/test_rehearsal_isolation.py`` imports
``dapo_verl`` and loads the ``verl.plugins`` entry point without ``VERL_PLATFORM=cpu`` and checks that both
functions are verl's and torch's own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["CPU_PLATFORM_NAME", "CpuDeviceModule", "CpuPlatform", "apply_cpu_patches", "cpu_patches_applied"]

logger = logging.getLogger(__name__)

CPU_PLATFORM_NAME = "cpu"
"""The value of ``VERL_PLATFORM`` that selects :class:`CpuPlatform`."""

_PATCHED_MARK = "__dapo_verl_cpu_patch__"


class CpuDeviceModule:
    """What verl calls through ``get_torch_device()`` (``torch.cuda``'s role), made harmless on CPU.

    Memory figures are zero (``mem_get_info`` reports the machine's RAM), caches and synchronisation are
    no-ops, RNG functions act on torch's CPU generator, and streams/events come from ``torch.cpu``.
    """

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> str:
        # verl passes this to .to(...) and device=...; "cpu" is valid in both.
        return "cpu"

    def get_device_name(self, device: Any = None) -> str:
        return "cpu"

    def set_device(self, device: Any) -> None:
        return None

    def synchronize(self, device: Any = None) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        return None

    def memory_allocated(self, device: Any = None) -> int:
        return 0

    def memory_reserved(self, device: Any = None) -> int:
        return 0

    def max_memory_allocated(self, device: Any = None) -> int:
        return 0

    def max_memory_reserved(self, device: Any = None) -> int:
        return 0

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """(free, total) bytes of the machine's RAM."""
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def __getattr__(self, name: str) -> Any:
        # Streams, events and anything else torch.cpu provides (Stream, Event, current_stream, stream, ...).
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        raise AttributeError(
            f"verl asked the cpu platform's device module for {name!r}, which has no CPU equivalent here. "
            f"Add it to dapo_verl.rehearsal.bridges.cpu_platform.CpuDeviceModule."
        )


@PlatformRegistry.register(platform=CPU_PLATFORM_NAME)
class CpuPlatform(PlatformBase):
    """verl platform ``cpu``: device ``cpu``, collectives over ``gloo``, fake GPUs as Ray's ``GPU`` resource.

    Ray placement counts only the ``GPU``/``NPU`` resource keys (``verl/single_controller/ray/base.py``), so
    the rehearsal starts Ray with ``num_gpus=N`` and this platform names ``GPU`` as its resource: each
    worker gets one "GPU" bundle and runs on the CPU.
    """

    _device_module = CpuDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only an explicit VERL_PLATFORM=cpu selects it.
        return False

    def current_device(self) -> Any:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _gloo_process_group(original: Any) -> Any:
    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    setattr(initialize_global_process_group_ray, _PATCHED_MARK, True)
    return initialize_global_process_group_ray


def _unpinned_fsdp_param_init(original: Any) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        policy = kwargs.get("offload_policy")
        if isinstance(policy, CPUOffloadPolicy) and policy.pin_memory:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        elif len(args) >= 8 and isinstance(args[7], CPUOffloadPolicy) and args[7].pin_memory:
            args = (*args[:7], CPUOffloadPolicy(pin_memory=False), *args[8:])
        original(self, *args, **kwargs)

    setattr(__init__, _PATCHED_MARK, True)
    return __init__


def cpu_patches_applied() -> dict[str, bool]:
    """Which of the two process-wide CPU patches are active in this process (for tests and the report)."""
    import verl.utils.distributed as distributed
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    return {
        "gloo process group": hasattr(distributed.initialize_global_process_group_ray, _PATCHED_MARK),
        "unpinned FSDP2 offload": hasattr(_fsdp_param.FSDPParam.__init__, _PATCHED_MARK),
    }


def apply_cpu_patches() -> None:
    """Make verl's FSDP2 workers start on CPU (see the module docstring). Idempotent.

    Raises:
        RuntimeError: if ``VERL_PLATFORM`` is not ``cpu`` -- these changes must never reach a GPU run.
    """
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != CPU_PLATFORM_NAME:
        raise RuntimeError(
            f"apply_cpu_patches() changes process-wide behaviour for a CPU rehearsal and needs "
            f"VERL_PLATFORM={CPU_PLATFORM_NAME}; VERL_PLATFORM is {os.environ.get('VERL_PLATFORM')!r}. Run it through "
            f"`dapo-verl rehearse`, which sets the environment."
        )
    import verl.utils.distributed as distributed
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    applied = cpu_patches_applied()
    if not applied["gloo process group"]:
        distributed.initialize_global_process_group_ray = _gloo_process_group(
            distributed.initialize_global_process_group_ray
        )
    if not applied["unpinned FSDP2 offload"]:
        _fsdp_param.FSDPParam.__init__ = _unpinned_fsdp_param_init(_fsdp_param.FSDPParam.__init__)
    logger.debug("dapo_verl: CPU rehearsal patches active (gloo process group, unpinned FSDP2 offload).")
