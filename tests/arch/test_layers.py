"""The layer rule and no import circles, on the real tree and on planted trees that break each (so the check can fail)."""

from __future__ import annotations

from pathlib import Path

from helpers.layers import cycles, upward_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_tree_imports_only_down_the_layer_table():
    assert upward_imports(ROOT) == []


def test_the_tree_has_no_import_circle():
    assert cycles(ROOT) == []


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for folder in ("headstart", "models", "data", "train", "eval"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    for rel, src in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src)
    return tmp_path


def test_a_planted_upward_import_is_named(tmp_path):
    root = _plant(
        tmp_path,
        {
            "models/head.py": "def f():\n    from headstart.train.loop import train  # lazy, still a dependency\n",
            "train/loop.py": "from headstart.eval.stage import evaluate\n",
            "eval/stage/__init__.py": "",
            "eval/stage/evaluate.py": "",
            "train/medusa.py": "from headstart.train import loop\n",  # an entry script may import anything
        },
    )
    assert upward_imports(root) == [
        "headstart.models.head (models) imports headstart.train.loop (train)",
        "headstart.train.loop (train) imports headstart.eval.stage.evaluate (eval)",
    ]


def test_the_decoding_engine_may_not_reach_the_stage_and_nothing_imports_a_command(tmp_path):
    root = _plant(
        tmp_path,
        {
            "eval/engine/__init__.py": "",
            "eval/engine/decoder.py": "from headstart.eval.tuning.tuner import tune\n",
            "eval/tuning/__init__.py": "",
            "eval/tuning/tuner.py": "from headstart.eval import run\n",
            "eval/run.py": "",
        },
    )
    assert upward_imports(root) == [
        "headstart.eval.engine.decoder (measuring) imports headstart.eval.tuning.tuner (eval)",
        "headstart.eval.tuning.tuner imports the entry script headstart.eval.run",
    ]


def test_a_planted_circle_is_found(tmp_path):
    root = _plant(
        tmp_path,
        {
            "eval/config.py": "from headstart.eval.tuner import TunerConfig\n",
            "eval/tuner.py": "def f():\n    from headstart.eval.prompts import load\n",
            "eval/prompts.py": "from headstart.eval.config import EvalError\n",
        },
    )
    assert cycles(root) == [["headstart.eval.config", "headstart.eval.prompts", "headstart.eval.tuner"]]
