"""Typed schemas for training jobs. The dataclasses are registered in Hydra's ConfigStore, so an unknown key
(`method.num_head=5`) or a wrong type fails at compose time naming the key, and `__post_init__` range checks
run when the composed config is turned into objects (`to_job`). YAML files in conf/ set only what differs from
these defaults.

`method` is a config group (conf/method/<name>.yaml, one per registry entry): choosing `method=eagle3` (on the
command line, in an experiment's defaults or in a multirun) brings the method's typed schema (stored here from
the registry as `method_schema_<name>`), `method_name` and the method's optimizer defaults together.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from headstart.cli_checks import (
    missing_required,
    register_required_resolver,
    required_message,
    unknown_keys,
    unknown_message,
)
from headstart.data import DataConfig
from headstart.models import registry
from headstart.models.backbone import BackboneConfig
from headstart.tracking import LoggerConfig


@dataclass
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at train.max_steps
    grad_clip: float = 1.0  # 0 disables clipping

    def __post_init__(self) -> None:
        if not math.isfinite(self.lr) or self.lr <= 0:  # nan passes `<= 0`
            raise ValueError(
                f"optim.lr={self.lr}: must be a finite number > 0. Fix: optim.lr=1e-3 (Medusa's default; "
                "EAGLE's is 1e-4)"
            )
        if self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("optim.warmup_steps must be >= 0 and optim.min_lr_ratio in [0, 1]")


@dataclass
class TrainConfig:
    max_steps: int = 1000  # optimizer steps
    micro_batch_size: int = 4  # rows per process per forward
    grad_accum: int = 1
    # autocast for the drafter (the backbone has its own dtype): auto = bf16 / fp16 where the device computes it
    # natively, else no (headstart/hardware.py) | no | bf16 | fp16
    mixed_precision: str = "auto"
    log_every: int = 10
    eval_every: int = 200  # held-out loss and per-head accuracy
    eval_batches: int = 16
    save_every: int = 200  # accelerate save_state checkpoints
    keep_checkpoints: int = 2  # newest N kept; 0 keeps all
    resume: str = "auto"  # auto (latest checkpoint in the run dir) | never | path to a checkpoint folder
    seed: int = 0
    # tau measured in the built-in decoder on held-out prompts every N steps (None: with each eval; 0: off)
    quick_eval_every: int | None = None
    quick_eval_prompts: int = 4
    quick_eval_tokens: int = 32
    dist_timeout_s: int = 600  # a rank that stops answering fails the others after this long
    device: str | None = None  # None: accelerate picks (cuda when present); "cpu" forces the CPU
    # micro-batches of rows of similar length (train/sampling.py): less right-padding. Worth it where every
    # position costs (EAGLE's layer: its configs turn it on); Medusa's and DistillSpec's configs leave it off
    group_by_length: bool = False
    trace_rows: bool = (
        False  # write the row ids each rank consumed to run_dir/trace/ (checks sharding/resume)
    )

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.micro_batch_size < 1 or self.grad_accum < 1:
            raise ValueError("train.max_steps, train.micro_batch_size and train.grad_accum must be >= 1")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(
                f"train.mixed_precision={self.mixed_precision!r}: expected auto | no | bf16 | fp16. "
                "Fix: train.mixed_precision=auto"
            )
        for key in ("log_every", "eval_every", "save_every"):  # each is a step modulus
            if getattr(self, key) < 1:
                raise ValueError(
                    f"train.{key}={getattr(self, key)}: must be >= 1 (every N steps; the last step always "
                    f"logs, evaluates and saves). Fix: train.{key}={self.max_steps} (train.max_steps) for once "
                    "at the end"
                )
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


def register_configs() -> None:
    register_required_resolver()
    cs = ConfigStore.instance()
    cs.store(name="job_schema", node=JobConfig)
    cs.store(group="optim", name="adamw", node=OptimConfig)
    cs.store(group="logger", name="none", node=LoggerConfig(kind="none"))
    cs.store(group="logger", name="wandb", node=LoggerConfig(kind="wandb"))
    for method in registry.METHODS.values():  # conf/method/<name>.yaml puts the schema at `method`
        # a root config, not a group: `--help` lists only the groups a job chooses from
        cs.store(name=f"method_schema_{method.name}", node=method.config)


class EntryError(ValueError):
    """A method trained through another method's entry script."""


def to_job(cfg: DictConfig, entry: str | None = None) -> JobConfig:
    """Composed DictConfig -> typed objects (runs every __post_init__ check). `entry`: the script that composed
    it (train/<entry>.py); a method that another script trains is refused, naming the right command."""
    if missing := missing_required(cfg):
        raise ValueError(required_message(missing))
    job = OmegaConf.to_object(cfg)
    if unknown := unknown_keys(cfg, job):
        raise ValueError(unknown_message(unknown, job))
    method = registry.get(job.method_name)
    if registry.of_config(job.method) is not method:
        raise EntryError(
            f"method_name={job.method_name} but the method config is a {type(job.method).__name__}. "
            "Fix: choose the method with method=<name>, not method_name="
        )
    if job.data.eval_rows == 0:  # found only at the first eval otherwise, with no checkpoint saved
        raise ValueError(
            "data.eval_rows=0: training evaluates on held-out rows (every train.eval_every steps, at the end, "
            "and the quick eval's prompts). Fix: data.eval_rows=1 or more (64 is the default)"
        )
    if entry is not None and method.entry != entry:
        raise EntryError(
            f"method={method.name} is trained by train/{method.entry}.py, not train/{entry}.py. "
            f"Fix: ./launch.sh {method.entry} method={method.name} ..."
        )
    return job
