"""No function in the project's code runs past MAX_LINES: a long function is usually several steps that each want a
name (build, resume, loop, finish). Entry scripts and benchmarks are held to the same rule: they are read as
often as the library. Checked on the real tree and on a planted file, so the check can fail."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
FOLDERS = ("headstart", "models", "data", "train", "eval", "conf")


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """'path:line name (n lines)' for each function or method longer than `limit` lines, decorators and
    docstring included, nested functions counted within their parent and on their own."""
    out = []
    for folder in FOLDERS:
        for f in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    n = node.end_lineno - start + 1
                    if n > limit:
                        out.append(f"{f.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_runs_past_the_limit():
    assert long_functions(ROOT) == []


def test_a_planted_long_function_is_named(tmp_path):
    (tmp_path / "eval").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))  # def line + 79 = 80: allowed
    (tmp_path / "eval" / "ok.py").write_text(f"def fits():\n{body}\n")
    method = body.replace("\n", "\n    ")
    # decorator + def + 79 + 1 = 82 lines
    long = f"class A:\n    @staticmethod\n    def long():\n    {method}\n        y = 1\n"
    (tmp_path / "eval" / "long.py").write_text(long)
    assert long_functions(tmp_path) == ["eval/long.py:3 long (82 lines)"]
