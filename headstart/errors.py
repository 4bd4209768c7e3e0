"""How every command-line entry point reports a mistake the user can fix: one line on stderr, exit code 2,
no traceback (HEADSTART_TRACEBACK=1 shows it). The project's own errors (BackboneError, DataError, EvalError,
TreeError, CacheFullError, ...) are ValueErrors whose message names the cause and the fix."""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)
EXIT_USER_ERROR = 2


def exit_user_error(message: str) -> None:
    """Print `error: message` and exit 2. Under a launcher (launch.sh sets HEADSTART_ERROR_FILE when several
    processes run under accelerate), the line is also appended there, so the launcher can end with it and
    exit 2 instead of accelerate's / torchrun's traceback and exit code 1."""
    line = f"error: {message}"
    print(line, file=sys.stderr)
    if path := os.environ.get("HEADSTART_ERROR_FILE"):
        try:
            with open(path, "a") as f:
                f.write(line.replace("\n", " ") + "\n")
        except OSError:
            pass
    sys.exit(EXIT_USER_ERROR)


def os_error_message(e: OSError) -> str | None:
    """One line for the OS errors a user fixes outside the program (a full disk, a read-only or foreign folder),
    naming the path; None for the others (they stay tracebacks: they are bugs until shown otherwise)."""
    path = e.filename or "the output folder"  # a failed write() names no file; callers add it where they can
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full at {path} ({e.strerror}). Fix: free space there, or write elsewhere"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"{path} is not writable ({e.strerror}). Fix: a writable folder (run_dir=, out_dir=, --out, or "
            "HEADSTART_CACHE for the caches)"
        )
    return None


@contextmanager
def exit_on_user_error():
    try:
        yield
    except USER_ERRORS as e:
        if os.environ.get("HEADSTART_TRACEBACK"):
            raise
        exit_user_error(str(e))
    except OSError as e:
        if os.environ.get("HEADSTART_TRACEBACK") or (message := os_error_message(e)) is None:
            raise
        exit_user_error(message)
