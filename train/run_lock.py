"""One training per run folder. Two jobs on one run_dir would write the same checkpoints, and with
train.resume=never the second would move the live first run's outputs aside while it keeps writing.

The lock is an advisory `flock` on `run_dir/.lock`, held by the main process for the whole job: the kernel
drops it when the process dies (kill -9, a node failure on a local disk), so a stale lock never blocks a
resume and there is no pid file to clean. The file records who holds it (pid, host, start time, command), so a
refusal names the other process. flock is not reliable on every network filesystem: there, keep one job per
run_dir by hand.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".lock"


class RunInUse(ValueError):
    """Another live process trains in this run_dir; the message names it and the fix."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return (
            f"pid {info['pid']} on host {info['host']}, started {info['started']}: "
            f"{' '.join(info['argv'])[:120]}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet recorded itself"


@contextmanager
def run_lock(run_dir: Path, active: bool = True):
    """Hold the run folder's lock for the block; `active` False (ranks other than the main one): a no-op."""
    if not active:
        yield
        return
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInUse(
                f"run_dir={run_dir} is in use by another training ({_holder(path)}). Fix: wait for it to "
                "finish or stop it, or train in another run_dir=..."
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "argv": sys.argv,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released: a later reader sees no holder (the file itself stays, see above)
    finally:
        os.close(fd)  # closing drops the flock
