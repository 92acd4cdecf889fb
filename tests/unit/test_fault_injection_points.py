"""The fault injection's building blocks: every damage it does to a state file is detected; faults are drawn."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from dapo_verl.state_io import CorruptStateError, load_state, save_state
from tools.reliability.faults import FAULT_KINDS, draw_faults
from tools.reliability.injection import DAMAGE_MODES, EventTracker, damage_file


def _state():
    gen = torch.Generator().manual_seed(0)
    return {
        "version": 1,
        "step": 12,
        "model": {"w": torch.randn(16, 8, generator=gen), "b": torch.zeros(8)},
        "sampler": {"counters": {"groups_generated": 40.0}, "carried": [{"prompt_id": 3, "ok": True}]},
        "rng": torch.Generator().manual_seed(1).get_state(),
        "config": {"lr": 1e-3, "name": "copy3"},
    }


@pytest.mark.parametrize("mode", DAMAGE_MODES)
def test_every_drawn_damage_to_a_state_file_is_detected(tmp_path, mode):
    rng = random.Random(0)
    original = save_state(_state(), tmp_path / "clean.safetensors").read_bytes()
    for _ in range(60):
        path = tmp_path / "s.safetensors"
        path.write_bytes(original)
        damage_file(path, mode, rng.random(), rng.randint(1, 255))
        assert path.read_bytes() != original
        with pytest.raises(CorruptStateError, match=str(path)):
            load_state(path)


def test_an_unknown_damage_mode_is_refused(tmp_path):
    path = save_state({"a": 1}, tmp_path / "s.safetensors")
    with pytest.raises(ValueError, match="damage mode 'melt'"):
        damage_file(path, "melt", 0.5)


def _reference_tracker():
    tracker = EventTracker(Path("unused"))  # never installed: a fault-free run's counts, as if recorded
    tracker.counts.update({"generate": 11, "optimizer": 16, "save": 4, "log": 9})
    tracker.committed = [2, 4, 6, 8]
    return tracker


def test_faults_take_every_kind_in_turn_at_valid_points_and_depend_on_the_seed():
    tracker = _reference_tracker()
    faults = draw_faults(0, 12, tracker, [2] * 8)
    assert Counter(f.kind for f in faults) == dict.fromkeys(FAULT_KINDS, 2)
    for fault in faults:
        if fault.kind == "update":
            assert fault.index % 2 == 0  # the second gradient step of a training step: mid-update
        if fault.kind == "corrupt_checkpoint":
            assert 2 <= fault.index <= 3  # an intact predecessor and a later generation round exist
        if fault.kind in ("checkpoint_state", "checkpoint_marker"):
            assert 1 <= fault.index <= 4
    assert draw_faults(0, 12, tracker, [2] * 8) == faults
    assert draw_faults(1, 12, tracker, [2] * 8) != faults
