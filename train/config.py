"""Typed schemas for training jobs. YAML files in conf/ only fill values; these dataclasses are registered in
Hydra's ConfigStore, so an unknown key (`method.num_head=5`) or a wrong type fails at compose time naming the
key, and `__post_init__` range checks run when the composed config is turned into objects (`to_job`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from headstart.data import DataConfig
from headstart.models.backbone import BackboneConfig
from headstart.models.distill import DistillConfig
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.medusa import MedusaConfig


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at train.max_steps
    grad_clip: float = 1.0  # 0 disables clipping

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr={self.lr}: must be > 0")
        if self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("optim.warmup_steps must be >= 0 and optim.min_lr_ratio in [0, 1]")


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


@dataclass
class TrainConfig:
    max_steps: int = 1000  # optimizer steps
    micro_batch_size: int = 4  # rows per process per forward
    grad_accum: int = 1
    mixed_precision: str = (
        "bf16"  # no | bf16 | fp16 (autocast for the drafter; the backbone has its own dtype)
    )
    log_every: int = 10
    eval_every: int = 200  # held-out loss and per-head accuracy
    eval_batches: int = 16
    save_every: int = 200  # accelerate save_state checkpoints
    keep_checkpoints: int = 2  # newest N kept; 0 keeps all
    resume: str = "auto"  # auto (latest checkpoint in the run dir) | never | path to a checkpoint folder
    seed: int = 0
    quick_eval_every: int = 0  # measured tau in the built-in decoder every N steps (0: off)
    quick_eval_prompts: int = 4
    quick_eval_tokens: int = 32
    dist_timeout_s: int = 600  # a rank that stops answering fails the others after this long
    device: str | None = None  # None: accelerate picks (cuda when present); "cpu" forces the CPU
    trace_rows: bool = (
        False  # write the row ids each rank consumed to run_dir/trace/ (checks sharding/resume)
    )

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.micro_batch_size < 1 or self.grad_accum < 1:
            raise ValueError("train.max_steps, train.micro_batch_size and train.grad_accum must be >= 1")
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            raise ValueError(f"train.mixed_precision={self.mixed_precision!r}: expected no | bf16 | fp16")
        if self.resume not in ("auto", "never") and not os.path.isdir(self.resume):
            raise ValueError(
                f"train.resume={self.resume!r}: expected auto, never, or an existing checkpoint folder"
            )


@dataclass
class JobConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # One folder per run, the same on every rank (no timestamps): resume=auto finds its checkpoints there.
    run_dir: str = "runs/${method_name}-${backbone.name}-${data.name}"
    cache_dir: str = "${oc.env:HEADSTART_CACHE,${oc.env:HOME}/.cache/headstart}"
    method_name: str = "medusa"
    method: Any = None


@dataclass
class MedusaJobConfig(JobConfig):
    method_name: str = "medusa"
    method: MedusaConfig = field(default_factory=MedusaConfig)


@dataclass
class DistillJobConfig(JobConfig):
    method_name: str = "distillspec"
    method: DistillConfig = field(default_factory=DistillConfig)


@dataclass
class EagleJobConfig(JobConfig):
    method_name: str = "eagle"
    method: EagleConfig = field(default_factory=EagleConfig)


@dataclass
class Eagle3JobConfig(JobConfig):
    method_name: str = "eagle3"
    method: Eagle3Config = field(default_factory=Eagle3Config)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="medusa_schema", node=MedusaJobConfig)
    cs.store(name="eagle_schema", node=EagleJobConfig)
    cs.store(name="eagle3_schema", node=Eagle3JobConfig)
    cs.store(name="distillspec_schema", node=DistillJobConfig)


def to_job(cfg: DictConfig) -> JobConfig:
    """Composed DictConfig -> typed objects (runs every __post_init__ check)."""
    return OmegaConf.to_object(cfg)
