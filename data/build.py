"""`build_datasets`: source rows -> seeded split -> (optional) self-distillation -> labeled tokens -> cache.

The eval rows are the first `eval_rows` of a seeded shuffle of all usable rows and the training rows the next
`max_rows`, so the held-out set does not move when `max_rows` changes and never overlaps training.
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import replace
from pathlib import Path

from safetensors import SafetensorError
from tqdm.auto import tqdm

from headstart.data.cache import (
    backbone_fingerprint,
    cache_key,
    load_splits,
    pack,
    save_splits,
    tokenization_key,
)
from headstart.data.chat import IGNORE, Sample, tokenize_rows
from headstart.data.config import DataConfig, DataError
from headstart.data.dataset import TokenizedDataset
from headstart.data.selfdistill import regen_file, regenerate, resolve_engine
from headstart.data.sources import Row, Skips, read_rows, source_fingerprint, source_path

log = logging.getLogger("headstart.data")
TOKENIZE_CHUNK = 512  # rows per progress-bar step


def select_rows(rows: list[Row], cfg: DataConfig) -> tuple[list[Row], list[Row]]:
    """(eval, train): a seeded shuffle; eval first, then up to `max_rows` training rows."""
    order = list(rows)
    random.Random(cfg.seed).shuffle(order)
    if len(order) <= cfg.eval_rows:
        raise DataError(
            f"data: only {len(order)} usable conversations, and data.eval_rows={cfg.eval_rows} leaves none for "
            "training. Fix: lower data.eval_rows or use a larger source"
        )
    rest = order[cfg.eval_rows :]
    return order[: cfg.eval_rows], rest[: cfg.max_rows] if cfg.max_rows else rest


def _tokenize(
    tokenizer, rows: list[Row], cfg: DataConfig, skips: Skips, desc: str, show: bool
) -> list[Sample]:
    samples = []
    with tqdm(total=len(rows), disable=not show, desc=f"tokenizing {desc}", unit="conv") as bar:
        for i in range(0, len(rows), TOKENIZE_CHUNK):
            chunk = rows[i : i + TOKENIZE_CHUNK]
            samples += tokenize_rows(tokenizer, chunk, cfg.max_length, skips)
            bar.update(len(chunk))
    return samples


def _split_stats(rows: list[Row], samples: list[Sample], skips: Skips) -> dict:
    tokens = sum(len(s.input_ids) for s in samples)
    labeled = sum(int((s.labels != IGNORE).sum()) for s in samples)
    return {
        "rows": len(rows),
        "samples": len(samples),
        "truncated": sum(s.truncated for s in samples),
        "tokens": tokens,
        "labeled_tokens": labeled,
        "labeled_fraction": labeled / max(tokens, 1),
        "skipped": dict(skips.counts),
        "skipped_examples": dict(skips.examples),
    }


def _load_cached(path: Path) -> tuple[TokenizedDataset, TokenizedDataset, dict] | None:
    if not path.is_file():
        return None
    try:
        splits, stats = load_splits(path)
        train, evals = TokenizedDataset(splits["train"]), TokenizedDataset(splits["eval"])
    except (OSError, KeyError, ValueError, SafetensorError) as e:
        log.warning("data cache %s is unreadable (%s); rebuilding it", path, e)
        return None
    log.info("data: loaded %d train / %d eval samples from cache %s", len(train), len(evals), path)
    return train, evals, {**stats, "cache_hit": True, "cache_file": str(path)}


def build_datasets(
    cfg: DataConfig, tokenizer, cache_dir: Path, backbone=None, show_progress: bool = True
) -> tuple[TokenizedDataset, TokenizedDataset, dict]:
    """Returns (train, eval, stats). Items are {"input_ids": (T,), "labels": (T,) (-100 off-assistant),
    "row_id": int}. `backbone` (a headstart Backbone) is needed only for responses=regenerated."""
    regenerated = cfg.responses == "regenerated"
    if regenerated and backbone is None:
        raise DataError(
            "data.responses='regenerated' needs the backbone. Fix: pass backbone= to build_datasets"
        )
    cache_dir = Path(cache_dir)
    backbone_fp = backbone_fingerprint(backbone) if regenerated else None
    if regenerated:  # auto -> hf | vllm once, before anything is keyed by it
        cfg = replace(cfg, regen=resolve_engine(cfg.regen, backbone))
    with source_path(cfg.source) as path:
        key = cache_key(cfg, source_fingerprint(path), tokenization_key(tokenizer), backbone_fp)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", cfg.name)
        cache_file = cache_dir / "tokenized" / f"{name}-{key}.safetensors"
        cached = _load_cached(cache_file)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        rows, stats = read_rows(path, cfg.format)
        stats["read_seconds"] = round(time.perf_counter() - t0, 3)
    eval_rows, train_rows = select_rows(rows, cfg)
    del rows
    splits, skipped = {}, dict(stats["skipped"])
    examples = dict(stats["skipped_examples"])
    for split, part in (("eval", eval_rows), ("train", train_rows)):
        skips = Skips()
        selected = part
        if regenerated:
            file = regen_file(cache_dir, backbone_fp, cfg.regen, cfg.max_length)
            part, stats[f"{split}_regen"] = regenerate(
                part, backbone, cfg.regen, cfg.max_length, file, skips, cfg.seed, show_progress
            )
        t0 = time.perf_counter()
        samples = _tokenize(tokenizer, part, cfg, skips, split, show_progress)
        stats[split] = _split_stats(selected, samples, skips)
        stats[split]["tokenize_seconds"] = round(time.perf_counter() - t0, 3)
        skips.log(f"data ({split})")
        for reason, n in skips.counts.items():
            skipped[reason] = skipped.get(reason, 0) + n
            examples.setdefault(reason, skips.examples[reason])
        splits[split] = pack(samples)
    stats.update(skipped=skipped, skipped_examples=examples)
    if not stats["train"]["samples"]:
        raise DataError(
            f"data: no training sample left from {stats['source']} (skipped: {skipped}). Fix: raise "
            "data.max_length, or use conversations whose first assistant reply starts within it"
        )
    save_splits(cache_file, splits, stats)
    for split in ("train", "eval"):
        s = stats[split]
        log.info(
            "data %s: %d samples from %d rows, %d tokens, %.1f%% labeled, %d truncated",
            split,
            s["samples"],
            s["rows"],
            s["tokens"],
            100 * s["labeled_fraction"],
            s["truncated"],
        )
    datasets = TokenizedDataset(splits["train"]), TokenizedDataset(splits["eval"])
    return *datasets, {**stats, "cache_hit": False, "cache_file": str(cache_file)}
