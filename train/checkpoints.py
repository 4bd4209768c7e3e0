"""Run-directory checkpoints: `run_dir/checkpoints/step_XXXXXXXX/` holds accelerate's `save_state` (drafter,
optimizer, scheduler, RNG and sampler state), `trainer_state.json` and `drafter/` (safetensors + config, what
the eval stage scores). Each is written into a `.tmp` folder and renamed when complete, so a run killed while
saving leaves the previous checkpoint as the latest one. `trainer_state.json`, written last, lists every file
with its size and content digest (headstart/digests.py): a checkpoint truncated, emptied or with flipped bytes
later (a full disk, a bad copy, bit rot) is skipped on resume, saying which file, and the previous complete
one is used.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from accelerate import Accelerator

from headstart.digests import file_digest, mismatch
from headstart.models.checkpoint import CONFIG_NAME, DRAFTER_DIR, FINAL_EVAL, CheckpointError

STATE_NAME = "trainer_state.json"
log = logging.getLogger("headstart.train")


def step_dirs(run_dir: Path) -> list[Path]:
    """Published checkpoints (`step_<n>`, no `.tmp`), oldest first, whatever their state."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    return [p for p in step_dirs(run_dir) if (p / STATE_NAME).is_file()]


def verify_checkpoint(path: Path) -> str | None:
    """None when `path` is a complete checkpoint, else what is wrong with it (sizes, then content digests)."""
    try:
        state = json.loads((path / STATE_NAME).read_text())
    except FileNotFoundError:
        return f"no {STATE_NAME}"
    except (OSError, ValueError) as e:
        return f"{STATE_NAME} unreadable ({e})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return f"{STATE_NAME} has no step"
    digests = state.get("digests", {})  # checkpoints written before digests were kept have none
    for name, size in state.get("files", {}).items():  # older checkpoints have no file list
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, {size} were written"
        if (problem := mismatch(f, digests.get(name), name)) is not None:
            return problem
    return None


def read_step(path: Path) -> int:
    return json.loads((Path(path) / STATE_NAME).read_text())["step"]


def find_resume_dir(run_dir: Path, resume: str) -> Path | None:
    """The checkpoint to resume from: resume=auto -> the newest complete one (a damaged newer one is skipped
    with a warning naming it), never -> None, a path -> that checkpoint (refused when damaged)."""
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume)
        if (problem := verify_checkpoint(path)) is not None:
            raise CheckpointError(
                f"train.resume={resume}: not a complete checkpoint ({problem}). Fix: point at a step_* folder"
            )
        return path
    candidates = step_dirs(run_dir)
    for path in reversed(candidates):
        if (problem := verify_checkpoint(path)) is None:
            return path
        log.warning(
            "checkpoint %s is damaged or incomplete (%s): skipping it, resuming from an older one",
            path,
            problem,
        )
    if candidates:
        raise CheckpointError(
            f"run_dir={run_dir}: none of its {len(candidates)} checkpoint(s) is complete. Fix: "
            "train.resume=never to start over (the old ones are moved aside), or another run_dir=..."
        )
    return None


def save_checkpoint(acc: Accelerator, run_dir: Path, step: int, save_drafter: Callable[[Path], None]) -> Path:
    """Every rank calls this (sharded strategies write per-rank files); the main process publishes it."""
    final = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    try:
        acc.save_state(str(tmp))
        save_drafter(tmp / DRAFTER_DIR)
    except (OSError, RuntimeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint stays the newest; free the space
        # torch.save reports a full disk as "PytorchStreamWriter failed writing file ...: unexpected pos"
        if isinstance(e, RuntimeError) and not any(
            s in str(e) for s in ("unexpected pos", "file write failed")
        ):
            raise
        if isinstance(e, RuntimeError):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp)) from e
        if e.filename is None:  # name the folder being written
            raise OSError(e.errno, e.strerror, str(tmp)) from e
        raise
    acc.wait_for_everyone()  # every rank's files are written before the list of them
    if acc.is_main_process:
        written = [p for p in sorted(tmp.rglob("*")) if p.is_file()]
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in written}
        digests = {str(p.relative_to(tmp)): file_digest(p) for p in written}
        state = {"step": step, "files": files, "digests": digests}
        (tmp / STATE_NAME).write_text(json.dumps(state, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    acc.wait_for_everyone()
    return final


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


PREVIOUS_RUN = ("checkpoints", DRAFTER_DIR, FINAL_EVAL, CONFIG_NAME, "eval", "export")


def set_aside_previous_run(run_dir: Path) -> Path | None:
    """train.resume=never in a folder holding another run's checkpoints or drafter: move that run's outputs to
    a sibling `<run_dir>.replaced-<time>` folder (returned), so nothing of it can be resumed or scored as ours
    and nothing is deleted."""
    run_dir = Path(run_dir)
    if not step_dirs(run_dir) and not (run_dir / DRAFTER_DIR).exists():
        return None
    dest = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
    dest.mkdir(parents=True)
    for name in PREVIOUS_RUN:
        if (run_dir / name).exists():
            (run_dir / name).rename(dest / name)
    return dest


# Settings a resumed run may change: how long it runs, how often it logs / evaluates / saves, where it runs.
# Everything else shapes the weights or the data order and must match the checkpoint's.
RESUME_MAY_CHANGE = {
    "train.max_steps",
    "train.log_every",
    "train.eval_every",
    "train.eval_batches",
    "train.save_every",
    "train.keep_checkpoints",
    "train.resume",
    "train.quick_eval_every",
    "train.quick_eval_prompts",
    "train.quick_eval_tokens",
    "train.dist_timeout_s",
    "train.device",
    "train.trace_rows",
}
RESUME_CHECKED = ("backbone", "method_name", "method", "data", "optim", "train")


def _flat(value, prefix: str) -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out |= _flat(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: value}


def saved_job(resume_dir: Path, run_dir: Path) -> dict | None:
    """The resolved config a checkpoint was trained with: its drafter's config.json (`job`), else (older
    checkpoints) the run folder's config.json; None when neither is readable."""
    for f, key in ((resume_dir / DRAFTER_DIR / CONFIG_NAME, "job"), (run_dir / "config.json", None)):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        data = data.get(key) if key else data
        if isinstance(data, dict):
            return data
    return None


def check_resumable(resume_dir: Path | None, run_dir: Path, resolved: dict) -> None:
    """Refuse to resume a checkpoint trained with other settings (backbone, method, data, optimizer, batch,
    seed...: a changed value would be recorded but have no or a silent effect), listing every difference.
    train.max_steps and logging / eval / save intervals may change."""
    if resume_dir is None:
        return
    saved = saved_job(resume_dir, run_dir)
    if saved is None:
        log.warning("checkpoint %s records no config: resuming without checking the settings", resume_dir)
        return
    old = {k: v for s in RESUME_CHECKED for k, v in _flat(saved.get(s), s).items()}
    new = {k: v for s in RESUME_CHECKED for k, v in _flat(resolved.get(s), s).items()}
    diffs = [
        f"{k}: {old.get(k, '<unset>')} -> {new.get(k, '<unset>')}"
        for k in sorted(old.keys() | new.keys())
        if k not in RESUME_MAY_CHANGE and old.get(k) != new.get(k)
    ]
    if diffs:
        raise ValueError(
            f"run_dir={run_dir} holds checkpoint {resume_dir.name} trained with other settings "
            f"({'; '.join(diffs)}); resuming would ignore them. Fix: the same settings, another run_dir=..., "
            "or train.resume=never to start over (the old run is moved aside)"
        )
