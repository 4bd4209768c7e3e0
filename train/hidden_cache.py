"""EAGLE's target features cached offline (`method.hidden_cache=offline`): the frozen backbone runs once over
each tokenized split, before training, and its per-row hidden states are written to safetensors shards

    <cache_dir>/hidden/<key>/shard_XXXXX.safetensors   hidden (sum T, K, H), offsets (n + 1,), row_ids (n,)
    <cache_dir>/hidden/<key>/manifest.json             what the cache was built from, the shard plan, done shards

K = the aux layers eagle_step reads (EAGLE-3: 3; EAGLE-1: none) followed by the final normed hidden state.
The key hashes everything that changes the content (backbone fingerprint incl. tokenizer and dtype, layers,
the split's token ids, the storage dtype), so another backbone or dataset gets another folder. Each shard is
written to a temporary name and renamed into place, then listed in the manifest (rewritten the same way): an
interrupted build resumes at the first shard the manifest does not list. The manifest records each shard's
size and content digest, checked at every start: a shard truncated or damaged later is rebuilt with a warning
naming it (an unreadable manifest: the cache is rebuilt). On load the manifest must agree with
the job and every shard with the dataset (row ids, lengths, K, H, dtype); otherwise a HiddenCacheError names
what differs. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from headstart.atomic import write_json
from headstart.data import TokenizedDataset, collate
from headstart.data.cache import backbone_fingerprint
from headstart.digests import file_digest, mismatch
from headstart.models.backbone import DTYPES

log = logging.getLogger("headstart.train")
VERSION = 1
SHARD_BYTES = 1 << 30  # ~1 GiB of hidden states per shard
BATCH_TOKENS = 8192  # padded tokens per backbone forward while building (inference only: no activations kept)
MANIFEST = "manifest.json"
ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}  # safetensors' names
CHECKED = ("backbone_fingerprint", "dataset_hash", "layers", "dtype", "hidden_size")  # manifest vs job


class HiddenCacheError(ValueError):
    """An offline hidden-state cache that does not belong to this job; the message names what differs."""


def dataset_hash(ds: TokenizedDataset) -> str:
    """The split's content as the backbone sees it: token ids, row boundaries and row ids (labels do not
    change hidden states)."""
    h = hashlib.sha256()
    for a in (ds.input_ids, ds.offsets, ds.row_ids):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def cache_meta(backbone, layers: tuple[int, ...], ds: TokenizedDataset, dtype: str) -> dict:
    meta = {
        "version": VERSION,
        "backbone_fingerprint": backbone_fingerprint(backbone),  # config, tokenizer, weights sample, dtype
        "backbone_dtype": str(backbone.dtype),
        "layers": list(layers),
        "dataset_hash": dataset_hash(ds),
        "dtype": dtype,
        "hidden_size": backbone.hidden_size,
    }
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    return {
        **meta,
        "key": key,
        "rows": len(ds),
        "features": len(layers) + 1,
        "backbone": backbone.fingerprint(),
    }


def shard_plan(lengths: np.ndarray, row_bytes: int, shard_bytes: int) -> list[list[int]]:
    """Consecutive [start, end) row ranges of at most `shard_bytes` each (at least one row per shard)."""
    plan, start, size = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if i > start and size + n * row_bytes > shard_bytes:
            plan.append([start, i])
            start, size = i, 0
        size += n * row_bytes
    if start < len(lengths):
        plan.append([start, len(lengths)])
    return plan


def length_batches(lengths: np.ndarray, batch_tokens: int) -> list[list[int]]:
    """Row indices grouped into forward batches by length (longest first), each padded to at most
    `batch_tokens` tokens (at least one row): rows of similar length share a batch, so little compute goes to
    padding and the matmuls are wide -- the features do not depend on batch composition."""
    order = np.argsort(-lengths, kind="stable").tolist()
    groups, group = [], []
    for j in order:
        if group and (len(group) + 1) * int(lengths[group[0]]) > batch_tokens:
            groups.append(group)
            group = []
        group.append(j)
    return groups + ([group] if group else [])


def _check_meta(folder: Path, saved: dict, meta: dict) -> None:
    for name in CHECKED:
        if saved.get(name) != meta[name]:
            raise HiddenCacheError(
                f"the hidden-state cache {folder} was built for {name}={saved.get(name)!r}, but this job has "
                f"{name}={meta[name]!r} (another backbone, dataset, layers or dtype). Fix: delete {folder}, "
                "or use method.hidden_cache=online"
            )


def _shard_done(folder: Path, name: str, info: dict | None) -> bool:
    """Whether shard `name` is listed and still holds what was written (else it is rebuilt, saying why)."""
    if info is None:
        return False
    path = folder / name
    if not path.is_file():
        problem = "missing"
    elif path.stat().st_size != info["bytes"]:
        problem = f"{path.stat().st_size} bytes, {info['bytes']} were written"
    else:
        problem = mismatch(path, info.get("sha256"))
    if problem is not None:
        log.warning("hidden-state cache shard %s is damaged (%s): rebuilding it", path, problem)
    return problem is None


def _read_manifest(folder: Path) -> dict | None:
    """The folder's manifest; None when there is none, or (with a warning) when it is unreadable."""
    try:
        saved = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning(
            "hidden-state cache manifest %s is unreadable (%s): rebuilding the cache", folder / MANIFEST, e
        )
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("plan"), list):
        log.warning(
            "hidden-state cache manifest %s has no shard plan: rebuilding the cache", folder / MANIFEST
        )
        return None
    return saved


