"""Self-distillation data: the frozen backbone rewrites the assistant turns it will be trained to draft for.

Drafters trained on the target model's own outputs match its distribution rather than the original authors'
(Medusa-2 "self-distillation", Cai et al. 2024, sec. 2.3.2). Turns are regenerated one at a time, up to
`regen.max_turns` per conversation, each prompted with the conversation so far (earlier turns already
regenerated, later user turns as written); the conversation ends after its last regenerated turn.

Results are appended to a JSON-lines file after every batch and flushed, keyed by a hash of the original
messages, so an interrupted run resumes where it stopped. Each line carries a digest of its own content: a line
cut by a killed run or damaged later (same-size included) is regenerated, with a warning naming the file.

Two engines produce the same records from the same rendered prompts, stop ids and sampling settings
(`regen.engine`): batched HF `generate` here, or vLLM in its own environment (data/regen_vllm.py), ~4x faster
on a 2-core CPU. The file name is keyed by the engine too (bf16 kernels differ, so near-ties flip): an HF cache
is never continued by vLLM or the other way round.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from tqdm.auto import tqdm

from headstart.data.chat import end_of_turn_text, render
from headstart.data.config import RegenConfig
from headstart.data.sources import Row, Skips
from headstart.digests import bytes_digest
from headstart.models.backbone import eos_token_ids, generate_batch

log = logging.getLogger("headstart.data")
RECORD_DIGEST = "sha256"  # each cached record's digest of its own content


def row_key(row: Row) -> str:
    return hashlib.sha256(json.dumps(row.messages, sort_keys=True).encode()).hexdigest()[:24]


def _record_digest(rec: dict) -> str:
    return bytes_digest([json.dumps(rec, ensure_ascii=False, sort_keys=True).encode()])[:16]


def record_line(rec: dict) -> str:
    """`rec` as one JSON line carrying the digest of its content (`load_records` checks it)."""
    return json.dumps({**rec, RECORD_DIGEST: _record_digest(rec)}, ensure_ascii=False) + "\n"


def load_records(path: Path, key: str) -> dict:
    """Records of a JSON-lines cache by `rec[key]`, from an earlier (possibly interrupted) run. A line that is
    not whole (cut by a killed run, or damaged: undecodable, or its digest differs) is left out, so its row is
    generated again, and a warning names the file; lines written before digests were kept are taken as read."""
    done, bad = {}, 0
    for raw in path.read_bytes().splitlines() if path.is_file() else []:
        try:
            rec = json.loads(raw.decode("utf-8"))
            recorded = rec.pop(RECORD_DIGEST, None)
            if recorded is not None and recorded != _record_digest(rec):
                raise ValueError("digest")
            done[rec[key]] = rec
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            bad += raw.strip() != b""
    if bad:
        log.warning(
            "%s: %d records are not whole (cut by a killed run, or damaged); generating them again", path, bad
        )
    return done


def end_partial_line(path: Path) -> None:
    """A run killed mid-write leaves a line without its newline: end it, so the next record starts a line of
    its own (the broken line is ignored on reading and its row regenerated)."""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


def stop_ids(tokenizer, model, eot: str) -> set[int]:
    """EOS ids plus the chat template's end-of-turn marker when it is one token."""
    ids = set(eos_token_ids(tokenizer, model))
    eot_ids = tokenizer(eot.strip(), add_special_tokens=False)["input_ids"] if eot.strip() else []
    if len(eot_ids) == 1:
        ids.add(eot_ids[0])
    return ids


def decode_reply(tokenizer, new_ids: list[int], stop: set[int], eot: str) -> tuple[str, bool]:
    """Reply text without the end-of-turn / EOS, and whether the model ended the turn itself."""
    cut = next((i for i, t in enumerate(new_ids) if t in stop), None)
    text = tokenizer.decode(new_ids[:cut], skip_special_tokens=True)
    finished = cut is not None
    marker = eot.strip()
    if marker and marker in text:  # an end-of-turn spelled as plain tokens
        text, finished = text[: text.index(marker)], True
    return text, finished


def _generate(
    backbone, prompts: list[list[int]], regen: RegenConfig, stop: set[int], seed: int
) -> list[list[int]]:
    """Batched generation with LEFT padding; returns only the new tokens of each prompt."""
    tok = backbone.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return generate_batch(
        backbone.model, prompts, regen.max_new_tokens, regen.temperature, pad, sorted(stop), seed
    )


# (prompts, stop ids, batch seed, one seed per prompt) -> the new token ids of each prompt
Generate = Callable[[list[list[int]], set[int], int, list[int]], list[list[int]]]


def _hf_generate(backbone, regen: RegenConfig) -> Generate:
    return lambda prompts, stop, seed, _row_seeds: _generate(backbone, prompts, regen, stop, seed)


def open_engine(
    stack: contextlib.ExitStack, backbone, regen: RegenConfig, max_length: int
) -> tuple[Generate, int]:
    """The resolved `regen.engine` for prompts under `max_length` tokens, closed with `stack`: (generate,
    prompts per call)."""
    if regen.engine == "vllm":
        from headstart.data.regen_vllm import VllmRegen

        vllm = stack.enter_context(VllmRegen(backbone, regen, max_length))
        return vllm.generate, regen.vllm_chunk
    return _hf_generate(backbone, regen), regen.batch_size


def resolve_engine(regen: RegenConfig, backbone) -> RegenConfig:
    """`auto` -> vllm when its environment is set up and the backbone is loadable by path, else hf."""
    if regen.engine != "auto":
        return regen
    from headstart.vllm_runner import is_set_up, served_model

    use_vllm = backbone is not None and served_model(backbone) is not None and is_set_up()
    return replace(regen, engine="vllm" if use_vllm else "hf")


