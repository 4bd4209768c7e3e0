"""A drafter checkpoint: `model.safetensors` (the drafter's own weights, never the backbone's) plus
`config.json` (method, method config, the backbone spec and its fingerprint). Loading rebuilds the drafter from
the folder alone, and refuses a backbone whose hidden size or vocabulary differs from the one it was trained on.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from headstart.models.backbone import Backbone, BackboneConfig, check_compatible
from headstart.models.distill import DistillConfig
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.medusa import MedusaConfig, MedusaHeads

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def build_drafter(method: str, method_cfg, backbone: Backbone) -> nn.Module:
    """The one place that maps a method name to its drafter module."""
    if method == "medusa":
        heads = MedusaHeads(method_cfg, backbone.hidden_size, backbone.vocab_size)
        heads.attach_lm_head(backbone.lm_head, init=True)
        return heads
    if method in ("eagle", "eagle3"):
        from headstart.models.eagle import EagleDrafter

        drafter = EagleDrafter(method_cfg, backbone.config, backbone.vocab_size)
        drafter.attach(backbone.embed_tokens, backbone.lm_head)
        return drafter.to(device=backbone.device)
    if method == "distillspec":
        from headstart.models.distill_init import build_distill_drafter

        return build_distill_drafter(method_cfg, backbone)
    raise ValueError(f"unknown method {method!r}: expected one of {sorted(METHOD_CONFIGS)}")


METHOD_CONFIGS = {
    "medusa": MedusaConfig,
    "distillspec": DistillConfig,
    "eagle": EagleConfig,
    "eagle3": Eagle3Config,
}


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
        **(drafter.checkpoint_meta() if hasattr(drafter, "checkpoint_meta") else {}),
        **(extra or {}),
    }
    state, tied = untie(state or drafter.state_dict())
    if tied:
        meta["tied_keys"] = tied
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    with atomic_dir(out_dir) as tmp:
        save_file(state, tmp / WEIGHTS_NAME, metadata={"format": "pt", "method": method})
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


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file() or not (path / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(
            f"{path} is not a headstart drafter checkpoint (needs {CONFIG_NAME} and {WEIGHTS_NAME}). "
            "Fix: point at a run's drafter/ folder or a checkpoint written by train/*.py"
        )
    return json.loads(cfg_file.read_text())


def load_drafter(path: str | Path, backbone: Backbone) -> tuple[nn.Module, dict]:
    """Rebuild a drafter from its folder onto `backbone` (checked for compatibility first)."""
    path = Path(path)
    meta = read_meta(path)
    check_compatible(backbone, meta["backbone_fingerprint"], f"drafter checkpoint {path}")
    method = meta["method"]
    method_cfg = METHOD_CONFIGS[method](**meta["method_config"])
    if method == "distillspec":  # rebuilt from the saved HF config: no pretrained draft or pruning needed
        from headstart.models.distill_init import rebuild_drafter

        drafter = rebuild_drafter(method_cfg, meta["draft_config"], backbone)
    else:
        drafter = build_drafter(method, method_cfg, backbone)
    state = load_file(path / WEIGHTS_NAME)
    state |= {key: state[src] for key, src in meta.get("tied_keys", {}).items()}
    drafter.load_state_dict(state, strict=True)
    return drafter.to(device=backbone.device), meta