@torch.no_grad()
def build_cache(
    backbone,
    layers: tuple[int, ...],
    ds: TokenizedDataset,
    folder: Path,
    dtype: str,
    batch_tokens: int = BATCH_TOKENS,
    shard_bytes: int = SHARD_BYTES,
    show_progress: bool = True,
) -> dict:
    """Write (or finish) the shards of `ds` under `folder`; -> the completed manifest. `backbone(ids, mask,
    layers=...)` -> (final (B, T, H), [aux (B, T, H)]) as `Backbone.forward`."""
    meta = cache_meta(backbone, layers, ds, dtype)
    row_bytes = meta["features"] * meta["hidden_size"] * DTYPES[dtype].itemsize
    manifest = {
        **meta,
        "plan": shard_plan(ds.lengths, row_bytes, shard_bytes),
        "shards": {},
        "complete": False,
    }
    folder.mkdir(parents=True, exist_ok=True)
    saved = _read_manifest(folder)
    if saved is not None:
        _check_meta(folder, saved, meta)
        manifest["plan"], manifest["shards"] = saved["plan"], saved.get("shards", {})  # resume with its plan
    else:
        # the plan first: a resumed build keeps these shard bounds
        write_json(folder / MANIFEST, manifest, indent=1)
    pad_id = backbone.tokenizer.pad_token_id
    names = [f"shard_{i:05d}.safetensors" for i in range(len(manifest["plan"]))]
    todo = [i for i, n in enumerate(names) if not _shard_done(folder, n, manifest["shards"].get(n))]
    if saved is not None and saved.get("complete"):
        if not todo:
            return saved
        # no longer complete until the damaged shards are rebuilt
        write_json(folder / MANIFEST, manifest, indent=1)
    if todo and todo[0]:
        log.info("hidden cache %s: resuming at shard %d of %d", folder, todo[0], len(names))
    bar = tqdm(
        total=len(ds), disable=not show_progress, desc=f"caching hidden states {folder.name}", unit="row"
    )
    bar.update(
        sum(manifest["plan"][i][1] - manifest["plan"][i][0] for i in range(len(names)) if i not in todo)
    )
    for i in todo:
        start, end = manifest["plan"][i]
        rows: dict[int, torch.Tensor] = {}
        for group in length_batches(ds.lengths[start:end], batch_tokens):
            items = [ds[start + j] for j in group]
            batch = collate(items, pad_id)
            ids = batch["input_ids"].to(backbone.device)  # (B, T)
            final, aux = backbone(ids, batch["attention_mask"].to(backbone.device), layers=layers)
            feats = torch.stack([*aux, final], 2).to(DTYPES[dtype]).cpu()  # (B, T, K, H)
            for b, (j, it) in enumerate(zip(group, items)):
                rows[j] = feats[b, : len(it["input_ids"])]  # (T_j, K, H)
            bar.update(len(items))
        tensors = {
            "hidden": torch.cat([rows[j] for j in range(end - start)]),  # (sum T, K, H), in row order
            "offsets": torch.from_numpy(ds.offsets[start : end + 1] - ds.offsets[start]),  # (n + 1,)
            "row_ids": torch.from_numpy(ds.row_ids[start:end].copy()),  # (n,)
        }
        tmp = folder / f"{names[i]}.tmp{os.getpid()}"
        try:
            save_file(tensors, str(tmp), metadata={"key": meta["key"]})
            os.replace(tmp, folder / names[i])
        finally:
            tmp.unlink(missing_ok=True)
        path = folder / names[i]
        manifest["shards"][names[i]] = {
            "rows": end - start,
            "bytes": path.stat().st_size,
            "sha256": file_digest(path),
        }
        write_json(folder / MANIFEST, manifest, indent=1)  # the shard counts only once it is listed here
    bar.close()
    manifest["complete"] = True
    write_json(folder / MANIFEST, manifest, indent=1)
    return manifest


