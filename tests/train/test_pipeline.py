"""Full pipeline on the tiny model: train a few steps, check the exact files of a checkpoint, resume, and
survive SIGKILL (test_kill_resume.py: every method, bitwise)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import load_drafter
from helpers import run_train, train_overrides, write_chat_file


def test_train_checkpoint_files_and_resume(tmp_path):
    data = write_chat_file(tmp_path / "chat.jsonl")
    run_dir = tmp_path / "run"
    run_train(train_overrides(run_dir, data, tmp_path / "cache"))

    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_00000003", "step_00000006"]
    files = sorted(p.name for p in (run_dir / "checkpoints" / "step_00000006").iterdir())
    assert files == [
        "drafter",
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "scheduler.bin",
        "trainer_state.json",
    ]
    assert sorted(p.name for p in (run_dir / "drafter").iterdir()) == ["config.json", "model.safetensors"]
    meta = json.loads((run_dir / "drafter" / "config.json").read_text())
    assert meta["method"] == "medusa" and meta["step"] == 6 and len(meta["head_topk_accuracy"]) == 2
    assert meta["backbone"]["path"] == "tiny" and meta["job"]["train"]["max_steps"] == 6

    # the drafter rebuilds from the folder alone, and training moved it away from the init
    backbone = load_backbone(BackboneConfig(**meta["backbone"]))
    heads, _ = load_drafter(run_dir / "drafter", backbone)
    assert heads.blocks[0][0].linear.weight.abs().sum() > 0

    # resume=auto continues from step 6 to step 9 (no retraining of steps 1-6)
    res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 9}))
    assert "resumed from" in res.stderr + res.stdout
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["step"] == 9


def test_backbone_is_frozen_and_unchanged(tmp_path):
    data = write_chat_file(tmp_path / "chat.jsonl")
    run_dir = tmp_path / "run"
    before = load_backbone(BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0}))
    assert all(not p.requires_grad for p in before.parameters()) and not before.model.training
    before.train()
    assert not before.model.training, "the backbone must stay in eval mode"
    run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3}))
    # the drafter folder holds only head weights: nothing of the backbone was saved or changed
    state = load_file(run_dir / "drafter" / "model.safetensors")
    assert all(k.startswith(("blocks.", "lm_heads.")) for k in state)
    after = load_backbone(BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0}))
    for (n, a), (_, b) in zip(before.state_dict().items(), after.state_dict().items()):
        torch.testing.assert_close(a, b, msg=n)


def test_wandb_offline_logs_metrics(tmp_path):
    data = write_chat_file(tmp_path / "chat.jsonl")
    run_dir = tmp_path / "run"
    run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 2, "logger": "wandb"}))
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    blob = run_file.read_bytes()
    assert b"train/loss" in blob and b"eval/head0/top1" in blob


def test_resuming_a_run_dir_with_another_data_or_method_config_is_refused(tmp_path):
    data = write_chat_file(tmp_path / "chat.jsonl")
    run_dir = tmp_path / "run"
    run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3}))
    res = run_train(
        train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3, "method.num_heads": 3}),
        check=False,
    )
    assert res.returncode == 2 and "method.num_heads: 2 -> 3" in res.stderr
    assert "Traceback" not in res.stderr
