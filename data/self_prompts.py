"""User prompts written by the backbone itself (`data.source=backbone`): Magpie (Xu et al. 2024, "Magpie:
Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing").

An instruction-tuned model given its chat template only up to where a user's words would start writes a user
turn: a sample of the requests it was aligned on. Those prompts, answered by the same model
(`responses=regenerated`), need no data set at all, and they are closer to what a chat server is asked than
ShareGPT's pasted documents and multi-part threads. Prompt i is sampled with its own seed (`seed * 1_000_003 +
i`; vLLM seeds each request, HF generate each chunk), so with vLLM the set does not depend on batching, and a
killed run resumes: every finished chunk is appended to a JSON-lines file keyed by the backbone, the settings
and the engine. A prompt is kept when the model ended its
turn by itself within `max_new_tokens`, it has at least `min_chars` characters and no earlier prompt is
identical; sampling continues until `eval_rows + max_rows` are kept. For the main job's Medusa heads on
SmolLM2 they measured level with ShareGPT's prompts in vLLM (README, "What each lever bought").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import asdict, replace
from pathlib import Path

from tqdm.auto import tqdm

from headstart.data.chat import end_of_turn_text, render
from headstart.data.config import DataConfig, DataError
from headstart.data.selfdistill import (
    decode_reply,
    end_partial_line,
    load_records,
    open_engine,
    record_line,
    regen_key,
    stop_ids,
)
from headstart.data.sources import Row

log = logging.getLogger("headstart.data")
_MARK = "\x00"  # user content that no template rewrites: where the user's words would start
MAX_DRAWS = 4  # samples per prompt asked for at most, before giving up with a DataError


def user_prefix(tokenizer) -> list[int]:
    """The chat template rendered for one user turn, cut where the user's text starts (the default system
    prompt, if the template injects one, included)."""
    text = render(tokenizer, [{"role": "user", "content": _MARK}])
    if _MARK not in text:
        raise DataError(
            "data.source=backbone: the chat template does not render the user's text as given, so there is no "
            "place to let the model write it. Fix: use a data set (data.source=...) for this backbone"
        )
    return tokenizer(text[: text.index(_MARK)], add_special_tokens=False)["input_ids"]


def prompts_file(cache_dir: Path, backbone_fp: str, cfg: DataConfig) -> Path:
    """Where the prompts of this backbone, settings, seed and engine are kept (cfg.regen resolved)."""
    key = {"backbone": backbone_fp, "prompts": asdict(cfg.prompts), "seed": cfg.seed}
    key["engine"] = regen_key(cfg.regen).get("engine", "hf")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "prompts" / f"{digest}.jsonl"


def _kept(done: dict[int, dict], min_chars: int) -> tuple[list[Row], dict]:
    """Rows from the sampled prompts in index order, and why the others were dropped."""
    rows, seen = [], set()
    stats = {"sampled": len(done), "usable": 0, "cut_by_max_new_tokens": 0, "too_short": 0, "duplicate": 0}
    for i in sorted(done):
        rec = done[i]
        text = rec["text"].strip()
        if not rec["finished"]:
            stats["cut_by_max_new_tokens"] += 1
        elif len(text) < min_chars:
            stats["too_short"] += 1
        elif text in seen:
            stats["duplicate"] += 1
        else:
            seen.add(text)
            messages = [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
            rows.append(Row(i, messages))
    stats["usable"] = len(rows)
    return rows, stats


def backbone_rows(
    cfg: DataConfig, backbone, path: Path, show_progress: bool = True
) -> tuple[list[Row], dict]:
    """`eval_rows + max_rows` prompts written by the backbone, each as a user turn and an empty assistant turn
    (for `responses=regenerated` to answer), and read stats. `cfg.regen.engine` must be resolved."""
    need = cfg.eval_rows + cfg.max_rows
    tok = backbone.tokenizer
    eot = end_of_turn_text(tok)
    stop = stop_ids(tok, backbone.model, eot)
    prefix = user_prefix(tok)
    sampling = replace(
        cfg.regen, temperature=cfg.prompts.temperature, max_new_tokens=cfg.prompts.max_new_tokens
    )
    done = {int(i): rec for i, rec in load_records(path, "i").items()}
    rows, stats = _kept(done, cfg.prompts.min_chars)
    with contextlib.ExitStack() as stack:
        if len(rows) < need:
            path.parent.mkdir(parents=True, exist_ok=True)
            end_partial_line(path)  # a run killed mid-write: its last prompt is sampled again
            log.info("data.source=backbone: sampling user prompts (%d usable, %d needed)", len(rows), need)
            generate, chunk = open_engine(stack, backbone, sampling, len(prefix))
            f = stack.enter_context(open(path, "a", encoding="utf-8"))
            bar = stack.enter_context(
                tqdm(total=need, initial=len(rows), disable=not show_progress, desc="prompts", unit="prompt")
            )
        while len(rows) < need:  # one chunk at a time, from the first index not sampled yet
            start = max(done, default=-1) + 1
            if start >= MAX_DRAWS * need:
                raise DataError(
                    f"data.source=backbone: {start} prompts sampled and only {len(rows)} of the {need} needed are "
                    f"usable ({stats}). Fix: raise data.prompts.max_new_tokens, lower data.prompts.min_chars, or "
                    "lower data.max_rows"
                )
            ids = list(range(start, start + chunk))
            seeds = [cfg.seed * 1_000_003 + i for i in ids]
            for i, new in zip(ids, generate([prefix] * len(ids), stop, seeds[0], seeds)):
                text, finished = decode_reply(tok, new, stop, eot)
                done[i] = {"i": i, "text": text, "finished": finished}
                f.write(record_line(done[i]))
            f.flush()
            os.fsync(f.fileno())
            before = len(rows)
            rows, stats = _kept(done, cfg.prompts.min_chars)
            bar.update(min(len(rows), need) - before)
    return rows[:need], stats | {"used": need}
