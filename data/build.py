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

import numpy as np
from safetensors import SafetensorError

from headstart.data.cache import (
    backbone_fingerprint,
    cache_key,
    load_splits,
    pack,
    save_splits,
    tokenization_key,
)
from headstart.data.chat import IGNORE, Sample, tokenize_rows
from headstart.data.config import BACKBONE_PROMPTS, DataConfig, DataError
from headstart.data.dataset import TokenizedDataset
from headstart.data.loading import open_source
from headstart.data.self_prompts import backbone_rows, prompts_file
from headstart.data.selfdistill import collect, fill, regen_file, resolve_engine
from headstart.data.sources import Row, Skips, read_rows
from headstart.logs import FILE_ONLY

log = logging.getLogger("headstart.data")
TOKENIZE_BATCH = 64  # rows per .map batch (one batched tokenizer call)


def select_rows(rows: list[Row], cfg: DataConfig) -> tuple[list[Row], list[Row]]:
    """(eval, train): a seeded shuffle; eval first, then up to `max_rows` training rows. Prompts the backbone
    wrote are independent samples already, kept in the order they were written: a larger `max_rows` samples
    on after them, so every run's rows (held-out ones too) are a prefix of a larger run's."""
    order = list(rows)
    if cfg.source != BACKBONE_PROMPTS:
        random.Random(cfg.seed).shuffle(order)
    if len(order) <= cfg.eval_rows:
        raise DataError(
            f"data: only {len(order)} usable conversations, and data.eval_rows={cfg.eval_rows} leaves none for "
            "training. Fix: lower data.eval_rows or use a larger source"
        )
    rest = order[cfg.eval_rows :]
    return order[: cfg.eval_rows], rest[: cfg.max_rows] if cfg.max_rows else rest


def added_prompts(
    cfg: DataConfig, backbone, cache_dir: Path, backbone_fp: str, show_progress: bool
) -> tuple[list[Row], dict]:
    """`data.backbone_prompts` prompts the backbone writes (the same file and order as source=backbone with
    those settings), numbered -1, -2, ... so their row ids never meet the source's record indices."""
    own = replace(cfg, source=BACKBONE_PROMPTS, eval_rows=0, max_rows=cfg.backbone_prompts, streaming=False,
                  backbone_prompts=0)  # fmt: skip
    rows, stats = backbone_rows(own, backbone, prompts_file(cache_dir, backbone_fp, own), show_progress)
    return [Row(-1 - r.row_id, r.messages, r.open_end) for r in rows], stats


def _tokenize(
    tokenizer, rows: list[Row], cfg: DataConfig, skips: Skips, desc: str, show: bool
) -> list[Sample]:
    """`tokenize_rows` over `datasets.Dataset.map` (batched, `data.num_proc` processes); skipped rows come back
    as one record per reason, merged into `skips`."""
    import datasets

    if not rows:
        return []
    ds = datasets.Dataset.from_dict(
        {
            "row_id": [r.row_id for r in rows],
            "messages": [r.messages for r in rows],
            "open_end": [r.open_end for r in rows],
        }
    )
    was_enabled = datasets.is_progress_bar_enabled()
    if not show:
        datasets.disable_progress_bars()
    try:
        out = ds.map(
            _tokenize_batch,
            batched=True,
            batch_size=TOKENIZE_BATCH,
            num_proc=cfg.num_proc if cfg.num_proc > 1 and len(rows) > TOKENIZE_BATCH else None,
            remove_columns=ds.column_names,
            features=_out_features(),
            fn_kwargs={"tokenizer": tokenizer, "max_length": cfg.max_length},
            desc=f"tokenizing {desc}",
        ).with_format("numpy")
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
    samples = []
    for rec in out:
        if rec["skip"]:
            for _ in range(int(rec["skip_n"])):
                skips.add(str(rec["skip"]), str(rec["skip_example"]))
            continue
        ids, labels = (np.asarray(rec[k], dtype=np.int32) for k in ("input_ids", "labels"))
        samples.append(Sample(int(rec["row_id"]), ids, labels, bool(rec["truncated"])))
    return samples


