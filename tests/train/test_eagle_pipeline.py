"""Full EAGLE pipeline on the tiny model: train a few steps, the exact checkpoint files, resume, reload."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import load_drafter
from headstart.models.export import export
from headstart.models.export.eagle import read_layout
from helpers import run_train, train_overrides, write_chat_file


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_train_resume_reload(tmp_path, method):
    data = write_chat_file(tmp_path / "chat.jsonl")
    run_dir = tmp_path / "run"
    short = {"train.max_steps": 4, "train.eval_every": 2, "train.save_every": 2}
    over = [o for o in train_overrides(run_dir, data, tmp_path / "cache", **short) if "num_heads" not in o]
    if method == "eagle3":
        over += [
            "method=eagle3",
            "method.draft_vocab_size=48",
            "method.ttt_steps=2",
            "train.quick_eval_every=4",
            "train.quick_eval_prompts=1",
            "train.quick_eval_tokens=8",
        ]
    run_train(over, script="train/eagle.py")
    meta = json.loads((run_dir / "drafter" / "config.json").read_text())
    assert meta["method"] == method and meta["step"] == 4 and "eval/sim_tau" in meta["eval"]
    state = load_file(run_dir / "drafter" / "model.safetensors")
    assert all(not k.startswith(("model.", "embed")) for k in state)  # no backbone weights
    if method == "eagle3":
        assert state["d2t"].shape == (48,) and int(state["t2d"].sum()) == 48
        assert meta["data_stats"]["draft_vocab_coverage"] >= 0.9 and "measured/tau" in meta["eval"]
    backbone = load_backbone(BackboneConfig(**meta["backbone"]))
    drafter, _ = load_drafter(run_dir / "drafter", backbone)
    if method == "eagle3":
        assert drafter.d2t.tolist() == state["d2t"].tolist()
    folders = export(run_dir, tmp_path / "export", [])  # every layout of the method, read back identically
    assert [f.name for f in folders] == (
        ["eagle3", "speculators"] if method == "eagle3" else ["eagle", "eagle_vllm"]
    )
    for folder in folders:
        back = read_layout(folder, backbone)
        for k, v in drafter.state_dict().items():
            torch.testing.assert_close(back.state_dict()[k], v, msg=k)
    res = run_train([*over, "train.max_steps=6"], script="train/eagle.py")
    assert "resumed from" in res.stderr + res.stdout
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["step"] == 6
    if method == "eagle3":  # the simulated-vs-measured comparison reads the run's checkpoints
        from headstart.eval.bench.sim_vs_measured import compare

        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text('{"question_id": 1, "category": "x", "turns": ["hello there"]}\n')
        summary = compare([str(run_dir)], str(prompts), 1, 6, tmp_path / "svm")
        assert {r["step"] for r in summary["rows"]} >= {4, 6}
        assert all(r["sim"] >= 1 and r["chain"] >= 1 and r["tree"] >= 1 for r in summary["rows"])
        assert (tmp_path / "svm" / "sim_vs_measured.png").stat().st_size > 0
