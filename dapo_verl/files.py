"""Files written atomically, with the mode the user's umask gives: the one writer every output goes through.

:func:`atomic_write` writes to a temporary file in the same directory (``.<name>.<random>.tmp``), flushes it to disk
and renames it into place, so a crash mid-write leaves the previous file intact and at most a stale temporary file.
The temporary file is created private (``tempfile`` uses mode 0600) and given the mode the umask allows before it is
renamed, so the result is as readable as any file the user creates (:func:`apply_umask`).

A write that fails -- a full disk, a read-only file system, whatever the writer -- raises an :class:`OSError` that
names the file being written (not its temporary name), whichever library did the writing: safetensors reports I/O
failures as its own ``SafetensorError`` and torch as ``RuntimeError``, and :func:`os_errors_named` turns those into
the ``OSError`` they stand for, so the command line reports them on one line. Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["apply_umask", "atomic_write", "current_umask", "os_errors_named", "write_text_atomically"]


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
    except Exception as err:  # safetensors' SafetensorError (not imported here: this module needs no torch)
        if not isinstance(err, RuntimeError) and type(err).__name__ != "SafetensorError":
            raise
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
