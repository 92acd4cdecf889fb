"""Every file and directory the package writes honours the umask: teammates on a shared machine can read them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dapo_verl.files import write_text_atomically
from dapo_verl.local.config import ModelConfig
from dapo_verl.local.files import replace_directory
from dapo_verl.local.model import load_or_build
from dapo_verl.state_io import save_state


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _modes_below(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")]}


def test_atomic_files_and_state_files_are_readable_by_group_and_others(tmp_path, umask_022):
    assert _mode(write_text_atomically(tmp_path / "config.yaml", "a: 1\n")) == 0o644
    assert _mode(save_state({"x": torch.zeros(2)}, tmp_path / "sub" / "state.safetensors")) == 0o644


def test_a_replaced_directory_is_readable_by_group_and_others(tmp_path, umask_022):
    def fill(folder: Path) -> None:
        (folder / "notes").write_text("w")
        save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))  # safetensors creates it 0600

    model = replace_directory(tmp_path / "model", fill)
    assert _modes_below(model) == {".": 0o755, "notes": 0o644, "model.safetensors": 0o644}


def test_the_cached_model_is_readable_by_group_and_others(tmp_path, umask_022):
    _, _, path, _ = load_or_build(
        ModelConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2),
        max_positions=8,
        seed=0,
        cache_dir=tmp_path,
    )
    modes = _modes_below(path)
    assert modes.pop(".") == 0o755
    assert set(modes.values()) == {0o644}, modes


def test_a_stricter_umask_is_honoured_too(tmp_path):
    old = os.umask(0o077)
    try:
        assert _mode(write_text_atomically(tmp_path / "private.txt", "x")) == 0o600
    finally:
        os.umask(old)
