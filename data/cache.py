"""Fingerprints and the on-disk cache of tokenized splits.

A cache entry is one safetensors file (int32 token ids and labels, flat, with per-sample offsets; the stats as
JSON metadata), named by a hash of everything that changes its content: the source file (path, size, mtime),
the data config, the tokenizer (vocab size, chat template, a hash of the vocab) and, for regenerated
responses, the backbone. Another tokenizer or model therefore never reuses it. Files are written to a
temporary name and renamed into place, so a reader never sees half a file; the metadata records a digest of
the arrays, checked on load, so a file damaged later at the same size is rebuilt rather than trained on. No
pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from headstart.data.chat import Sample
from headstart.data.config import DataConfig
from headstart.data.selfdistill import regen_key
from headstart.digests import bytes_digest
from headstart.models.backbone import tokenizer_fingerprint

CACHE_VERSION = 1


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def tokenization_key(tokenizer) -> str:
    """What tokenized rows depend on: the tokenizer itself (its one fingerprint, models/backbone.py) and the
    chat template that renders the conversations."""
    return _sha({"tokenizer": tokenizer_fingerprint(tokenizer), "chat_template": tokenizer.chat_template})


def backbone_fingerprint(backbone) -> str:
    """Config + dtype + a few values of every parameter (distinguishes checkpoints that share a config) + its
    tokenizer (the chat template shapes the prompts it regenerates from). Not where the model was loaded from
    (the config's `_name_or_path`): the same weights read from another folder, a moved $HEADSTART_CACHE or a
    Hub id keep their regenerated answers, tokenized splits and hidden-state caches."""
    model = backbone.model
    config = {k: v for k, v in model.config.to_dict().items() if k != "_name_or_path"}
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    h.update(tokenization_key(backbone.tokenizer).encode())
    for name, p in sorted(model.named_parameters()):
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        h.update(p.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def cache_key(cfg: DataConfig, source_fp: str, tokenizer_fp: str, backbone_fp: str | None) -> str:
    regenerated = cfg.responses == "regenerated"
    return _sha(
        {
            "version": CACHE_VERSION,
            "source": source_fp,
            "format": cfg.format,
            "max_length": cfg.max_length,
            "max_rows": cfg.max_rows,
            "eval_rows": cfg.eval_rows,
            "seed": cfg.seed,
            "responses": cfg.responses,
            "regen": regen_key(cfg.regen) if regenerated else None,
            "backbone": backbone_fp if regenerated else None,
            "tokenizer": tokenizer_fp,
            # only when set, so the caches of runs without it keep their names
            **(
                {"backbone_prompts": cfg.backbone_prompts, "prompts": asdict(cfg.prompts)}
                if cfg.backbone_prompts
                else {}
            ),
        }
    )


def pack(samples: list[Sample]) -> dict[str, np.ndarray]:
    """Samples -> flat arrays: sample i is input_ids[offsets[i]:offsets[i + 1]]."""
    lengths = np.array([len(s.input_ids) for s in samples], dtype=np.int64)  # (N,)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (N + 1,)
    cat = (lambda xs: np.concatenate(xs).astype(np.int32)) if samples else (lambda xs: np.zeros(0, np.int32))
    return {
        "input_ids": cat([s.input_ids for s in samples]),  # (sum T,)
        "labels": cat([s.labels for s in samples]),  # (sum T,)
        "offsets": offsets,
        "row_ids": np.array([s.row_id for s in samples], dtype=np.int64),  # (N,)
    }


def save_splits(path: Path, splits: dict[str, dict[str, np.ndarray]], stats: dict) -> None:
    from safetensors.numpy import save_file

    tensors = {f"{split}.{k}": v for split, arrays in splits.items() for k, v in arrays.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    meta = {"stats": json.dumps(stats), "version": str(CACHE_VERSION), "sha256": _arrays_digest(tensors)}
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_splits(path: Path) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    from safetensors import safe_open

    splits: dict[str, dict[str, np.ndarray]] = {}
    with safe_open(str(path), framework="np") as f:
        meta = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    stats = json.loads(meta["stats"])
    if "sha256" in meta and _arrays_digest(tensors) != meta["sha256"]:  # caches from before digests: none
        raise ValueError(
            "its arrays were changed after it was written (sha256 differs from the recorded one)"
        )
    for name, value in tensors.items():
        split, key = name.split(".", 1)
        splits.setdefault(split, {})[key] = value
    return splits, stats


def _arrays_digest(tensors: dict[str, np.ndarray]) -> str:
    return bytes_digest(
        part for name in sorted(tensors) for part in (name.encode(), np.ascontiguousarray(tensors[name]).data)
    )
