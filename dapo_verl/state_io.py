"""Safe, atomic files for plain-data state (sampler state, local-backend checkpoints).

A state is a nested structure of dicts (string keys), lists, strings, numbers, booleans, None and
tensors. It is written as one safetensors file: the tensors as tensors, everything else as JSON in the
file's metadata, plus a SHA-256 over the tensor bytes and that JSON text (format ``dapo_verl.state/2``;
files of format ``/1`` checksummed the tensors only and are still read). Loading parses JSON and raw
tensor bytes only -- no pickle, so a planted file cannot execute code -- and a truncated or altered file,
whether the flipped byte lies in a tensor or in the plain data, is reported as such. Writes go to a
temporary file in the same directory (``.<name>.<random>.tmp``), which is flushed to disk and renamed
into place, so a crash mid-write leaves the previous file intact and at most a stale temporary file.
The temporary file is created private (``tempfile`` uses mode 0600) and given the mode the umask allows
before it is renamed, so the result is as readable as any file the user creates (:func:`apply_umask`).

A write that fails -- a full disk, a read-only file system, whatever the writer -- raises an :class:`OSError`
that names the file being written (not its temporary name), whichever library did the writing: safetensors
reports I/O failures as its own ``SafetensorError`` and torch as ``RuntimeError``, and :func:`os_errors_named`
turns those into the ``OSError`` they stand for, so the command line reports them on one line.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

__all__ = [
    "CorruptStateError",
    "apply_umask",
    "atomic_write",
    "current_umask",
    "load_state",
    "os_errors_named",
    "save_state",
    "write_text_atomically",
]

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


def current_umask() -> int:
    """The process's umask, read from ``/proc/self/status`` where possible (setting it to read it races threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike[str], *, directory: bool = False) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would have: 0666 (files) or 0777 (directories) minus the umask.

    ``tempfile.mkstemp`` and ``mkdtemp`` create 0600 / 0700 entries; renamed into place they would make run
    outputs unreadable to the rest of a shared machine.
    """
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


_ERRNO_IN_TEXT = re.compile(r"os error (\d+)|\[Errno (\d+)\]")
_WRITE_FAILED = re.compile(r"failed writing|write failed|I/O error", re.IGNORECASE)


@contextlib.contextmanager
def os_errors_named(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise a failed write inside the block as an :class:`OSError` naming ``path``.

    An ``OSError`` keeps its errno and gets ``path`` as its file name (a temporary name means nothing to the
    user); safetensors' ``SafetensorError`` and torch's ``RuntimeError`` that report an I/O failure become the
    ``OSError`` of the errno they quote (``EIO`` when they quote none). Other errors pass unchanged.
    """
    try:
        yield
    except OSError as err:
        if err.errno is None:
            raise
        raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from None
    except (SafetensorError, RuntimeError) as err:
        text = str(err)
        quoted = _ERRNO_IN_TEXT.search(text)
        if quoted is None and not _WRITE_FAILED.search(text):
            raise
        code = int(quoted.group(1) or quoted.group(2)) if quoted else errno.EIO
        raise OSError(code, os.strerror(code), str(path)) from None


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, flush it to disk and rename it over ``path``.

    The temporary file is named ``.<name>.<random>.tmp``; a crash leaves at most that file, never a
    half-written ``path``, and a failed write removes it. Returns ``path``.

    Raises:
        OSError: naming ``path`` when the write fails (:func:`os_errors_named`).
    """
    target = Path(path)
    with os_errors_named(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            write(tmp)
            apply_umask(tmp)  # after writing: a writer may recreate the file (safetensors writes it 0600)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) through :func:`atomic_write`. Returns the path.

    Raises:
        OSError: naming ``path`` when the write fails; ``path`` is then left as it was.
    """
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


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
