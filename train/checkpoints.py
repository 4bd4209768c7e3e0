"""Run-directory checkpoints: `run_dir/checkpoints/step_XXXXXXXX/` holds accelerate's `save_state` (drafter,
optimizer, scheduler, RNG and sampler state), `trainer_state.json` and `drafter/` (safetensors + config, what
the eval stage scores). Each is written into a `.tmp` folder and renamed when complete, so a run killed while
saving leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from accelerate import Accelerator

from headstart.models.checkpoint import DRAFTER_DIR

STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def find_resume_dir(run_dir: Path, resume: str) -> Path | None:
    if resume == "never":
        return None
    if resume == "auto":
        found = checkpoint_dirs(run_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"train.resume={resume}: no trainer_state.json there. Fix: point at a step_* folder"
        )
    return path


def save_checkpoint(acc: Accelerator, run_dir: Path, step: int, save_drafter: Callable[[Path], None]) -> Path:
    """Every rank calls this (sharded strategies write per-rank files); the main process publishes it."""
    final = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    acc.save_state(str(tmp))
    save_drafter(tmp / DRAFTER_DIR)
    if acc.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    acc.wait_for_everyone()
    return final


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def check_resumable(run_dir: Path, resume: str, resolved: dict) -> None:
    """Refuse to resume a run directory whose checkpoints were trained with another backbone, method or data
    (train.max_steps and logging may change; those may not)."""
    saved_file = run_dir / "config.json"
    if resume != "auto" or not saved_file.is_file() or find_resume_dir(run_dir, resume) is None:
        return
    saved = json.loads(saved_file.read_text())
    for section in ("backbone", "method_name", "method", "data"):
        if saved.get(section) != resolved.get(section):
            raise ValueError(
                f"run_dir={run_dir} holds checkpoints trained with a different `{section}` config. "
                "Fix: choose another run_dir=..., or train.resume=never to start over in it"
            )
