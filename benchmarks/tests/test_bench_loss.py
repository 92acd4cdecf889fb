"""The policy-loss benchmark on tiny sizes, and the probes it measures with."""

from __future__ import annotations

import json

import pytest
import torch

from tools.dispatch_probes import PeakTensorMemory, count_host_syncs

pytest.importorskip("verl")

from benchmarks.bench_loss import main, parse_size


def test_sync_probe_counts_reads_data_dependent_shapes_and_host_copies():
    x = torch.arange(6.0).reshape(2, 3)
    original = torch.Tensor.tolist
    with count_host_syncs() as syncs:
        float(x.sum())
        bool((x > 2).any())
        _ = x[x > 2]
        torch.nonzero(x)
        x.tolist()
        x.numpy()
    assert syncs == ["aten::_local_scalar_dense"] * 2 + [
        "aten::index",
        "aten::nonzero",
        "Tensor.tolist",
        "Tensor.numpy",
    ]
    with count_host_syncs() as syncs:
        y = (x * 2).exp().sum(dim=1)
        _ = x[torch.tensor([0, 1])], torch.where(x > 2, x, 0.0), y.reshape(-1)
    assert syncs == []
    assert torch.Tensor.tolist is original  # the wrapped methods are restored


def test_memory_probe_counts_new_storages_not_inputs_or_views():
    x = torch.ones(1024, requires_grad=True)  # 4 KiB, allocated before: not counted
    with PeakTensorMemory() as memory:
        view = x.detach().reshape(32, 32)  # a view of x: free
        y = (x * 2).exp()  # x * 2 (4 KiB) lives until exp (4 KiB) exists: peak 8 KiB
        y.sum().backward()  # x.grad (4 KiB) and backward temporaries
    assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert 8192 <= memory.peak_bytes <= 4 * 4096 + 64
    assert memory.live_bytes >= 4096  # y and x.grad are still alive


def test_benchmark_prints_one_line_per_loss_and_size_with_the_ratios(capsys):
    rows = main(["--sizes", "4x16", "3x8", "--repeats", "2", "--warmup", "0"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(line["loss"], line["B"], line["L"]) for line in lines] == [
        ("vanilla", 4, 16),
        ("dapo", 4, 16),
        ("vanilla", 3, 8),
        ("dapo", 3, 8),
    ]
    for line in lines:
        assert {"commit", "torch", "device", "time_ms", "peak_mib", "host_syncs"} <= set(line)
        assert line["device"] == "cpu" and line["time_ms"] > 0 and line["peak_mib"] > 0
    dapo = [line for line in lines if line["loss"] == "dapo"]
    assert all({"time_ratio", "peak_ratio", "targets_met"} <= set(line) for line in dapo)
    assert all(line["host_syncs"] == 2 for line in dapo)
    assert all(line["host_syncs"] == 3 for line in lines if line["loss"] == "vanilla")
    assert [row["size"] for row in rows] == ["4x16", "3x8"]


def test_sizes_are_parsed_or_refused_with_the_expected_form():
    assert parse_size("128x4096") == (128, 4096)
    with pytest.raises(Exception, match="must be BxL"):
        parse_size("128")
