"""Policy-loss cost benchmark: the registered ``dapo`` loss against verl's ``vanilla``, called the way verl calls them.

Run: ``.venv/bin/python -m benchmarks.bench_loss`` (about a minute on 2 CPU cores; ``--help`` for sizes).
Prints one JSON line per loss and size (with commit, torch version and device), then a table and whether
the targets hold.

Both losses are looked up with ``verl.trainer.ppo.core_algos.get_policy_loss_fn`` and called with verl's
keyword arguments and a worker-side ``ActorConfig`` (clip 0.2 / 0.28, ``clip_ratio_c`` 3, token-mean) whose
``global_batch_info`` is filled as ``verl.workers.utils.losses.ppo_loss`` fills it (dp_size 1, the batch's
token count, its response count). The inputs are what ``ppo_loss`` hands a policy loss: float32 log-probs
(a leaf that requires grad), old log-probs = log-probs + N(0, 0.3^2) noise (so both clips act), response
lengths uniform in [L/4, L], right-padded, a bool response mask, per-token advantages (one N(0, 1) value
per response, times the mask), no rollout weights. Same tensors for both losses.

Per size B x L and loss:

* ``time_ms`` -- median wall time of one call plus ``loss.backward()``: forward, the metrics read back to
  the host, backward. The two losses run interleaved (vanilla, dapo, then dapo, vanilla, ...) so that load
  from other processes hits both alike; ``time_ratio`` is the median over those pairs of dapo's time over
  vanilla's in the same pair. On CUDA the device is synchronised before and after each call.
* ``peak_mib`` -- peak bytes of the tensors the call creates, forward and backward (outputs and the
  gradient included, inputs excluded), from :class:`tools.dispatch_probes.PeakTensorMemory`, measured
  in a separate untimed call; on CUDA also ``cuda_peak_mib``, the allocator's peak above the level before
  the call. ``peak_ratio`` is dapo's over vanilla's.
* ``host_syncs`` -- operations per call that make the host wait for a GPU (``.item()``, ``.tolist()``,
  boolean indexing, ...), from :func:`tools.dispatch_probes.count_host_syncs`, on any device.

Targets (issue 13): ``time_ratio <= 1.1`` and ``peak_ratio <= 1`` at every size, and no more host syncs
than vanilla. Timings depend on the machine and its load; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.sampler_report import commit_id
from tools.dispatch_probes import PeakTensorMemory, count_host_syncs

LOSSES = ("vanilla", "dapo")
DEFAULT_SIZES = ("64x1024", "128x4096", "128x8192")
TARGETS = {"time_ratio": 1.1, "peak_ratio": 1.0}


@dataclass(frozen=True)
class Inputs:
    """One batch as verl's ``ppo_loss`` passes it to a policy loss; all (B, L)."""

    log_prob: torch.Tensor
    old_log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor


def make_inputs(batch: int, length: int, *, seed: int, device: str) -> Inputs:
    """Seeded float32 inputs of shape (batch, length) on ``device`` (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(batch, length, generator=gen) * 2  # (B, L)
    old_log_prob = log_prob + 0.3 * torch.randn(batch, length, generator=gen)  # (B, L)
    lengths = torch.randint(max(length // 4, 1), length + 1, (batch,), generator=gen)  # (B,)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)  # (B, L) bool, right-padded
    advantages = torch.randn(batch, 1, generator=gen) * mask  # (B, L)
    return Inputs(*(t.to(device) for t in (log_prob, old_log_prob, advantages, mask)))


def actor_config(inputs: Inputs) -> Any:
    """A worker-side ActorConfig (dapo's paper clips, verl's dual-clip default), batch info as ppo_loss sets it."""
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        loss_agg_mode="token-mean",
        policy_loss=PolicyLossConfig(loss_mode="dapo"),
    )
    config.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=int(inputs.response_mask.sum()),
        global_batch_size=inputs.response_mask.shape[0],
        loss_scale_factor=None,
    )
    return config


def policy_loss_call(name: str, inputs: Inputs, config: Any) -> Callable[[], None]:
    """A function running one forward + backward of verl's registered loss ``name`` on a fresh leaf."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    import dapo_verl.adapter.register  # noqa: F401  (registers ``dapo`` explicitly, whatever the install mode)

    loss_fn = get_policy_loss_fn(name)

    def call() -> None:
        leaf = inputs.log_prob.detach().clone().requires_grad_(True)
        loss, _metrics = loss_fn(
            old_log_prob=inputs.old_log_prob,
            log_prob=leaf,
            advantages=inputs.advantages,
            response_mask=inputs.response_mask,
            loss_agg_mode="token-mean",
            config=config,
            rollout_is_weights=None,
        )
        loss.backward()

    return call


