"""Experiment tracking settings shared by training and evaluation: `logger=none|wandb`.

W&B goes through accelerate's trackers (training: scalars; eval: scalars, the per-category or per-checkpoint
table and the PNG figures). Offline: WANDB_MODE=offline (or logger.mode=offline); sync later with
`wandb sync <run or out_dir>/wandb/offline-run-*`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoggerConfig:
    kind: str = "none"  # none | wandb
    project: str = "headstart"
    entity: str | None = None
    run_name: str | None = None  # default: the run directory's name
    mode: str | None = None  # online | offline | disabled; None leaves WANDB_MODE as the environment sets it
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in ("none", "wandb"):
            raise ValueError(
                f"logger.kind={self.kind!r}: expected 'none' or 'wandb' (pick logger=none|wandb)"
            )
