"""How every command-line entry point reports a mistake the user can fix: one line on stderr, exit code 2,
no traceback (HEADSTART_TRACEBACK=1 shows it). The project's own errors (BackboneError, DataError, EvalError,
TreeError, CacheFullError, ...) are ValueErrors whose message names the cause and the fix."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)
EXIT_USER_ERROR = 2


@contextmanager
def exit_on_user_error():
    try:
        yield
    except USER_ERRORS as e:
        if os.environ.get("HEADSTART_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
