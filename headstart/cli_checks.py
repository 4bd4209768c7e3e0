"""Checks on a composed Hydra config that must run before Hydra itself touches anything (resolving and
creating the run directory): a Hydra callback (`hydra.callbacks` in conf/train.yaml and eval/conf/eval.yaml)
that turns a missing required setting or an unusable output folder into one line and exit code 2."""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from headstart.errors import exit_user_error

REQUIRED = "${required:"  # conf/*.yaml: `path: ${required:backbone.path}` marks a setting the user must give


def _required(key: str):
    raise ValueError(f"{key} is required. Fix: {key}=...")


def register_required_resolver() -> None:
    OmegaConf.register_new_resolver("required", _required, replace=True)


def missing_required(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Keys still set to `${required:...}`. (YAML `???` cannot mark them: merging MISSING onto the schema's
    default keeps the default, so `backbone=hf` without `backbone.path` would silently train SmolLM2.)"""
    found = []
    for key in cfg:
        if prefix == "" and key == "hydra":
            continue
        value = cfg._get_node(key)
        if isinstance(value, DictConfig):
            found += missing_required(value, f"{prefix}{key}.")
        elif OmegaConf.is_interpolation(cfg, key) and str(value._value()).startswith(REQUIRED):
            found.append(f"{prefix}{key}")
    return found


def required_message(missing: list[str]) -> str:
    return f"{', '.join(missing)} is required here. Fix: add " + ", ".join(f"{k}=..." for k in missing)


def unknown_keys(cfg: DictConfig, obj, prefix: str = "") -> list[str]:
    """Keys of the composed `cfg` that the typed object built from it (`OmegaConf.to_object`) has no field
    for: Hydra adds a `+key=value` without checking it, and to_object then drops it silently."""
    if not dataclasses.is_dataclass(obj):
        return []  # a plain dict field (e.g. backbone.tiny) takes any key
    names = {f.name for f in dataclasses.fields(obj)}
    found = []
    for key in cfg:
        if prefix == "" and key == "hydra":
            continue
        if key not in names:
            found.append(f"{prefix}{key}")
        elif isinstance(node := cfg._get_node(key), DictConfig):
            found += unknown_keys(node, getattr(obj, str(key)), f"{prefix}{key}.")
    return found


def unknown_message(unknown: list[str], obj) -> str:
    """One line: the unknown keys, each with the setting it most likely meant."""
    known = _flat_fields(obj)
    hints = []
    for key in unknown:
        parent, _, leaf = key.rpartition(".")
        siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
        near = [k for k in known if k.rpartition(".")[2] == leaf] or [
            f"{parent}.{m}" if parent else m for m in difflib.get_close_matches(leaf, siblings, 1)
        ]
        hints.append(f"{near[0]}=..." if near else "remove it")
    return (
        f"{', '.join(unknown)}: no such setting (a +key is added unchecked and would be ignored). "
        f"Fix: {', '.join(hints)}"
    )


def _flat_fields(obj, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(obj) if dataclasses.is_dataclass(obj) else []:
        value = getattr(obj, f.name)
        out += _flat_fields(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else []
        out.append(f"{prefix}{f.name}")
    return out


def dir_problem(path: Path, key: str) -> str | None:
    """Why `path` cannot be the output folder (created here when missing), or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        return f"{key}={path} is (inside) a file, not a folder. Fix: another {key}=..."
    except OSError as e:
        return f"{key}={path} cannot be created ({e.strerror}). Fix: a writable {key}=..."
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{key}={path} is not writable. Fix: a writable {key}=..."
    return None


class RunChecks(Callback):
    """`dir_key`: the config key Hydra's run dir is (run_dir for training, out_dir for eval)."""

    def __init__(self, dir_key: str) -> None:
        self.dir_key = dir_key

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        if missing := missing_required(config):
            self._fail(required_message(missing))
        out = Path(str(OmegaConf.select(config, "hydra.run.dir")))
        if (problem := dir_problem(out, self.dir_key)) is not None:
            self._fail(problem)

    @staticmethod
    def _fail(message: str) -> None:
        exit_user_error(message)