def _timed(call: Callable[[], None], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    call()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def interleaved_times(
    calls: dict[str, Callable[[], None]], *, repeats: int, warmup: int, device: str
) -> dict[str, list[float]]:
    """Seconds per call of each loss, alternating which goes first in each round."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        gc.collect()
        for name in names if round_ % 2 == 0 else names[::-1]:
            times[name].append(_timed(calls[name], device))
    return times


def memory_and_syncs(call: Callable[[], None], device: str) -> dict[str, float]:
    """Peak tensor memory (MiB) and host synchronisations of one untimed call."""
    gc.collect()
    with PeakTensorMemory() as memory:
        call()
    result: dict[str, float] = {"peak_mib": memory.peak_bytes / 2**20}
    if device == "cuda":
        gc.collect()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        result["cuda_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    with count_host_syncs() as syncs:
        call()
    result["host_syncs"] = len(syncs)
    return result


def measure_size(batch: int, length: int, *, repeats: int, warmup: int, seed: int, device: str) -> dict[str, dict]:
    """All measurements of one size: ``{loss name: metrics}``, ratios on the ``dapo`` entry."""
    inputs = make_inputs(batch, length, seed=seed, device=device)
    config = actor_config(inputs)
    calls = {name: policy_loss_call(name, inputs, config) for name in LOSSES}
    times = interleaved_times(calls, repeats=repeats, warmup=warmup, device=device)
    result = {
        name: {"time_ms": statistics.median(times[name]) * 1e3, **memory_and_syncs(calls[name], device)}
        for name in LOSSES
    }
    dapo, vanilla = result["dapo"], result["vanilla"]
    dapo["time_ratio"] = statistics.median(d / v for d, v in zip(times["dapo"], times["vanilla"]))
    dapo["time_ratio_of_medians"] = dapo["time_ms"] / vanilla["time_ms"]
    dapo["peak_ratio"] = dapo["peak_mib"] / vanilla["peak_mib"]
    dapo["targets_met"] = (
        dapo["time_ratio"] <= TARGETS["time_ratio"]
        and dapo["peak_ratio"] <= TARGETS["peak_ratio"]
        and dapo["host_syncs"] <= vanilla["host_syncs"]
    )
    return result


def parse_size(text: str) -> tuple[int, int]:
    """``"128x4096"`` -> ``(128, 4096)``."""
    try:
        batch, length = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} must be BxL, e.g. 128x4096") from None
    return batch, length


def format_table(rows: list[dict]) -> str:
    """A Markdown table: one row per size, vanilla and dapo side by side."""
    lines = [
        "| B x L | vanilla ms | dapo ms | dapo / vanilla time | vanilla peak MiB | dapo peak MiB | "
        "dapo / vanilla peak | host syncs (vanilla / dapo) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        v, d = row["vanilla"], row["dapo"]
        lines.append(
            f"| {row['size']} | {v['time_ms']:.1f} | {d['time_ms']:.1f} | {d['time_ratio']:.2f} | "
            f"{v['peak_mib']:.1f} | {d['peak_mib']:.1f} | {d['peak_ratio']:.2f} | "
            f"{v['host_syncs']} / {d['host_syncs']} |"
        )
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_loss", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the tensors live")
    parser.add_argument(
        "--sizes",
        type=parse_size,
        nargs="+",
        default=[parse_size(s) for s in DEFAULT_SIZES],
        help=f"B x L sizes (default: {' '.join(DEFAULT_SIZES)})",
    )
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Command-line entry point: measure every size, print JSON lines, the table and the targets."""
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    meta = {
        "benchmark": "bench_loss",
        "commit": commit_id(),
        "torch": torch.__version__,
        "device": args.device,
        "python": platform.python_version(),
        "threads": args.threads,
        "repeats": args.repeats,
        "seed": args.seed,
    }
    rows = []
    for batch, length in args.sizes:
        result = measure_size(
            batch, length, repeats=args.repeats, warmup=args.warmup, seed=args.seed, device=args.device
        )
        for name in LOSSES:
            line = {
                **meta,
                "measurement": "policy_loss",
                "loss": name,
                "B": batch,
                "L": length,
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in result[name].items()},
            }
            print(json.dumps(line, sort_keys=True), flush=True)
        rows.append({"size": f"{batch}x{length}", **result})
    print()
    print(format_table(rows))
    for row in rows:
        verdict = "met" if row["dapo"]["targets_met"] else "NOT met"
        print(
            f"targets at {row['size']} (time <= {TARGETS['time_ratio']}x, peak <= vanilla, syncs <= vanilla): {verdict}"
        )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