def regen_key(regen: RegenConfig) -> dict:
    """What the regenerated text depends on: the settings, and the engine when it is not HF (so HF caches
    written before engines existed keep their names). `vllm_chunk` only sets how often results are written."""
    if regen.engine == "auto":
        raise ValueError("regen_key needs a resolved engine: call resolve_engine first")
    key = {k: v for k, v in asdict(regen).items() if k not in ("engine", "vllm_chunk")}
    return key | ({"engine": regen.engine} if regen.engine != "hf" else {})


def _regen_batch(
    backbone, batch: list[Row], regen: RegenConfig, max_length: int, seed: int, generate: Generate
) -> list[dict]:
    """Regenerate up to `regen.max_turns` assistant turns of each row, turn by turn across the batch."""
    tok = backbone.tokenizer
    eot = end_of_turn_text(tok)
    stop = stop_ids(tok, backbone.model, eot)
    convs = [[dict(m) for m in row.messages] for row in batch]
    turns = [[i for i, m in enumerate(c) if m["role"] == "assistant"] for c in convs]
    kept = [0] * len(batch)  # messages kept: up to and including the last regenerated turn
    open_end = [False] * len(batch)
    active = list(range(len(batch)))
    for t in range(regen.max_turns):
        todo, prompts, row_seeds = [], [], []
        for b in active:
            if t >= len(turns[b]):
                continue
            ids = tok(render(tok, convs[b][: turns[b][t]], True), add_special_tokens=False)["input_ids"]
            if len(ids) < max_length:  # a longer prompt leaves no room for a label after truncation
                todo.append(b)
                prompts.append(ids)
                row_seeds.append(seed + batch[b].row_id * 64 + t)  # per row: independent of batching
        if not todo:
            break
        for b, new in zip(todo, generate(prompts, stop, seed + batch[0].row_id + t, row_seeds)):
            text, finished = decode_reply(tok, new, stop, eot)
            convs[b][turns[b][t]]["content"] = text
            kept[b], open_end[b] = turns[b][t] + 1, not finished
        active = [b for b in todo if not open_end[b]]  # a cut reply ends its conversation
    records = []
    for b, row in enumerate(batch):
        rec = {"key": row_key(row), "row_id": row.row_id}
        if kept[b]:
            rec.update(messages=convs[b][: kept[b]], open_end=open_end[b])
        else:
            rec["skip"] = "prompt too long to regenerate (>= max_length tokens)"
        records.append(rec)
    return records


def regen_file(cache_dir: Path, backbone_fp: str, regen: RegenConfig, max_length: int) -> Path:
    key = json.dumps(
        {"backbone": backbone_fp, "regen": regen_key(regen), "max_length": max_length}, sort_keys=True
    )
    return Path(cache_dir) / "regen" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsonl"


def regenerate(
    rows: list[Row],
    backbone,
    regen: RegenConfig,
    max_length: int,
    path: Path,
    skips: Skips,
    seed: int = 0,
    show_progress: bool = True,
) -> tuple[list[Row], dict]:
    """Rows with regenerated assistant turns (same order; rows that could not be regenerated go to `skips`).
    Finished rows are read from / appended to the JSON-lines file `path`. `regen.engine` must be resolved
    (`resolve_engine`)."""
    done, generated = fill(rows, backbone, regen, max_length, path, seed, show_progress)
    return collect(rows, done, generated, skips)


def fill(
    rows: list[Row],
    backbone,
    regen: RegenConfig,
    max_length: int,
    path: Path,
    seed: int = 0,
    show_progress: bool = True,
) -> tuple[dict[str, dict], set[str]]:
    """Generate the rows `path` does not hold yet, with one engine for all of them (several splits in one
    call pay one vLLM start-up), appending each chunk to `path` as it finishes. -> (every finished record by
    row key, the keys generated now)."""
    done = load_records(path, "key")
    todo = [r for r in rows if row_key(r) not in done]
    log.info(
        "regenerating %d of %d conversations (%d cached in %s)",
        len(todo),
        len(rows),
        len(rows) - len(todo),
        path,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    end_partial_line(path)
    with contextlib.ExitStack() as stack:
        generate, chunk = open_engine(stack, backbone, regen, max_length) if todo else (None, 1)
        f = stack.enter_context(open(path, "a", encoding="utf-8"))
        bar = stack.enter_context(
            tqdm(
                total=len(todo), disable=not show_progress, desc=f"regenerating ({regen.engine})", unit="conv"
            )
        )
        for i in range(0, len(todo), chunk):
            batch = todo[i : i + chunk]
            for rec in _regen_batch(backbone, batch, regen, max_length, seed, generate):
                f.write(record_line(rec))
                done[rec["key"]] = rec
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(batch))
    return done, {row_key(r) for r in todo}


def collect(
    rows: list[Row], done: dict[str, dict], generated: set[str], skips: Skips
) -> tuple[list[Row], dict]:
    """`rows` with their regenerated turns from `done` (`fill`'s records), skipped ones counted in `skips`;
    -> (rows, stats: generated now / cached / cut by max_new_tokens)."""
    out, unfinished, new = [], 0, 0
    for row in rows:
        key = row_key(row)
        new += key in generated
        rec = done[key]
        if "skip" in rec:
            skips.add(rec["skip"], f"row {row.row_id}: {row.messages!r}")
            continue
        out.append(Row(row.row_id, rec["messages"], rec["open_end"]))
        unfinished += rec["open_end"]
    stats = {"generated": new, "cached": len(rows) - new, "cut_by_max_new_tokens": unfinished}
    return out, stats
