"""Experiment tracking shared by training and evaluation: `logger=none|wandb`.

W&B goes through accelerate's trackers in training (scalars, optional model artifacts) and `wandb.init` in
the eval stage (scalars, the per-category or per-checkpoint table and the PNG figures). A training run keeps
its W&B run id in `<run_dir>/wandb_run.json`: a resumed run continues the same W&B run, and an eval of one of
its checkpoints joins its group (job_type "eval") with the id in its config. Offline: WANDB_MODE=offline (or
logger.mode=offline); sync later with `wandb sync <run or out_dir>/wandb/offline-run-*`.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

RUN_FILE = "wandb_run.json"
LOG_MODEL = ("none", "checkpoint", "end")


@dataclass
class LoggerConfig:
    kind: str = "none"  # none | wandb
    project: str = "headstart"
    entity: str | None = None
    run_name: str | None = None  # default: the run directory's name
    mode: str | None = None  # online | offline | disabled; None leaves WANDB_MODE as the environment sets it
    tags: list[str] = field(default_factory=list)
    # Drafter folders as W&B model artifacts, like the HF Trainer's WANDB_LOG_MODEL (which sets it when this is
    # "none"): checkpoint = every save + the final one, end = the final one only
    log_model: str = "none"

    def __post_init__(self) -> None:
        if self.kind not in ("none", "wandb"):
            raise ValueError(
                f"logger.kind={self.kind!r}: expected 'none' or 'wandb' (pick logger=none|wandb)"
            )
        if self.log_model not in LOG_MODEL:
            raise ValueError(f"logger.log_model={self.log_model!r}: expected one of {list(LOG_MODEL)}")

    def model_logging(self) -> str:
        env = os.environ.get("WANDB_LOG_MODEL", "").lower()
        return self.log_model if self.log_model != "none" or env not in LOG_MODEL else env


def training_run_kwargs(logger: LoggerConfig, run_dir: str | Path, resuming: bool) -> dict:
    """wandb.init keyword arguments of a training run. Resuming keeps the run's id (same W&B run, continued);
    a fresh start gets a new id, written to the run dir. Call on the main process only."""

    run_dir = Path(run_dir)
    saved = _read(run_dir / RUN_FILE)
    run_id = saved["id"] if resuming and saved.get("id") else secrets.token_hex(4)  # W&B ids: [a-z0-9]
    name = logger.run_name or run_dir.name
    info = {"id": run_id, "name": name, "group": name, "project": logger.project, "entity": logger.entity}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_FILE).write_text(json.dumps(info, indent=2))
    kw = {"id": run_id, "resume": "allow", "name": name, "group": name, "job_type": "train"}
    kw |= {"dir": str(run_dir), "tags": list(logger.tags)}
    return kw | ({"entity": logger.entity} if logger.entity else {})


def training_run_of(path: str | Path) -> dict | None:
    """The W&B run that trained a checkpoint: `wandb_run.json` in the run dir above `path` (a run dir, its
    drafter/, or checkpoints/step_*/drafter/), or None."""
    path = Path(path).resolve()
    for folder in (path, *list(path.parents)[:3]):
        info = _read(folder / RUN_FILE)
        if info.get("id"):
            return info
    return None


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def log_model_artifact(run, folder: Path, step: int, aliases: list[str], metadata: dict) -> None:
    """The drafter folder as a W&B `model` artifact named after the run (`drafter-<run id>`)."""
    import wandb

    art = wandb.Artifact(f"drafter-{run.id}", type="model", metadata={"step": step, **metadata})
    art.add_dir(str(folder))
    run.log_artifact(art, aliases=[f"step_{step}", *aliases])
