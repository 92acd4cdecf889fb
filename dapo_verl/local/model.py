"""The local backend's tiny policy: a character-level tokenizer and a randomly initialised causal LM.

Both are built in code -- nothing is downloaded -- and cached on disk in Hugging Face format
(``save_pretrained``), keyed by everything that determines them (architecture, vocabulary, seed), so a
second run with the same settings loads the identical weights instead of rebuilding them. A cache hit
and a fresh build give bit-identical models.

Each cached model directory holds ``checksums.json``: the SHA-256 of every file in it. A cached copy is
verified before it is read, and one whose files were altered, truncated, removed or joined by another file
(a planted ``pytorch_model.bin`` pickle, say) is not loaded: a warning names the file and the model is
rebuilt from its seed, which gives the same weights the cache should have held. Weights are only ever
read from safetensors, never unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from dapo_verl.files import apply_umask, os_errors_named
from dapo_verl.local.config import ModelConfig
from dapo_verl.local.tasks import ALPHABET

__all__ = [
    "CHECKSUMS",
    "EOS",
    "PAD",
    "ModelCacheError",
    "build_tokenizer",
    "cache_problem",
    "default_cache_dir",
    "load_or_build",
    "model_cache_key",
    "quiet_hf_progress",
]

logger = logging.getLogger(__name__)

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
_CACHE_FORMAT = 2  # 2: checksums.json in every cached directory
CHECKSUMS = "checksums.json"
"""The manifest of a cached model directory: ``{"files": {name: sha256}}``."""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of :data:`~dapo_verl.local.tasks.ALPHABET`.

    Ids: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, then the alphabet in order.

    Example:
        >>> tok = build_tokenizer()
        >>> tok("3+4=")["input_ids"]
        [6, 13, 7, 14]
    """
    vocab = {PAD: 0, EOS: 1, UNK: 2} | {c: i + 3 for i, c in enumerate(ALPHABET)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def _llama_config(cfg: ModelConfig, tokenizer: PreTrainedTokenizerFast, max_positions: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def model_cache_key(cfg: ModelConfig, max_positions: int, seed: int) -> str:
    """Hex digest of everything that determines the initial model and tokenizer."""
    blob = json.dumps(
        {
            "format": _CACHE_FORMAT,
            "model": asdict(cfg),
            "max_positions": max_positions,
            "seed": seed,
            "alphabet": ALPHABET,
            "torch": torch.__version__.split("+")[0],
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ModelCacheError(OSError):
    """Writing the model cache failed (a read-only or full disk, permissions): its place is ``local.cache_dir``
    (or ``$XDG_CACHE_HOME``), not the run's ``--out``, and the error says so (:attr:`option`)."""

    option = "local.cache_dir"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dapo_verl`` (``~/.cache/dapo_verl`` when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dapo_verl"


def load_or_build(
    cfg: ModelConfig, *, max_positions: int, seed: int, cache_dir: Path
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast, Path, bool]:
    """The initial policy and tokenizer, from the cache or freshly built (then cached).

    Args:
        cfg: Architecture (``local.model``).
        max_positions: Longest prompt + response in tokens.
        seed: Initialisation seed (``data.seed``); the global RNG is left untouched.
        cache_dir: Cache root; models live in ``cache_dir/models/<key>``.

    Returns:
        ``(model, tokenizer, path, built)``: float32 model in train mode, its tokenizer, the cached
        directory, and whether it was built now (False for a cache hit).
    """
    path = Path(cache_dir) / "models" / model_cache_key(cfg, max_positions, seed)
    if path.exists():
        problem = cache_problem(path)
        if problem is None:
            try:
                return _load(path), PreTrainedTokenizerFast.from_pretrained(path), path, False
            except (OSError, ValueError) as err:
                problem = f"it is unreadable ({err})"
        logger.warning(
            "Cached model at %s is not used: %s. Rebuilding it from data.seed=%d, which gives the "
            "weights the cache should hold.",
            path,
            problem,
            seed,
        )
    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(_llama_config(cfg, tokenizer, max_positions))
    try:
        _save_atomically(model, tokenizer, path)
    except OSError as err:
        raise ModelCacheError(err.errno, err.strerror, err.filename or str(path)) from None
    return model.train(), tokenizer, path, True


@contextmanager
def quiet_hf_progress() -> Iterator[None]:
    """Hide transformers' per-file progress bars (loading and saving a 132k-parameter model is instant)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_checksums(folder: Path) -> None:
    files = {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != CHECKSUMS}
    (folder / CHECKSUMS).write_text(json.dumps({"format": _CACHE_FORMAT, "files": files}, indent=2) + "\n")


def cache_problem(path: Path) -> str | None:
    """Why the cached model directory ``path`` must not be loaded, or None when every file matches its checksum."""
    try:
        manifest = json.loads((path / CHECKSUMS).read_text())
        expected = manifest["files"]
        if not isinstance(expected, dict):
            raise TypeError("files is not a mapping")
    except FileNotFoundError:
        return f"it has no {CHECKSUMS}"
    except (OSError, ValueError, TypeError, KeyError) as err:
        return f"its {CHECKSUMS} is unreadable ({err})"
    present = {p.name for p in path.iterdir() if p.name != CHECKSUMS}
    if extra := sorted(present - set(expected)):
        return f"it holds {', '.join(extra)}, which the cache never writes"
    if missing := sorted(set(expected) - present):
        return f"{', '.join(missing)} is missing"
    altered = [name for name, digest in sorted(expected.items()) if _sha256(path / name) != digest]
    if altered:
        return f"{', '.join(altered)} failed its checksum (the file was altered or truncated)"
    return None


def _load(path: Path) -> LlamaForCausalLM:
    with quiet_hf_progress():
        model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)
    return model.train()


def _save_atomically(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        apply_umask(tmp, directory=True)
        with quiet_hf_progress(), os_errors_named(path):
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            _write_checksums(tmp)
        for file in tmp.rglob("*"):
            apply_umask(file, directory=file.is_dir())  # safetensors writes its files 0600
        if path.exists():  # an unreadable earlier copy, or a concurrent build of the same key
            shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if cache_problem(path) is not None:  # not a concurrent build of the same key that won the race
            raise


def parameter_count(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """A short summary for logs: architecture name and parameter count."""
    return {"architecture": type(model).__name__, "parameters": parameter_count(model)}
