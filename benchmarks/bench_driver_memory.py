"""Driver memory of the legacy trainer's kept groups: views of a generation round against compact copies.

Run: ``.venv/bin/python -m benchmarks.bench_driver_memory`` (a few seconds). Prints one JSON line per method
(with commit, torch version and device) and a table.

The legacy trainer's generate callback splits each round's rollout (a verl ``DataProto``) into per-prompt
groups; the sampler keeps the informative ones for the step and, with ``surplus=carry``, the surplus for later
steps. A group kept as ``output[rows]`` (a slice) is a *view*: its tensors share the storage of the whole round,
so the driver holds every round's tensors for as long as one group of it lives. ``canonical_group_rows`` +
``select_idxs`` copies the group out instead.

The shape is the paper recipe's round scaled down by a stated factor: ``gen_batch_size x n`` rows
(1536 x 16) and ``max_prompt_length + max_response_length`` tokens (2048 + 20480), both divided by
``--row-factor`` and ``--length-factor``. The round holds the fields verl's agent loop returns (prompts,
responses, input_ids, attention_mask, position_ids, response_mask, rm_scores, rollout_log_probs). A step keeps
``--kept`` groups of the round (the paper's train batch is a third of its generation batch).

Measured, not timed: ``held_bytes`` -- bytes of the distinct tensor storages the kept groups reference once the
round itself is dropped; ``kept_bytes`` -- bytes of the kept rows alone; ``ratio`` = held / kept (target <= 1.1,
issue 11). The same counts hold at full scale, multiplied by the two factors.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch
from verl import DataProto

from benchmarks.sampler_report import commit_id
from dapo_verl.adapter.trainer import canonical_group_rows

PAPER = {"rows": 1536 * 16, "n": 16, "prompt": 2048, "response": 20480}


def _round(rows: int, prompt: int, response: int, gen: torch.Generator) -> DataProto:
    """One generation round's output, with the tensors and dtypes verl's agent loop returns."""
    responses = torch.randint(0, 1000, (rows, response), generator=gen)
    prompts = torch.randint(0, 1000, (rows, prompt), generator=gen)
    lengths = torch.randint(1, response + 1, (rows,), generator=gen)
    response_mask = (torch.arange(response).unsqueeze(0) < lengths.unsqueeze(1)).long()
    attention = torch.cat([torch.ones(rows, prompt, dtype=torch.long), response_mask], dim=1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": attention.cumsum(1) - 1,
            "response_mask": response_mask,
            "rm_scores": torch.zeros(rows, response),
            "rollout_log_probs": torch.randn(rows, response, generator=gen),
        },
        non_tensors={"acc": np.zeros(rows, dtype=object)},
    )


def _slice_groups(output: DataProto, n: int, kept: int) -> list[DataProto]:
    return [output[j * n : (j + 1) * n] for j in range(kept)]


def _compact_groups(output: DataProto, n: int, kept: int) -> list[DataProto]:
    lengths = output.batch["response_mask"].sum(-1)
    return [
        output.select_idxs(canonical_group_rows(output.batch["responses"], lengths, start=j * n, size=n))
        for j in range(kept)
    ]


METHODS: dict[str, Callable[[DataProto, int, int], list[DataProto]]] = {
    "slice view (before)": _slice_groups,
    "compact copy (after)": _compact_groups,
}


def _storage_bytes(groups: Sequence[DataProto]) -> tuple[int, int]:
    """(bytes of the distinct storages the groups reference, bytes of the groups' own elements)."""
    storages: dict[int, int] = {}
    own = 0
    for group in groups:
        for tensor in group.batch.values():
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            own += tensor.numel() * tensor.element_size()
    return sum(storages.values()), own


def measure(method: str, *, row_factor: int, length_factor: int, kept: int, seed: int = 0) -> dict:
    """Held and own bytes of ``kept`` groups cut from one scaled round by ``method``."""
    n = PAPER["n"]
    rows = PAPER["rows"] // row_factor
    output = _round(
        rows, PAPER["prompt"] // length_factor, PAPER["response"] // length_factor, torch.Generator().manual_seed(seed)
    )
    groups = METHODS[method](output, n, kept)
    del output
    gc.collect()
    held, own = _storage_bytes(groups)
    return {
        "benchmark": "driver_memory",
        "method": method,
        "rows": rows,
        "n": n,
        "kept_groups": kept,
        "row_factor": row_factor,
        "length_factor": length_factor,
        "held_bytes": held,
        "kept_bytes": own,
        "ratio": held / own,
        "commit": commit_id(),
        "torch": torch.__version__,
        "device": "cpu",
        "python": platform.python_version(),
    }


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row-factor", type=int, default=64, help="divide the round's 24,576 rows by this")
    parser.add_argument("--length-factor", type=int, default=32, help="divide the 22,528 tokens per row by this")
    parser.add_argument("--kept", type=int, default=8, help="groups kept from the round (default 8: a third)")
    args = parser.parse_args(argv)
    results = [
        measure(m, row_factor=args.row_factor, length_factor=args.length_factor, kept=args.kept) for m in METHODS
    ]
    for line in results:
        print(json.dumps(line, sort_keys=True))
    scale = args.row_factor * args.length_factor
    print(f"\n| method | held once the round is dropped | kept rows' bytes | held / kept | full scale (x{scale}) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['method']} | {r['held_bytes'] / 2**20:.1f} MiB | {r['kept_bytes'] / 2**20:.1f} MiB | "
            f"{r['ratio']:.2f} | {r['held_bytes'] * scale / 2**30:.1f} GiB held per round |"
        )
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
