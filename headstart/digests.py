"""Content digests of the files a run writes (checkpoints, drafters, data and hidden-state caches), checked
where they are read back: a size check misses a same-size corruption (flipped bits, a bad copy), which would
otherwise be resumed or trained on silently.

sha256 over the bytes: on the 2-core AMD EPYC dev box (SHA extensions) it hashes ~290 MB/s against blake2b's
~135 MB/s (100 MB file, best of 3), i.e. ~0.35 s per 100 MB written or read back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

ALGO = "sha256"


def file_digest(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, ALGO).hexdigest()


def bytes_digest(chunks: Iterable[bytes | memoryview]) -> str:
    h = hashlib.new(ALGO)
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def mismatch(path: str | Path, recorded: str | None, name: str | None = None) -> str | None:
    """Why `path` does not hold what was written (its digest differs from `recorded`), or None; None too when
    nothing was recorded (files written before digests were kept)."""
    if recorded is None:
        return None
    actual = file_digest(path)
    if actual != recorded:
        return f"{name or Path(path).name} was changed after it was written ({ALGO} {actual[:12]}, {recorded[:12]} recorded)"
    return None
