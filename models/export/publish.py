"""Where an export may write, and how it lands there.

An export never writes into a run's own state (its checkpoints, its drafter, its eval reports, its config, or a
drafter folder anywhere): `--out runs/x/drafter` used to replace the trained drafter with the export. And each
layout folder is written whole into a temporary sibling (`<out>.tmp<pid>`, which the checkpoint finders treat
as half-written) and renamed into place, as checkpoints are: a run killed mid-export leaves the previous
export or none, never new weights beside an old config and card.

Because publishing replaces a folder whole, a folder that exists is replaced only when it is empty or an
earlier export (flat, with a model card and a config); anything else is refused rather than deleted.

Each published folder carries `SHA256SUMS` (coreutils' format: `sha256sum -c SHA256SUMS` inside the folder
checks it without headstart). headstart checks it where it reads an export back: before pushing it (a damaged
folder is refused, naming the file) and before replacing an earlier export (a damaged one is named in a
warning). Engines ignore the extra file.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from headstart.digests import file_digest
from headstart.models.checkpoint import CONFIG_NAME, DRAFTER_DIR, FINAL_EVAL, checkpoint_meta

log = logging.getLogger("headstart.export")
SUMS = "SHA256SUMS"
_SERIAL = itertools.count()
CHECKPOINT_STATE = "trainer_state.json"  # train/checkpoints.py's STATE_NAME (models/ never imports train/)
# the parts of a run folder that are its own state; `export` (the default --out) is not one of them
RUN_STATE = ("checkpoints", DRAFTER_DIR, "eval", CONFIG_NAME, FINAL_EVAL)


def _is_run_dir(path: Path) -> bool:
    return (path / "checkpoints").is_dir() or (path / DRAFTER_DIR / CONFIG_NAME).is_file()


def run_state_owner(out: Path) -> str | None:
    """What run state `out` is or lies inside (a description naming the folder), or None."""
    out = Path(os.path.abspath(out))
    for p in (out, *out.parents):
        if checkpoint_meta(p) is not None:
            return f"the drafter folder {p}"
        if (p / CHECKPOINT_STATE).is_file():
            return f"the checkpoint {p}"
    if _is_run_dir(out):
        return f"the run folder {out}"
    for p in out.parents:
        if _is_run_dir(p) and out.relative_to(p).parts[0] in RUN_STATE:
            return f"{p / out.relative_to(p).parts[0]} of the run {p}"
    return None


def _looks_like_export(path: Path) -> bool:
    entries = list(path.iterdir())
    if not entries:
        return True
    if all(e.is_dir() for e in entries):  # a parent of several layouts
        return all(_looks_like_export(e) for e in entries)
    names = {e.name for e in entries}
    return all(e.is_file() for e in entries) and {"README.md", CONFIG_NAME} <= names


def check_out(out: Path) -> None:
    """Refuse `out` inside a run's state (before any work)."""
    if (owner := run_state_owner(out)) is not None:
        raise ValueError(
            f"--out {out} is {owner}: an export there would replace what the run (or eval and export) reads. "
            "Fix: --out a folder of its own, e.g. <run>/export (the default)"
        )
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not a folder. Fix: --out a new folder")


def check_targets(out: Path, targets: list[Path]) -> None:
    """Refuse any existing target folder that is not an earlier export (publishing replaces it whole)."""
    for target in targets:
        if target.is_dir() and not _looks_like_export(target):
            shown = ", ".join(sorted(e.name for e in target.iterdir())[:4])
            raise ValueError(
                f"--out {out}: {target} exists and is not an earlier export (it holds {shown}); an export "
                "replaces its folder whole. Fix: --out a new or empty folder"
            )


@contextmanager
def staged(out: Path):
    """Yields a temporary sibling of `out` to export into; `publish` then moves its folders into place."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out} cannot be created ({e.strerror}). Fix: a writable --out folder") from e
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {out.parent} is not writable. Fix: a writable --out folder")
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}{next(_SERIAL)}")  # unique: exports may run at once
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(tmp)) from e  # a failed write() names no file: name the folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, out: Path, folders: list[Path]) -> list[Path]:
    """Move each folder written under `tmp` to the same place under `out`, replacing an earlier one whole
    (one rename each: readers see the old layout or the new one). Returns the published folders."""
    dests = [out / folder.relative_to(tmp) for folder in folders]
    check_targets(out, dests)
    published = []
    for folder, dest in zip(folders, dests, strict=True):
        rel = folder.relative_to(tmp)
        write_sums(folder)
        if dest.is_dir() and (why := damage(dest)):
            log.warning("the earlier export %s was damaged (%s); this export replaces it", dest, why)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _replace(folder, dest)
        if rel == Path("."):
            tmp.mkdir()  # staged() removes it
        published.append(dest)
    return published


def _replace(new: Path, dest: Path, tries: int = 5) -> None:
    """Rename `new` to `dest`, moving an earlier `dest` aside first; another export publishing the same folder
    at the same moment can put its own back in between: then move that one aside too."""
    for _ in range(tries):
        old = dest.with_name(f"{dest.name}.old{os.getpid()}{next(_SERIAL)}")
        try:
            if dest.exists():
                dest.rename(old)
            new.rename(dest)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise
        finally:
            shutil.rmtree(old, ignore_errors=True)
    raise OSError(errno.EBUSY, "other exports keep replacing it", str(dest))


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != SUMS)


def write_sums(folder: Path) -> Path:
    """`folder`/SHA256SUMS over every other file in it."""
    path = folder / SUMS
    path.write_text("".join(f"{file_digest(folder / f)}  {f}\n" for f in _files(folder)))
    return path


def damage(folder: Path) -> str | None:
    """What in an exported `folder` differs from its SHA256SUMS (naming the file), or None; None too for a
    folder exported before the sums were kept."""
    sums = folder / SUMS
    if not sums.is_file():
        return None
    try:
        listed = dict(line.split("  ", 1)[::-1] for line in sums.read_text().splitlines())
    except (UnicodeDecodeError, ValueError):
        return f"{sums} is unreadable"
    files = _files(folder)
    if any(len(d) != 64 for d in listed.values()) or sorted(listed) != files:
        differ = ", ".join(sorted(set(listed) ^ set(files)))
        return f"{sums} does not match the folder's files" + (f" ({differ})" if differ else "")
    for name, recorded in listed.items():
        if file_digest(folder / name) != recorded:
            return f"{folder / name} was changed after it was exported (its sha256 differs from {SUMS})"
    return None
