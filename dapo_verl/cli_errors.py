"""How ``dapo-verl`` words a failure: one line per problem on stderr, and an ``OSError`` as its file and a fix."""

from __future__ import annotations

import errno
import sys

__all__ = ["fail", "os_error"]


def fail(command: str, message: object) -> int:
    """Print ``dapo-verl <command>: <message>`` on one line of stderr (one line per problem of a refused config);
    return exit status 2."""
    problems = getattr(message, "problems", None)  # dapo_verl.preflight.ConfigRefused, imported only when needed
    for line in [str(p) for p in problems] if problems else [message]:
        print(f"dapo-verl {command}: {' '.join(str(line).split())}", file=sys.stderr)
    return 2


def os_error(err: OSError, *, resumable: bool = False) -> str:
    """An OSError as one line: what failed, the file, and the fix.

    The fix names the option that chose the failed file's place: the error's ``option`` attribute where it has
    one (the model cache's ``local.cache_dir``), else ``--out``.

    Args:
        err: The error; one without errno or text is returned as it is.
        resumable: Whether the same command continues from a checkpoint (``train``, ``ablate``), which the fix
            for a full disk says.
    """
    if err.errno is None or not err.strerror:
        return str(err)
    where = f" ({err.filename})" if err.filename else ""
    option = getattr(err, "option", "--out")
    again = "run the same command again" + (" (a run continues from its last checkpoint)" if resumable else "")
    fixes = {
        errno.ENOSPC: f"Free disk space and {again}.",
        errno.EDQUOT: f"Free space within your quota and {again}.",
        errno.EROFS: f"Point {option} at a writable disk.",
        errno.EACCES: f"Point {option} at a folder you may write to, or fix its permissions.",
        errno.EPERM: f"Point {option} at a folder you may write to, or fix its permissions.",
        errno.ENOTDIR: f"{option} must name a directory, not a file.",
        errno.EEXIST: f"{option} must name a directory, not a file.",
        errno.EFBIG: f"The file outgrew this process's file-size limit (ulimit -f); raise the limit and {again}.",
    }
    return f"{err.strerror}{where}. {fixes.get(err.errno, 'Check that path and run the command again.')}"
