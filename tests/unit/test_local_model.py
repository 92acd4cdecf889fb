"""The local backend's tokenizer and tiny model: character ids, size, and a cache that changes nothing."""

from __future__ import annotations

import logging
import os

import torch

from dapo_verl.local.config import ModelConfig
from dapo_verl.local.model import build_tokenizer, load_or_build, parameter_count
from dapo_verl.local.tasks import ALPHABET


def test_tokenizer_is_one_token_per_character_and_round_trips():
    tok = build_tokenizer()
    assert tok.pad_token_id == 0
    assert tok.eos_token_id == 1
    assert len(tok) == 3 + len(ALPHABET)
    ids = tok("47+38=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 6
    assert tok.decode(ids).replace(" ", "") == "47+38="
    assert tok.decode([*ids, tok.eos_token_id], skip_special_tokens=True).replace(" ", "") == "47+38="


def test_default_model_is_tiny_and_cache_hit_gives_identical_weights(tmp_path):
    before = torch.get_rng_state()
    built, tok, path, fresh = load_or_build(ModelConfig(), max_positions=12, seed=5, cache_dir=tmp_path)
    assert torch.equal(torch.get_rng_state(), before), "building must not touch the global RNG"
    loaded, _, path2, fresh2 = load_or_build(ModelConfig(), max_positions=12, seed=5, cache_dir=tmp_path)
    assert (fresh, fresh2) == (True, False)
    assert path == path2
    assert 100_000 <= parameter_count(built) <= 1_000_000
    for (name, a), (_, b) in zip(built.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert tok.eos_token_id == 1


def test_different_seeds_give_different_models(tmp_path):
    a, *_ = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=tmp_path)
    b, *_ = load_or_build(ModelConfig(), max_positions=12, seed=1, cache_dir=tmp_path)
    assert not torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)


def _same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _flip_last_byte(file):
    data = bytearray(file.read_bytes())
    data[-1] ^= 0x01
    file.write_bytes(bytes(data))


def test_a_flipped_byte_in_the_model_cache_is_detected_and_the_model_rebuilt(tmp_path, caplog):
    reference, _, path, _ = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=tmp_path)
    _flip_last_byte(path / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="dapo_verl.local.model"):
        model, _, path2, built = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=tmp_path)
    assert built and path2 == path
    assert _same_weights(model, reference)
    warning = " ".join(r.getMessage() for r in caplog.records).lower()
    assert "model.safetensors" in warning and "checksum" in warning and "rebuil" in warning
    _, _, _, built_again = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=tmp_path)
    assert not built_again  # the rebuilt copy verifies


def test_a_pickle_planted_in_the_model_cache_is_never_loaded(tmp_path, caplog):
    reference, _, path, _ = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=tmp_path)
    marker = tmp_path / "PAYLOAD_RAN"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (path / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload()}, path / "pytorch_model.bin")
    with caplog.at_level(logging.WARNING, logger="dapo_verl.local.model"):
        model, _, _, built = load_or_build(ModelConfig(), max_positions=12, seed=0, cache_dir=tmp_path)
    assert built and not marker.exists()
    assert _same_weights(model, reference)
    assert "pytorch_model.bin" in " ".join(r.getMessage() for r in caplog.records)
