"""Safe, atomic state files: round trip, corruption detection, and refusal to run planted code."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from dapo_verl.state_io import CorruptStateError, load_state, save_state


def _state():
    return {
        "a": torch.arange(5),
        "nested": {"flag": True, "none": None, "x": 1.5, "items": [torch.zeros(0), "s"]},
        "rng": torch.Generator().manual_seed(3).get_state(),
        "bool": torch.tensor([True, False]),
    }


def test_round_trip_preserves_values_and_dtypes(tmp_path):
    path = save_state(_state(), tmp_path / "s.safetensors")
    loaded = load_state(path)
    assert torch.equal(loaded["a"], torch.arange(5))
    assert loaded["nested"]["flag"] is True and loaded["nested"]["none"] is None
    assert loaded["nested"]["items"][1] == "s" and loaded["nested"]["items"][0].shape == (0,)
    assert loaded["bool"].dtype == torch.bool
    assert torch.equal(loaded["rng"], _state()["rng"])


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    save_state({"v": 1}, tmp_path / "s.safetensors")
    save_state({"v": 2}, tmp_path / "s.safetensors")
    assert load_state(tmp_path / "s.safetensors") == {"v": 2}
    assert sorted(os.listdir(tmp_path)) == ["s.safetensors"]


def test_unsupported_values_are_refused_with_their_location(tmp_path):
    with pytest.raises(TypeError, match=r"state value at state.payload is a object"):
        save_state({"payload": object()}, tmp_path / "s.safetensors")
    with pytest.raises(TypeError, match="state keys must be strings"):
        save_state({"h": {1: 2}}, tmp_path / "s.safetensors")


def test_truncated_file_is_detected(tmp_path):
    path = save_state(_state(), tmp_path / "s.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptStateError, match="truncated"):
        load_state(path)


def test_altered_tensor_bytes_fail_the_checksum(tmp_path):
    path = save_state({"w": torch.ones(64)}, tmp_path / "s.safetensors")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="checksum"):
        load_state(path)


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PLANTED",))


def test_a_planted_pickle_is_refused_and_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.safetensors"
    path.write_bytes(pickle.dumps({"state": _Payload()}))
    with pytest.raises(CorruptStateError):
        load_state(path)
    assert not (tmp_path / "PLANTED").exists()


def test_an_altered_plain_value_fails_the_checksum(tmp_path):
    path = save_state({"step": 12345, "w": torch.ones(4)}, tmp_path / "s.safetensors")
    data = bytearray(path.read_bytes())
    data[data.find(b"12345")] = ord("9")  # still valid JSON, still a number: only the checksum can tell
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="checksum"):
        load_state(path)


def test_files_of_the_first_format_are_still_read(tmp_path):
    from safetensors.torch import save_file

    from dapo_verl.state_io import _digest

    tensors = {"t0": torch.arange(3)}
    body = '{"step": 4, "w": {"__tensor__": "t0"}}'
    path = tmp_path / "old.safetensors"
    save_file(
        tensors, str(path), metadata={"format": "dapo_verl.state/1", "state": body, "sha256": _digest(tensors, None)}
    )
    loaded = load_state(path)
    assert loaded["step"] == 4 and torch.equal(loaded["w"], torch.arange(3))
