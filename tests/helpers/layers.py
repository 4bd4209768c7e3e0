"""The layer rule the README's layout table states, as a checker the architecture tests run on the tree (and on
planted trees, to show it fails).

A module may import its own layer and the layers MAY_IMPORT names; entry scripts (commands run as files, never
imported) may import anything, and nothing may import them. Imports inside functions count too: a lazy import
that points up is still a dependency. Separately, library modules must not import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

# (layer, module prefixes); the longest matching prefix decides a module's layer
LAYERS = [
    ("base", ["headstart"]),
    ("models", ["headstart.models"]),
    ("data", ["headstart.data"]),
    ("measuring", ["headstart.eval.errors", "headstart.eval.engine", "headstart.eval.timing"]),
    ("eval", ["headstart.eval"]),
    ("train", ["headstart.train"]),
]
# what each layer may import besides itself: train uses the decoding engine and the timing harness (its quick
# eval, its benchmarks' clocks) but never the eval stage, and the eval stage never reaches into training
MAY_IMPORT = {
    "base": set(),
    "models": {"base"},
    "data": {"base", "models"},
    "measuring": {"base", "models", "data"},
    "eval": {"base", "models", "data", "measuring"},
    "train": {"base", "models", "data", "measuring"},
}
# commands: run as files by launch.sh or users, never imported
ENTRY = [
    "headstart.launch",
    "headstart.vllm_worker",
    "headstart.train.medusa",
    "headstart.train.eagle",
    "headstart.train.distill",
    "headstart.train.export",
    "headstart.eval.run",
    "headstart.eval.tune",
    "headstart.eval.serve_check",
    "headstart.eval.vllm_k",
    "headstart.eval.bench",
]
# the installed package name of each source folder (pyproject.toml's package-dir)
FOLDERS = {
    "headstart": "headstart",
    "models": "headstart.models",
    "data": "headstart.data",
    "train": "headstart.train",
    "eval": "headstart.eval",
}


def module_names(root: Path) -> dict[str, Path]:
    out = {}
    for folder, pkg in FOLDERS.items():
        for f in sorted((root / folder).rglob("*.py")):
            parts = f.relative_to(root / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((pkg, *parts))] = f
    return out


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """headstart modules `path` imports anywhere in it (a `from pkg import mod` names the module)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("headstart"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if not base.startswith("headstart"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in known else base)
    found.discard(name)
    return found


def _prefix_match(name: str, prefixes: list[str]) -> int:
    return max((len(p) for p in prefixes if name == p or name.startswith(p + ".")), default=-1)


def layer_of(name: str) -> int:
    best = max(range(len(LAYERS)), key=lambda i: _prefix_match(name, LAYERS[i][1]))
    return best


def is_entry(name: str) -> bool:
    return _prefix_match(name, ENTRY) >= 0


def _allowed(a: str, b: str) -> bool:
    return a == b or b in MAY_IMPORT[a]


def graph(root: Path) -> dict[str, set[str]]:
    names = module_names(root)
    known = set(names)
    return {n: {m for m in imports_of(p, n, known) if m in known} for n, p in names.items()}


def upward_imports(root: Path) -> list[str]:
    """'a (layer) imports b (layer)' for each import MAY_IMPORT does not allow, and each import of an entry script."""
    bad = []
    for a, deps in sorted(graph(root).items()):
        for b in sorted(deps):
            if is_entry(b):
                bad.append(f"{a} imports the entry script {b}")
            elif not is_entry(a) and not _allowed(LAYERS[layer_of(a)][0], LAYERS[layer_of(b)][0]):
                bad.append(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})")
    return bad


def cycles(root: Path) -> list[list[str]]:
    """Import circles among library modules (package __init__ re-exports of their own children excluded)."""
    g = graph(root)
    g = {
        a: {b for b in deps if not is_entry(b) and not b.startswith(a + ".")}
        for a, deps in g.items()
        if not is_entry(a)
    }
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out
