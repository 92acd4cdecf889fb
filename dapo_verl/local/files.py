"""Crash-safe writes of a run directory's small files, and clean-up of what a crash leaves behind.

Every file of a local run is replaced atomically (:func:`dapo_verl.files.write_text_atomically`): it is
written to a temporary file in the same directory, named ``.<name>.<random>.tmp`` (the naming
:func:`dapo_verl.state_io.save_state` uses too), flushed to disk and renamed over the target, so a reader -- or
a resumed run -- sees the old file or the new one, never half of one. A process killed mid-write leaves at most
that temporary file, which :func:`remove_stale_temporaries` deletes the next time a run starts in the directory.
The final model directory is swapped in the same way (:func:`replace_directory`).

Only one process may write a run directory at a time; the clean-up assumes so.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from dapo_verl.files import apply_umask, os_errors_named

__all__ = ["TMP_SUFFIX", "remove_stale_temporaries", "replace_directory"]

logger = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"
"""Suffix of every temporary file or directory; its name also starts with a dot."""


def _temporary_name(target: Path) -> str:
    return f".{target.name}."


def replace_directory(path: str | os.PathLike[str], fill: Callable[[Path], None]) -> Path:
    """Build a directory with ``fill(tmp_dir)`` and swap it in for ``path``. Returns the path.

    Every entry gets the mode the umask allows (as :func:`~dapo_verl.files.apply_umask`). POSIX cannot
    rename a directory over a non-empty one, so the old directory is first renamed aside
    (to a temporary name) and deleted after the swap; a crash in between leaves the new or the old
    directory plus a temporary one, never a half-written ``path``.

    Raises:
        OSError: naming ``path`` when a write fails (:func:`~dapo_verl.files.os_errors_named`); the old
            directory is left as it was.
    """
    target = Path(path)
    with os_errors_named(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temporary_name(target), suffix=TMP_SUFFIX, dir=target.parent))
    try:
        apply_umask(tmp, directory=True)
        with os_errors_named(target):
            fill(tmp)
        for entry in tmp.rglob("*"):
            apply_umask(entry, directory=entry.is_dir())  # writers such as safetensors create files 0600
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=_temporary_name(target), suffix=TMP_SUFFIX, dir=target.parent))
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def remove_stale_temporaries(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files and directories a killed run left in ``run_dir``; return what was removed.

    Looks in the run directory, ``checkpoints/`` and each ``checkpoints/global_step_*`` directory for
    ``.<name>.<random>.tmp`` entries, and removes checkpoint directories left empty (a run killed while
    writing its first file there). TensorBoard's event files are left alone.
    """
    root = Path(run_dir)
    checkpoints = root / "checkpoints"
    folders = [root, checkpoints, *sorted(checkpoints.glob("global_step_*"))]
    removed = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for entry in sorted(folder.glob(f".*{TMP_SUFFIX}")):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
        if folder.parent == checkpoints and not any(folder.iterdir()):
            folder.rmdir()
            removed.append(folder)
    if removed:
        logger.info(
            "Removed %d temporary file(s) left by an interrupted run: %s",
            len(removed),
            ", ".join(str(p) for p in removed),
        )
    return removed
