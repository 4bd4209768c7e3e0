"""Files written whole: a temporary sibling renamed over the target, so a reader (or the next run after a kill)
sees the old file or the new one, never part of one."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: str | Path, obj, indent: int = 2) -> Path:
    final = Path(path)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=indent))
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final
