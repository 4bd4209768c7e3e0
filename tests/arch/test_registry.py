"""The registry is the one place that names a drafter method: no other module compares a method against a
literal, and every entry resolves to real code."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from headstart.eval.engine.proposers import PROPOSERS
from headstart.models import registry
from headstart.models.drafter import Drafter

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ["models", "data", "train", "eval", "headstart"]
NAMES = set(registry.METHODS) | set(PROPOSERS)


def _literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_literals(e) for e in node.elts)) if node.elts else set()
    return set()


def method_literal_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comparison between an expression naming a method (`method`, `meta["method"]`,
    `job.method_name`, ...) and a string literal that is a method name, and of tables keyed by method names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = set().union(*(_literals(s) for s in sides)) & NAMES
            about_method = any("method" in ast.unparse(s) for s in sides if not _literals(s))
            if names and about_method:
                found.append((node.lineno, ast.unparse(node)))
        keys = [_literals(k) for k in node.keys if k] if isinstance(node, ast.Dict) else []
        if len(keys) >= 2 and all(
            len(k) == 1 and k <= set(registry.METHODS) for k in keys
        ):  # a per-method table
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_no_module_outside_the_registries_compares_a_method_name():
    allowed = {ROOT / "models" / "registry.py", ROOT / "eval" / "engine" / "proposers" / "__init__.py"}
    offenders = []
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in allowed:
                continue
            for line, text in method_literal_comparisons(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not offenders, "method names compared outside the registry:\n" + "\n".join(offenders)


def test_the_checker_finds_what_it_looks_for():
    bad = 'if meta["method"] in ("eagle", "eagle3"):\n    pass\nx = method == "medusa"\nSTEPS = {"medusa": 1, "eagle": 2}\n'
    assert [line for line, _ in method_literal_comparisons(bad)] == [1, 3, 4]
    assert method_literal_comparisons('if layout == "eagle":\n    pass\n') == []


@pytest.mark.parametrize("name", sorted(registry.METHODS))
def test_every_entry_resolves(name, backbone):
    m = registry.get(name)
    assert (ROOT / "train" / f"{m.entry}.py").is_file()
    assert m.proposer in PROPOSERS
    for ref in (m.build, m.train_step, m.export):
        assert callable(registry.resolve(ref)), ref
    assert inspect.signature(m.exporter()).parameters.keys() >= {"drafter_dir", "meta", "out", "layouts"}
    cfg = m.config(num_layers=1, keep_layers=[0]) if name == "distillspec" else m.config()
    drafter = m.build_drafter(cfg, backbone)
    assert isinstance(drafter, Drafter)  # the protocol the loop and the decoder rely on
    assert registry.of_config(cfg) is m


def test_unknown_method_names_the_choices():
    with pytest.raises(ValueError, match="expected one of"):
        registry.get("mtp")
