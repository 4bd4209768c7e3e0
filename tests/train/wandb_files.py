"""Read a W&B run file (`run-<id>.wandb`, offline mode) without a network: the LevelDB-log framing W&B uses
(a 7-byte ':W&B' header, then 32 KiB blocks of records with a 7-byte header: crc32, length, type) around
`wandb_internal_pb2.Record` protobufs. wandb >= 0.2x dropped its Python reader; this is the format it writes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pos, parts = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(parts)
            out.append(rec)
    return out


def summary(run_file: Path) -> dict:
    """What a run recorded: its id, group, job type, config, every history row and artifacts logged."""
    info: dict = {"history": [], "artifacts": [], "config": {}}
    for rec in records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            info.update(id=rec.run.run_id, group=rec.run.run_group, job_type=rec.run.job_type)
            info["config"] |= {i.key: json.loads(i.value_json) for i in rec.run.config.update}
        elif kind == "config":
            info["config"] |= {i.key: json.loads(i.value_json) for i in rec.config.update}
        elif kind == "history":
            key = lambda i: i.key or "/".join(i.nested_key)  # noqa: E731
            info["history"].append({key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "artifact":
            info["artifacts"].append(
                {"name": rec.artifact.name, "type": rec.artifact.type, "aliases": list(rec.artifact.aliases)}
            )
    return info


def run_files(run_dir: Path) -> list[Path]:
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
