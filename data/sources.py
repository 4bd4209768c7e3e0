"""Conversations in a common form: `Row(row_id, messages=[{"role", "content"}, ...])`, from the records that
`data/loading.py` reads. Records are ShareGPT form (`{"conversations": [{"from", "value"}]}`), OpenAI form
(`{"messages": [{"role", "content"}]}`) or trl's prompt-completion form (`{"prompt", "completion"}`, strings or
message lists), detected per source. Rows that cannot be used are skipped and counted per reason (`Skips`),
with one example each, so a bad file is diagnosable from the log alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from headstart.data.config import DataConfig, DataError
from headstart.data.jsonio import Malformed, ReadTally
from headstart.data.loading import ROW_INDEX, Source, local_source, not_utf8, records

log = logging.getLogger("headstart.data")

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}
KEYS = {"sharegpt": ("conversations", "from", "value"), "openai": ("messages", "role", "content")}


@dataclass
class Row:
    """One usable conversation. `row_id` is the record's index in its source (stable across configs)."""

    row_id: int
    messages: list[dict[str, str]]
    open_end: bool = False  # last assistant turn was cut by max_new_tokens: do not label an end-of-turn


@dataclass
class Skips:
    """Rows skipped, counted per reason, with the first example of each."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, example: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.examples.setdefault(reason, example[:300])

    def log(self, where: str) -> None:
        for reason, n in self.counts.items():
            log.warning("%s: skipped %d rows: %s (e.g. %s)", where, n, reason, self.examples[reason])

    def summary(self) -> str:
        return ", ".join(f"{reason}: {n}" for reason, n in self.counts.items()) or "none"


class _Skip(Exception):
    """Internal: a record is unusable for `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def normalize(record: object, fmt: str) -> list[dict[str, str]]:
    """One record -> [{"role": system|user|assistant, "content": str}], or raise `_Skip(reason)`.

    Leading assistant turns (after an optional system turn) are dropped: nothing prompted them, and templates
    that inject a default system prompt render an empty prefix inconsistently. Turns after the last assistant
    turn are dropped too: they would carry no label.
    """
    if fmt == "prompt_completion":
        record = _prompt_completion(record)
        fmt = "openai"
    conv_key, role_key, text_key = KEYS[fmt]
    if not isinstance(record, dict) or not isinstance(record.get(conv_key), list):
        raise _Skip(f"missing keys (no {conv_key!r} list)")
    messages = []
    for turn in record[conv_key]:
        if not isinstance(turn, dict) or turn.get(role_key) is None or turn.get(text_key) is None:
            raise _Skip(f"missing keys (a turn without {role_key!r} and {text_key!r})")
        role = ROLES.get(str(turn[role_key]).lower())
        if role is None:
            raise _Skip("unknown role")
        if not isinstance(turn[text_key], str):
            raise _Skip("non-string content")
        messages.append({"role": role, "content": turn[text_key]})
    if not messages:
        raise _Skip("empty conversation")
    first = 1 if messages[0]["role"] == "system" else 0
    while first < len(messages) and messages[first]["role"] == "assistant":
        del messages[first]
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise _Skip("no assistant turn")
    return messages[: last + 1]


def _prompt_completion(record: object) -> object:
    """trl's prompt-completion record -> OpenAI form: strings become one user and one assistant turn; lists
    (trl's conversational prompt-completion) are message lists and are concatenated."""
    if not isinstance(record, dict) or record.get("prompt") is None or record.get("completion") is None:
        raise _Skip("missing keys (no 'prompt' and 'completion')")
    prompt, completion = record["prompt"], record["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    elif isinstance(prompt, list) and isinstance(completion, list):
        turns = [*prompt, *completion]
    else:
        raise _Skip("non-string content")
    return {"messages": turns}


def detect_format(record: object) -> str | None:
    if isinstance(record, dict) and record.get("prompt") is not None and record.get("completion") is not None:
        return "prompt_completion"
    if isinstance(record, dict):
        for fmt, (conv_key, _, _) in KEYS.items():
            if record.get(conv_key) is not None:  # Arrow fills a missing column with None
                return fmt
    return None


def read_rows(
    source: Source | Path,
    fmt: str = "auto",
    cfg: DataConfig | None = None,
    hf_cache: Path | None = None,
    limit: int | None = None,
) -> tuple[list[Row], dict]:
    """Usable rows of a source in its order (streaming: after a seeded shuffle buffer, stopping at `limit`
    usable rows) and stats: records read, skips per reason, partial records dropped."""
    if isinstance(source, Path):
        source = local_source(str(source), source)
    cfg = cfg or DataConfig(source=source.spec, format=fmt)
    tally, skips, rows = ReadTally(), Skips(), []
    detected = None if fmt == "auto" else fmt
    n = 0
    try:
        stream = records(source, cfg, tally, hf_cache)
        if cfg.streaming and hasattr(
            stream, "shuffle"
        ):  # number the records first: row ids stay source indices
            stream = stream.map(lambda _, i: {ROW_INDEX: i}, with_indices=True)
            stream = stream.shuffle(seed=cfg.seed, buffer_size=cfg.shuffle_buffer)
        for n, record in enumerate(stream, start=1):
            row_id = record.pop(ROW_INDEX, n - 1) if isinstance(record, dict) else n - 1
            if isinstance(record, Malformed):
                skips.add("malformed JSON line", f"line {record.line_no}: {record.error}: {record.text!r}")
                continue
            detected = detected or detect_format(record)
            try:
                messages = normalize(record, detected or "sharegpt")
            except _Skip as s:
                skips.add(
                    s.reason, f"record {n - 1}: {json.dumps(record, ensure_ascii=False, default=str)[:200]}"
                )
                continue
            rows.append(Row(row_id, messages))
            if limit is not None and len(rows) >= limit:
                break
    except DataError:
        raise
    except UnicodeDecodeError as e:
        raise not_utf8(source.spec, e) from e
    except (OSError, ValueError) as e:
        raise DataError(
            f"data.source: cannot read {source.spec} ({e}). Fix: check the file is JSON/JSONL/Parquet/CSV, "
            "UTF-8"
        ) from e
    where = source.spec
    if tally.partial_records_dropped:
        log.warning(
            "%s: recovered %d complete records; dropped %d partial record(s) at char %s (%s)",
            where,
            n,
            tally.partial_records_dropped,
            tally.stopped_at_char,
            tally.stop_error,
        )
    skips.log(where)
    stats = {
        "source": str(source.path or source.spec),
        "source_kind": source.kind,
        "split": cfg.split,
        "format": detected or fmt,
        "records_read": n,
        "partial_records_dropped": tally.partial_records_dropped,
        "usable_rows": len(rows),
        "skipped": dict(skips.counts),
        "skipped_examples": dict(skips.examples),
    }
    if not rows:
        raise DataError(
            f"data.source: {where} has no usable conversation ({n} records read; skipped: {skips.summary()}). "
            "Fix: give ShareGPT ({'conversations': [{'from', 'value'}]}) or OpenAI ({'messages': [{'role', "
            "'content'}]}) records with at least one user and one assistant turn, or set data.format"
        )
    return rows, stats
