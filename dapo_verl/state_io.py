"""Safe, atomic files for plain-data state (sampler state, local-backend checkpoints).

A state is a nested structure of dicts (string keys), lists, strings, numbers, booleans, None and
tensors. It is written as one safetensors file: the tensors as tensors, everything else as JSON in the
file's metadata, plus a SHA-256 over the tensor bytes and that JSON text (format ``dapo_verl.state/2``;
files of format ``/1`` checksummed the tensors only and are still read). Loading parses JSON and raw
tensor bytes only -- no pickle, so a planted file cannot execute code -- and a truncated or altered file,
whether the flipped byte lies in a tensor or in the plain data, is reported as such. Files are written through
:func:`dapo_verl.files.atomic_write`: a crash mid-write leaves the previous file intact, and a failed write raises an
``OSError`` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dapo_verl.files import atomic_write

__all__ = ["CorruptStateError", "load_state", "save_state"]

_FORMAT = "dapo_verl.state/2"
_LEGACY_FORMAT = "dapo_verl.state/1"  # checksum over the tensors only
_TENSOR = "__tensor__"


class CorruptStateError(ValueError):
    """A state file is truncated, altered, or not a dapo_verl state file."""


def _flatten(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().to("cpu").contiguous().clone()
        return {_TENSOR: name}
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"state key {where}[{key!r}] is a {type(key).__name__}; state keys must be strings.")
            out[key] = _flatten(value, tensors, f"{where}.{key}")
        return out
    if isinstance(obj, list | tuple):
        return [_flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(
        f"state value at {where} is a {type(obj).__name__}; only dicts, lists, tensors, numbers, strings, "
        f"booleans and None can be saved safely. Convert it (a payload codec does this for carried groups)."
    )


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            return tensors[obj[_TENSOR]]
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def _digest(tensors: dict[str, torch.Tensor], body: str | None) -> str:
    """SHA-256 over every tensor (name, dtype, shape, bytes) and, unless None (format /1), the JSON body."""
    sha = hashlib.sha256()
    if body is not None:
        sha.update(f"state:{len(body)}:".encode())
        sha.update(body.encode())
    for name in sorted(tensors):
        tensor = tensors[name]
        sha.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        if tensor.numel():
            sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def save_state(state: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, then rename). Returns the path.

    Raises:
        TypeError: if ``state`` holds anything but plain data and tensors (the message names where).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    body = json.dumps(_flatten(state, tensors, "state"))
    metadata = {"format": _FORMAT, "state": body, "sha256": _digest(tensors, body)}
    return atomic_write(target, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_state(path: str | os.PathLike[str]) -> Any:
    """Read a file written by :func:`save_state`; never executes code from the file.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        CorruptStateError: if the file is truncated, altered or of another format.
    """
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"No state file at {source}.")
    try:
        from safetensors import safe_open

        with safe_open(str(source), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(source))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CorruptStateError(
            f"{source} is not a readable dapo_verl state file ({err}); it is truncated or was not written by "
            f"dapo_verl. Resume from an earlier checkpoint."
        ) from None
    fmt = metadata.get("format")
    if fmt not in (_FORMAT, _LEGACY_FORMAT):
        raise CorruptStateError(
            f"{source} has format {fmt!r}, expected {_FORMAT!r}; it is damaged or was not "
            f"written by dapo_verl. Resume from an earlier checkpoint."
        )
    text = metadata.get("state")
    if not isinstance(text, str):
        raise CorruptStateError(f"{source} holds no state metadata; it is damaged. Resume from an earlier checkpoint.")
    if metadata.get("sha256") != _digest(tensors, text if fmt == _FORMAT else None):
        raise CorruptStateError(
            f"{source} failed its checksum: its contents were altered after writing. Resume from an earlier checkpoint."
        )
    try:
        body = json.loads(text)
        return _unflatten(body, tensors)
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CorruptStateError(f"{source} holds unreadable state metadata ({err!r}).") from None
