"""A drafter checkpoint: `model.safetensors` (the drafter's own weights, never the backbone's) plus
`config.json` (method, method config, the backbone spec and its fingerprint). Loading rebuilds the drafter from
the folder alone, and refuses a backbone whose hidden size or vocabulary differs from the one it was trained on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from headstart.atomic import write_json
from headstart.digests import file_digest, mismatch
from headstart.models import registry
from headstart.models.backbone import Backbone, BackboneConfig, check_compatible
from headstart.models.drafter import Drafter

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"
WEIGHTS_DIGEST = "weights_sha256"  # config.json: the digest of model.safetensors as written
DRAFTER_DIR = "drafter"  # a run folder's final drafter, and the drafter inside every step checkpoint
FINAL_EVAL = "final_eval.json"  # a finished run's last held-out evaluation (a copy of its drafter's "eval")


log = logging.getLogger("headstart.models")


class CheckpointError(ValueError):
    """A path that holds no usable drafter checkpoint; the message names the fix."""


@dataclass
class LoadedDrafter:
    """A drafter, the config.json it was loaded with (read once) and its folder."""

    drafter: Drafter
    meta: dict
    path: Path | None = None


def build_drafter(method: str, method_cfg, backbone: Backbone) -> Drafter:
    """A fresh drafter of `method` (a registry name) on `backbone`."""
    return registry.get(method).build_drafter(method_cfg, backbone)


def atomic_dir(final: Path):
    """Context manager: yields a temporary sibling folder that replaces `final` only when the block succeeds."""
    from contextlib import contextmanager

    @contextmanager
    def _cm():
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
            old = final.with_name(final.name + f".old{os.getpid()}")
            if final.exists():
                final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return _cm()


def save_drafter(
    out_dir: str | Path,
    drafter: nn.Module,
    method: str,
    method_cfg,
    backbone_cfg: BackboneConfig,
    backbone: Backbone,
    extra: dict | None = None,
    state: dict | None = None,
) -> Path:
    """Write the drafter atomically. `state` overrides drafter.state_dict() (e.g. gathered ZeRO-3 shards).
    A drafter may add to the meta (`checkpoint_meta()`: DistillSpec's draft HF config); tensors tied to an
    earlier one (a draft LM's lm_head and embeddings) are stored once and named in meta["tied_keys"]."""
    out_dir = Path(out_dir)
    meta = {
        "method": method,
        "method_config": asdict(method_cfg),
        "backbone": asdict(backbone_cfg),
        "backbone_fingerprint": backbone.fingerprint(),
        **drafter.checkpoint_meta(),
        **(extra or {}),
    }
    state, tied = untie(state or drafter.state_dict())
    if tied:
        meta["tied_keys"] = tied
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    with atomic_dir(out_dir) as tmp:
        save_file(state, tmp / WEIGHTS_NAME, metadata={"format": "pt", "method": method})
        meta[WEIGHTS_DIGEST] = file_digest(tmp / WEIGHTS_NAME)  # checked by load_drafter
        (tmp / CONFIG_NAME).write_text(json.dumps(meta, indent=2, default=str))
    return out_dir


def untie(state: dict) -> tuple[dict, dict[str, str]]:
    """Drop tensors that alias an earlier one (safetensors refuses shared memory) -> (state, {dropped: kept})."""
    kept, tied, seen = {}, {}, {}
    for key, value in state.items():
        ptr = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if ptr in seen and value.numel() > 0:  # every empty tensor may report the same pointer
            tied[key] = seen[ptr]
        else:
            seen[ptr], kept[key] = key, value
    return kept, tied


HALF_WRITTEN = re.compile(
    r"\.(tmp|old)\d*$"
)  # save_checkpoint's step_*.tmp, atomic_dir's *.tmp<pid> / *.old<pid>


def half_written(path: Path) -> bool:
    """A folder inside one a run was writing when it stopped (never published: may be incomplete)."""
    return any(HALF_WRITTEN.search(part) for part in Path(path).parts)


def refuse_half_written(path: Path) -> None:
    if half_written(path):
        raise CheckpointError(
            f"{path} is a half-written checkpoint (its run stopped while saving it; it may be incomplete). "
            f"Fix: use a complete checkpoints/step_*/{DRAFTER_DIR} folder or the run's {DRAFTER_DIR}/"
        )


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    refuse_half_written(path)
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file() or not (path / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(
            f"{path} is not a headstart drafter checkpoint (needs {CONFIG_NAME} and {WEIGHTS_NAME}). "
            "Fix: point at a run's drafter/ folder or a checkpoint written by train/*.py"
        )
    try:
        meta = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"{cfg_file} is unreadable or not JSON ({e}). Fix: restore it or re-train"
        ) from e
    if not isinstance(meta, dict) or not {"method", "method_config", "backbone_fingerprint"} <= meta.keys():
        raise CheckpointError(
            f"{cfg_file} is not a headstart drafter config (no method / method_config / backbone_fingerprint). "
            "Fix: point at a checkpoint written by train/*.py"
        )
    return meta


def load_drafter(path: str | Path, backbone: Backbone, meta: dict | None = None) -> tuple[Drafter, dict]:
    """Rebuild a drafter from its folder onto `backbone` (checked for compatibility first). `meta`: the folder's
    config.json when the caller has already read it (it is not read again)."""
    path = Path(path)
    meta = read_meta(path) if meta is None else meta
    check_compatible(backbone, meta["backbone_fingerprint"], f"drafter checkpoint {path}")
    method = registry.get(meta["method"])
    drafter = method.build_drafter(method.config(**meta["method_config"]), backbone, meta)
    try:
        problem = mismatch(path / WEIGHTS_NAME, meta.get(WEIGHTS_DIGEST))
    except FileNotFoundError as e:  # e.g. pruned by the training writing this run, after read_meta
        raise CheckpointError(
            f"{path / WEIGHTS_NAME} is gone (removed while it was being read, e.g. an old checkpoint pruned by "
            "a training). Fix: use a newer checkpoint or the run's drafter/"
        ) from e
    if problem is not None:
        raise CheckpointError(
            f"{path / WEIGHTS_NAME}: {problem}, so it does not hold the trained weights. Fix: restore the "
            "file or use another checkpoint (e.g. checkpoints/step_*/drafter of the run)"
        )
    try:
        state = load_file(path / WEIGHTS_NAME)
        state |= {key: state[src] for key, src in meta.get("tied_keys", {}).items()}
        drafter.load_state_dict(state, strict=True)
    except (OSError, KeyError, RuntimeError, SafetensorError) as e:  # truncated, emptied, other tensors
        raise CheckpointError(
            f"{path / WEIGHTS_NAME} does not hold this drafter's weights ({type(e).__name__}: {str(e)[:300]}). "
            "Fix: restore the file or use another checkpoint"
        ) from e
    return drafter.to(device=backbone.device), meta


def load_for_export(drafter_dir: Path, meta: dict) -> tuple[Drafter, Backbone]:
    """The drafter on its backbone rebuilt in fp32 from `meta` (exporters write exact weights from it)."""
    from headstart.models.backbone import load_backbone

    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": "float32"}))
    return load_drafter(drafter_dir, backbone, meta)[0], backbone


def weights_signature(path: Path) -> str:
    """Size and mtime of the folder's weights: a decoding.json measured on other weights is stale."""
    st = (Path(path) / WEIGHTS_NAME).stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder -> its final drafter; a drafter folder as it is."""
    path = Path(path)
    return path / DRAFTER_DIR if (path / DRAFTER_DIR / CONFIG_NAME).is_file() else path


def checkpoint_meta(p: Path) -> dict | None:
    """The config.json of a drafter folder (weights plus a headstart config.json), None for anything else
    (e.g. an HF model folder in the run)."""
    if not (p / WEIGHTS_NAME).is_file():
        return None
    try:
        meta = json.loads((p / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(meta, dict) and {"method", "backbone", "backbone_fingerprint"} <= meta.keys()
    return meta if ok else None


def step_of(path: Path, meta: dict) -> int | None:
    if isinstance(meta.get("step"), int):
        return meta["step"]
    found = [
        int(m.group(1)) for part in path.parts if (m := re.fullmatch(r"(?:step|checkpoint)[_-]?(\d+)", part))
    ]
    return found[-1] if found else None


def _configs_under(root: Path, tries: int = 5) -> list[Path]:
    """Every config.json under `root`; a training beside us renames `step_*.tmp` folders while the walk runs
    (a vanished folder: walk again)."""
    for _ in range(tries - 1):
        try:
            return sorted(root.rglob(CONFIG_NAME))
        except FileNotFoundError:
            continue
    return sorted(root.rglob(CONFIG_NAME))


def find_checkpoints(path: str | Path) -> dict[Path, dict]:
    """{folder: its config.json} for a checkpoint folder itself, or for every checkpoint folder under a run
    folder (half-written `*.tmp*` ones skipped), in path order."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint={path}: no such folder. Fix: checkpoint=runs/<run>/{DRAFTER_DIR} or a run folder"
        )
    refuse_half_written(root)
    if (root / WEIGHTS_NAME).is_file() and (root / CONFIG_NAME).is_file():  # a drafter folder itself
        return {root: read_meta(root)}
    found = {}
    for config in _configs_under(root):
        if not half_written(config.parent.relative_to(root)) and (meta := checkpoint_meta(config.parent)):
            found[config.parent] = meta
    if not found:
        raise CheckpointError(
            f"checkpoint={path} holds no drafter checkpoint (a folder with {CONFIG_NAME} + {WEIGHTS_NAME}). "
            f"Fix: point at runs/<run>/{DRAFTER_DIR}, a checkpoints/step_*/{DRAFTER_DIR} folder, or the run folder"
        )
    return found


def write_final_eval(run_dir: Path, final_eval: dict) -> Path:
    """<run_dir>/final_eval.json, written atomically (a killed run leaves the old file or the new one)."""
    return write_json(Path(run_dir) / FINAL_EVAL, final_eval)


def read_final_eval(run_dir: Path) -> dict:
    """A finished run's last held-out evaluation: final_eval.json, or (when it is missing or damaged, with a
    warning naming it) the same figures from its drafter's config.json; {} when the run has neither."""
    path = Path(run_dir) / FINAL_EVAL
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return data
        why = "not a JSON object"
    except FileNotFoundError:
        why = None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = f"unreadable ({e})"
    drafter = Path(run_dir) / DRAFTER_DIR
    if why:
        log.warning("%s is %s: using the same figures from %s", path, why, drafter / CONFIG_NAME)
    return read_meta(drafter).get("eval", {}) if checkpoint_meta(drafter) else {}
