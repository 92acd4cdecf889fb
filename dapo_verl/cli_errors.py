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


_OS_FIXES = {
    errno.ENOSPC: "Free disk space and run the same command again (a run continues from its last checkpoint).",
    errno.EDQUOT: "Free space within your quota and run the same command again.",
    errno.EROFS: "Pass an --out on a writable disk.",
    errno.EACCES: "Pass an --out you may write to, or fix its permissions.",
    errno.EPERM: "Pass an --out you may write to, or fix its permissions.",
    errno.ENOTDIR: "--out must name a directory, not a file.",
    errno.EEXIST: "--out must name a directory, not a file.",
    errno.EFBIG: "The file outgrew this process's file-size limit (ulimit -f); raise the limit and run the same "
                 "command again.",
}


def os_error(err: OSError) -> str:
    """An OSError as one line that names the file and the fix (a message without errno is already one)."""
    if err.errno is None or not err.strerror:
        return str(err)
    where = f" ({err.filename})" if err.filename else ""
    return f"{err.strerror}{where}. {_OS_FIXES.get(err.errno, 'Check that path and run the command again.')}"
