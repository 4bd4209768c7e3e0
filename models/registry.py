"""The drafter registry: one entry per training method, and the only module that names one.

An entry says everything the rest of the code needs to know about a method: its typed config (the Hydra schema
of `method`), which entry script trains it, how its drafter is built, its training step, which decoder proposer
serves it, how it is exported and in which layouts. Code elsewhere looks a method up here (`get(name)`) and
calls what the entry points to; functions are named as "module:attribute" and imported on first use, so this
module imports no training or evaluation code (models/ never imports train/ or eval/).

Adding a drafter kind: its model file (config dataclass + a `DrafterBase` module + `build`), its training step,
its proposer in eval/engine/proposers/ (or an existing one), its exporter, conf/method/<name>.yaml (the Hydra
option: schema, name, optimizer defaults), and one entry below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headstart.models.distill import DistillConfig
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.medusa import MedusaConfig


def resolve(ref: str) -> Callable[..., Any]:
    """'package.module:attribute' -> the attribute (imported on first use)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Method:
    name: str  # as written in configs (`method=...`) and in checkpoints (config.json "method")
    config: type  # typed config dataclass: the `method` node's schema
    entry: str  # the training entry script, train/<entry>.py (./launch.sh <entry>)
    build: str  # (config, backbone, meta=None) -> drafter; meta: a checkpoint's config.json when reloading
    train_step: str  # (backbone, drafter, batch) -> (loss_sum, count, metrics); see train/steps.py
    proposer: str  # the decoder method that serves the trained drafter (eval/engine/proposers/)
    export: str  # (drafter_dir, meta, out, layouts, report) -> [folders]
    layouts: tuple[str, ...]  # export layouts, the first is the default

    def build_drafter(self, cfg, backbone, meta: dict | None = None):
        return resolve(self.build)(cfg, backbone, meta)

    def step_fn(self) -> Callable:
        return resolve(self.train_step)

    def exporter(self) -> Callable:
        return resolve(self.export)


_EAGLE = dict(
    entry="eagle",
    build="headstart.models.eagle:build",
    train_step="headstart.train.steps:eagle_step",
    proposer="eagle",
    export="headstart.models.export.eagle:export",
)

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "medusa",
            MedusaConfig,
            entry="medusa",
            build="headstart.models.medusa:build",
            train_step="headstart.train.steps:medusa_step",
            proposer="medusa",
            export="headstart.models.export.medusa:export",
            layouts=("medusa", "vllm"),
        ),
        Method("eagle", EagleConfig, layouts=("eagle", "eagle_vllm"), **_EAGLE),
        Method("eagle3", Eagle3Config, layouts=("eagle3", "speculators"), **{**_EAGLE, "proposer": "eagle3"}),
        Method(
            "distillspec",
            DistillConfig,
            entry="distill",
            build="headstart.models.distill_init:build",
            train_step="headstart.train.steps:distillspec_step",
            proposer="draft",  # a draft LM: the decoder's draft-model proposer
            export="headstart.models.export.draft:export",
            layouts=("hf",),
        ),
    )
}


class UnknownMethod(ValueError):
    pass


def get(name: str) -> Method:
    if name not in METHODS:
        raise UnknownMethod(f"unknown method {name!r}: expected one of {sorted(METHODS)}")
    return METHODS[name]


def of_config(cfg) -> Method:
    """The entry whose config class `cfg` is an instance of (exactly: Eagle3Config is not an EagleConfig here)."""
    for m in METHODS.values():
        if type(cfg) is m.config:
            return m
    raise UnknownMethod(f"{type(cfg).__name__} is no registered method's config")


def proposer_of(name: str) -> str:
    """The decoder method serving a trained `name` drafter."""
    return get(name).proposer