class CachedHiddenDataset(Dataset):
    """`ds`'s items plus "hidden": (T, K, H) read from the shards (lazily, by slice; nothing is loaded whole).
    Every shard is checked against the dataset when opened."""

    def __init__(self, ds: TokenizedDataset, folder: Path, meta: dict) -> None:
        self.ds, self.folder = ds, Path(folder)
        manifest_file = self.folder / MANIFEST
        if not manifest_file.is_file():
            raise HiddenCacheError(f"hidden-state cache {self.folder} has no {MANIFEST}")
        manifest = json.loads(manifest_file.read_text())
        _check_meta(self.folder, manifest, meta)
        if not manifest.get("complete"):
            raise HiddenCacheError(f"hidden-state cache {self.folder} is incomplete; rerun to finish it")
        self.names = [f"shard_{i:05d}.safetensors" for i in range(len(manifest["plan"]))]
        self.shard = np.zeros(len(ds), dtype=np.int64)  # row -> shard
        self.local = np.zeros(len(ds), dtype=np.int64)  # row -> first token inside its shard
        for i, ((start, end), name) in enumerate(zip(manifest["plan"], self.names, strict=True)):
            self._verify(name, start, end, meta)
            self.shard[start:end] = i
            self.local[start:end] = ds.offsets[start:end] - ds.offsets[start]
        covered = manifest["plan"][-1][1] if manifest["plan"] else 0
        if covered != len(ds):
            raise HiddenCacheError(f"hidden-state cache {self.folder} covers {covered} rows, not {len(ds)}")
        self.bytes = sum((self.folder / n).stat().st_size for n in self.names)
        self._handles: dict[int, object] = {}

    def _verify(self, name: str, start: int, end: int, meta: dict) -> None:
        path = self.folder / name
        if not path.is_file():
            raise HiddenCacheError(f"hidden-state cache shard {path} is missing. Fix: delete {self.folder}")
        with safe_open(str(path), framework="pt") as f:
            shape = tuple(f.get_slice("hidden").get_shape())
            dtype = f.get_slice("hidden").get_dtype()
            offsets, row_ids = f.get_tensor("offsets").numpy(), f.get_tensor("row_ids").numpy()
        want_offsets = self.ds.offsets[start : end + 1] - self.ds.offsets[start]
        want = (int(want_offsets[-1]), meta["features"], meta["hidden_size"])
        if (
            shape != want
            or not np.array_equal(offsets, want_offsets)
            or not np.array_equal(row_ids, self.ds.row_ids[start:end])
        ):
            raise HiddenCacheError(
                f"hidden-state cache shard {path} does not match the dataset rows {start}..{end}: hidden "
                f"{shape} (expected {want}), {len(row_ids)} rows (expected {end - start}) or other row ids / "
                f"lengths. Fix: delete {self.folder}"
            )
        if dtype != ST_DTYPES[meta["dtype"]]:
            raise HiddenCacheError(f"hidden-state cache shard {path} holds {dtype}, not {meta['dtype']}")

    def __len__(self) -> int:
        return len(self.ds)

    def __getstate__(self) -> dict:  # DataLoader workers reopen the shards themselves
        return {**self.__dict__, "_handles": {}}

    def __getitem__(self, i: int) -> dict:
        item = self.ds[i]
        i = i % len(self)
        s = int(self.shard[i])
        if s not in self._handles:
            self._handles[s] = safe_open(str(self.folder / self.names[s]), framework="pt")
        a = int(self.local[i])
        item["hidden"] = self._handles[s].get_slice("hidden")[a : a + len(item["input_ids"])]  # (T, K, H)
        return item


def collate_hidden(items: list[dict], pad_id: int) -> dict:
    """`collate` plus "hidden" (B, T, K, H), zero on padding."""
    batch = collate(items, pad_id)
    b, t = batch["input_ids"].shape
    hidden = items[0]["hidden"].new_zeros((b, t, *items[0]["hidden"].shape[1:]))  # (B, T, K, H)
    for j, it in enumerate(items):
        hidden[j, : len(it["hidden"])] = it["hidden"]
    batch["hidden"] = hidden
    return batch


def offline_datasets(
    backbone,
    layers: tuple[int, ...],
    splits: dict[str, TokenizedDataset],
    root: Path,
    dtype: str,
    batch_tokens: int = BATCH_TOKENS,
    show_progress: bool = True,
) -> tuple[dict[str, CachedHiddenDataset], dict]:
    """Build or reuse the cache of every split under root/<key>; -> the wrapped splits and stats (folder,
    shards, bytes, GB, reused) for the run's data_stats."""
    out, stats = {}, {}
    for split, ds in splits.items():
        meta = cache_meta(backbone, layers, ds, dtype)
        folder = Path(root) / meta["key"]
        reused = bool((_read_manifest(folder) or {}).get("complete", False))
        build_cache(backbone, layers, ds, folder, dtype, batch_tokens, show_progress=show_progress)
        out[split] = CachedHiddenDataset(ds, folder, meta)
        size = out[split].bytes
        stats[split] = {
            "folder": str(folder),
            "shards": len(out[split].names),
            "bytes": size,
            "gb": round(size / 1e9, 3),
            "reused": bool(reused),
        }
        log.info(
            "hidden cache %s: %d rows, %d shards, %d bytes (%.3f GB) in %s (%s)",
            split,
            len(ds),
            len(out[split].names),
            size,
            size / 1e9,
            folder,
            "reused" if reused else "built",
        )
    return out, stats
