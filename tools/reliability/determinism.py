"""Same seed, same numbers: the local backend and the sampler are run twice and compared bit for bit.

:func:`run_determinism` trains the tiny run of :mod:`.runs` twice with the same seed, in separate
directories, and compares every metric of every step (``==`` on the logged floats, no tolerance), the final
checkpoint (weights, AdamW moments, sampler state, RNG) and the saved model. It then runs the sampler alone
-- :class:`~dapo_verl.sampler.BatchReplenisher` on :class:`~dapo_verl.sampler.simulation.SimulatedPolicy`
with drifting pass rates, carry and prompt skipping on -- twice and compares its metrics, its trained prompt
ids and its final state. Each is run once more with the next seed, which must change the metrics: a check
that cannot fail would prove nothing.

Limits -- where torch itself is not deterministic, so neither is this check:

* CPU only. The runs use ``local.device=cpu``; CUDA kernels (atomic-add reductions, cuBLAS split-K,
  scaled-dot-product attention back-ends) do not give bit-identical results run to run, and
  ``torch.use_deterministic_algorithms(True, warn_only=True)``, which the local run sets, only warns
  where an operation has no deterministic implementation.
* The same torch version, thread count (``local.num_threads``; a float sum split over more threads is
  added in another order) and CPU instruction set (oneDNN and MKL pick kernels by AVX2/AVX-512 support).
  Two machines of different kinds can disagree in the last bits; one machine agrees with itself.
* ``timing_s/*`` metrics are wall-clock times and are excluded.
* Both runs share one process and one model cache; a cache hit and a fresh build give the same model
  (:mod:`dapo_verl.local.model`), and ``tests/e2e/test_faults.py`` compares a ``dapo-verl train``
  subprocess with an in-process run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from dapo_verl.config import SamplerConfig
from dapo_verl.local.checkpoint import checkpoint_dir, read_checkpoint
from dapo_verl.local.tracking import read_history
from dapo_verl.local.train import run
from dapo_verl.sampler import BatchReplenisher
from dapo_verl.sampler.simulation import SimulatedPolicy, drifting_pass_rates
from tools.reliability.runs import (
    history_differences,
    metric_values,
    quiet_run_logs,
    state_differences,
    tiny_overrides,
    work_directory,
)

__all__ = ["DeterminismResult", "run_determinism", "sampler_trace"]


@dataclass
class DeterminismResult:
    """Outcome of :func:`run_determinism`.

    Attributes:
        seed: The seed of both runs of each pair.
        local_metric_values: Metric values (step x key, ``timing_s/*`` excluded) compared between the two
            local runs.
        local_differences: What differed between them (metrics, final checkpoint, saved model); empty
            when bit-identical.
        local_other_seed_steps: Steps whose metrics differ when the seed changes (must be > 0).
        sampler_metric_values: Metric values compared between the two sampler runs.
        sampler_differences: What differed between them (metrics, trained prompt ids, final state).
        sampler_other_seed_steps: Steps whose sampler metrics differ when the seed changes (must be > 0).
        torch_version, num_threads, device: Where it was measured.
        wall_s: Seconds of the whole call.
    """

    seed: int
    local_metric_values: int = 0
    local_differences: list[str] = field(default_factory=list)
    local_other_seed_steps: int = 0
    sampler_metric_values: int = 0
    sampler_differences: list[str] = field(default_factory=list)
    sampler_other_seed_steps: int = 0
    torch_version: str = torch.__version__
    num_threads: int = 0
    device: str = ""
    wall_s: float = 0.0

    @property
    def identical(self) -> bool:
        """Both pairs of same-seed runs were bit-identical."""
        return not self.local_differences and not self.sampler_differences

    @property
    def seed_sensitive(self) -> bool:
        """Changing the seed changed both the local and the sampler metrics (the check can fail)."""
        return self.local_other_seed_steps > 0 and self.sampler_other_seed_steps > 0


def run_determinism(
    seed: int = 0, steps: int = 8, sampler_steps: int = 200, work_dir: str | Path | None = None
) -> DeterminismResult:
    """Run the local backend and the sampler twice with ``seed`` and once with ``seed + 1``; compare.

    Args:
        seed: ``data.seed`` of the local runs and seed of the simulated sampler.
        steps: Training steps of each local run.
        sampler_steps: ``next_batch`` calls of each sampler run.
        work_dir: Where the local runs are written (``first``, ``second``, ``other_seed``, ``cache``);
            None uses a temporary folder removed afterwards.
    """
    started = time.perf_counter()
    result = DeterminismResult(seed=seed)
    records: list[logging.LogRecord] = []
    with work_directory(work_dir, prefix="dapo_verl_determinism_") as root, quiet_run_logs(records):
        first, second, other = (
            _local(root / name, s, steps, root / "cache")
            for name, s in (("first", seed), ("second", seed), ("other_seed", seed + 1))
        )
        result.local_metric_values = metric_values(first["history"])
        result.local_differences = _differences(first, second)
        result.local_other_seed_steps = _steps_differing(first["history"], other["history"])
        local = first["state"]["config"]["local"]
        result.num_threads, result.device = int(local["num_threads"]), str(local["device"])
    a, b, c = (sampler_trace(s, sampler_steps) for s in (seed, seed, seed + 1))
    result.sampler_metric_values = metric_values(a["history"])
    result.sampler_differences = _differences(a, b)
    result.sampler_other_seed_steps = _steps_differing(a["history"], c["history"])
    result.wall_s = time.perf_counter() - started
    return result


def _local(run_dir: Path, seed: int, steps: int, cache: Path) -> dict[str, Any]:
    result = run([*tiny_overrides(steps=steps, seed=seed, cache_dir=cache), "trainer.resume_mode=disable"], run_dir)
    return {
        "history": read_history(run_dir / "metrics.jsonl"),
        "state": read_checkpoint(checkpoint_dir(run_dir, result.steps)),
        "model": load_file(str(run_dir / "model" / "model.safetensors")),
    }


def sampler_trace(seed: int, steps: int = 200) -> dict[str, Any]:
    """Run the simulated sampler for ``steps`` steps.

    Returns:
        ``{"history": [{"step": int, "data": metrics}], "batches": [prompt ids per step], "state": state_dict}``.
    """
    config = SamplerConfig(
        train_batch_size=16,
        gen_batch_size=24,
        seed=seed,
        surplus="carry",
        max_staleness_steps=2,
        skip_uninformative=True,
        on_shortfall="partial",
        max_num_gen_batches=4,
    )
    policy = SimulatedPolicy(drifting_pass_rates(512, seed=seed), group_size=8, seed=seed)
    sampler = BatchReplenisher(config, 512, policy)
    history, batches = [], []
    quiet = logging.getLogger("dapo_verl.sampler")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # partial-batch warnings are expected as the pass rates drift
    try:
        for step in range(steps):
            policy.step = step
            batch = sampler.next_batch()
            history.append({"step": batch.step, "data": batch.metrics})
            batches.append([g.prompt_id for g in batch.groups])
    finally:
        quiet.setLevel(level)
    return {"history": history, "batches": batches, "state": sampler.state_dict()}


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = history_differences(a["history"], b["history"])
    for key in ("batches", "state", "model"):
        if key in a:
            _, diffs = state_differences(a[key], b[key], where=key)
            out += diffs
    return out


def _steps_differing(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    return sum(1 for line in history_differences(a, b) if line.startswith("step "))