def _tokenize_batch(batch: dict, tokenizer, max_length: int) -> dict:
    rows = [Row(*r) for r in zip(batch["row_id"], batch["messages"], batch["open_end"])]
    skips = Skips()
    samples = tokenize_rows(tokenizer, rows, max_length, skips)
    out: dict[str, list] = {k: [] for k in OUT_COLUMNS}
    for s in samples:
        for k, v in zip(OUT_COLUMNS, (s.row_id, s.input_ids, s.labels, s.truncated, "", 0, "")):
            out[k].append(v)
    none = np.zeros(0, dtype=np.int32)
    for reason, n in skips.counts.items():
        for k, v in zip(OUT_COLUMNS, (-1, none, none, False, reason, n, skips.examples[reason])):
            out[k].append(v)
    return out


OUT_COLUMNS = ("row_id", "input_ids", "labels", "truncated", "skip", "skip_n", "skip_example")


def _out_features():
    from datasets import Features, List, Value

    ids = List(Value("int32"))
    types = (Value("int64"), ids, ids, Value("bool"), Value("string"), Value("int64"), Value("string"))
    return Features(dict(zip(OUT_COLUMNS, types)))


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
    log.info(
        "data: loaded %d train / %d eval samples from cache %s", len(train), len(evals), path, extra=FILE_ONLY
    )
    return train, evals, {**stats, "cache_hit": True, "cache_file": str(path)}


def _cache_file(cache_dir: Path, cfg: DataConfig, source_fp: str, tokenizer, backbone_fp: str | None) -> Path:
    key = cache_key(cfg, source_fp, tokenization_key(tokenizer), backbone_fp)
    return cache_dir / "tokenized" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', cfg.name)}-{key}.safetensors"


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
    t0 = time.perf_counter()
    if cfg.source == BACKBONE_PROMPTS:  # prompts the backbone writes (keyed by their own file)
        prompts = prompts_file(cache_dir, backbone_fp, cfg)
        cache_file = _cache_file(cache_dir, cfg, prompts.stem, tokenizer, backbone_fp)
        cached = _load_cached(cache_file)
        if cached is not None:
            return cached
        rows, prompt_stats = backbone_rows(cfg, backbone, prompts, show_progress)
        stats = {"source": BACKBONE_PROMPTS, "source_kind": "backbone", "prompts": prompt_stats}
        stats.update(usable_rows=len(rows), skipped={}, skipped_examples={})
    else:
        with open_source(cfg) as src:
            cache_file = _cache_file(cache_dir, cfg, src.fingerprint, tokenizer, backbone_fp)
            cached = _load_cached(cache_file)
            if cached is not None:
                return cached
            limit = cfg.eval_rows + cfg.max_rows if cfg.streaming else None
            rows, stats = read_rows(src, cfg.format, cfg, hf_cache=cache_dir / "hf", limit=limit)
    stats["read_seconds"] = round(time.perf_counter() - t0, 3)
    eval_rows, train_rows = select_rows(rows, cfg)
    del rows
    if cfg.backbone_prompts:  # prompts the backbone writes, added to the training rows only
        extra, stats["backbone_prompts"] = added_prompts(cfg, backbone, cache_dir, backbone_fp, show_progress)
        train_rows += extra
    splits, skipped = {}, dict(stats["skipped"])
    examples = dict(stats["skipped_examples"])
    if regenerated:  # both splits through one engine: one vLLM start-up (~1.5 min on a CPU), not two
        file = regen_file(cache_dir, backbone_fp, cfg.regen, cfg.max_length)
        done, generated = fill(
            eval_rows + train_rows, backbone, cfg.regen, cfg.max_length, file, cfg.seed, show_progress
        )
    for split, part in (("eval", eval_rows), ("train", train_rows)):
        skips = Skips()
        selected = part
        if regenerated:
            part, stats[f"{split}_regen"] = collect(part, done, generated, skips)
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
            extra=FILE_ONLY,
        )
    datasets = TokenizedDataset(splits["train"]), TokenizedDataset(splits["eval"])
    return *datasets, {**stats, "cache_hit": False, "cache_file": str(cache_file)}
