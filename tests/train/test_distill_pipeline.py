"""Full DistillSpec pipeline on the tiny model through train/distill.py: each data mode trains a few steps and
writes a drafter that rebuilds from its folder; the fixed-data run lowers its held-out loss and resumes; tau
measured in the decoder (train.quick_eval_every) lands in the checkpoint's eval; a bad layer id fails at start
with one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter, load_drafter
from headstart.models.distill import DistillConfig
from headstart.train.distill_data import pick_mode
from headstart.train.loop import worse_than_before
from helpers import run_train, train_overrides, write_chat_file

SCRIPT = "train/distill.py"


def overrides(tmp_path: Path, run: str, **extra) -> list[str]:
    data = tmp_path / "chat.jsonl"
    if not data.exists():
        write_chat_file(data)
    base = {
        "+backbone.tiny.initializer_range": 0.2,  # peaked tiny logits: something to distill
        "method.keep_layers": "[0]",
        "optim.lr": 1e-3,
        "optim.warmup_steps": 1,
        "train.keep_checkpoints": 0,
        "train.eval_every": 2,
        "train.save_every": 2,
        "method.gen_max_new_tokens": 16,
        **extra,
    }
    out = train_overrides(tmp_path / run, data, tmp_path / "cache", **base)
    return [o for o in out if not o.startswith("method.num_heads=")]  # a Medusa key


def eval_losses(run_dir: Path) -> dict[int, float]:
    metas = [
        json.loads(p.read_text()) for p in sorted(run_dir.glob("checkpoints/step_*/drafter/config.json"))
    ]
    return {m["step"]: m["eval"]["eval/loss"] for m in metas}


def test_fixed_data_run_writes_drafter_lowers_loss_and_resumes(tmp_path):
    run_dir = tmp_path / "fixed"
    res = run_train(overrides(tmp_path, "fixed", **{"train.max_steps": 6}), script=SCRIPT)
    # the progress bar shows the draft's agreement with the target, not a Medusa head's field stuck at 0
    assert "top1=" in res.stderr and "acc0=" not in res.stderr

    assert sorted(p.name for p in (run_dir / "drafter").iterdir()) == ["config.json", "model.safetensors"]
    meta = json.loads((run_dir / "drafter" / "config.json").read_text())
    assert (
        meta["method"] == "distillspec"
        and meta["step"] == 6
        and meta["draft_config"]["num_hidden_layers"] == 1
    )
    assert {"eval/loss", "eval/accept_sim", "eval/top1_match"} <= meta["eval"].keys()
    assert 0 < meta["eval"]["eval/accept_sim"] < 1
    losses = eval_losses(run_dir)
    assert losses[6] < losses[2], f"held-out divergence did not go down: {losses}"
    # only the draft is saved; the target rebuilt from the checkpoint's spec is the frozen one it trained against
    assert all(k.startswith("draft.") for k in load_file(run_dir / "drafter" / "model.safetensors"))
    target = load_backbone(BackboneConfig(**meta["backbone"]))
    fresh = load_backbone(
        BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, "initializer_range": 0.2})
    )
    for (k, a), (_, b) in zip(target.state_dict().items(), fresh.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    trained, _ = load_drafter(run_dir / "drafter", target)
    init = build_drafter("distillspec", DistillConfig(**meta["method_config"]), target)
    assert not torch.equal(
        trained.draft.model.layers[0].mlp.up_proj.weight, init.draft.model.layers[0].mlp.up_proj.weight
    )

    # the pruned draft starts trained: evaluated once before step 1, the baseline kept with every checkpoint
    assert "step 0 eval (before training)" in res.stderr + res.stdout
    before = meta["eval_before"]
    assert before["eval/loss"] > losses[6] and "made the drafter worse" not in res.stderr + res.stdout
    final = json.loads((run_dir / "final_eval.json").read_text())
    assert final["before/eval/loss"] == before["eval/loss"]

    res = run_train(overrides(tmp_path, "fixed", **{"train.max_steps": 8}), script=SCRIPT)
    assert "resumed from" in res.stderr + res.stdout
    assert "step 0 eval" not in res.stderr + res.stdout  # the baseline comes with the checkpoint
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["step"] == 8
    assert sorted(eval_losses(run_dir)) == [2, 4, 6, 8]
    assert json.loads((run_dir / "final_eval.json").read_text())["before/eval/loss"] == before["eval/loss"]


def test_a_draft_made_worse_by_training_is_named_at_the_end(tmp_path):
    """A learning rate far too high for a pretrained (here pruned) draft: the run finishes and says, in one
    line, that the draft it started from is better."""
    extra = {"train.max_steps": 2, "train.eval_every": 2, "optim.lr": 0.5, "optim.warmup_steps": 0}
    res = run_train(overrides(tmp_path, "worse", **extra), script=SCRIPT)
    final = json.loads((tmp_path / "worse" / "final_eval.json").read_text())
    assert final["eval/loss"] > final["before/eval/loss"]
    line = next(x for x in (res.stderr + res.stdout).splitlines() if "made the drafter worse" in x)
    assert f"held-out loss {final['before/eval/loss']:.4f} -> {final['eval/loss']:.4f}" in line
    assert "optim.lr" in line


def test_worse_than_before_compares_held_out_loss():
    before = {"eval/loss": 0.36, "eval/top1_match": 0.785}
    assert worse_than_before(before, {"eval/loss": 0.35, "eval/top1_match": 0.78}) == ""
    line = worse_than_before(before, {"eval/loss": 0.57, "eval/top1_match": 0.72})
    assert "0.3600 -> 0.5700" in line and "0.7850 -> 0.7200" in line
    assert worse_than_before({}, {"eval/loss": 1.0}) == ""


@pytest.mark.parametrize("mode", ["student", "mixture"])
def test_generated_data_modes_train(tmp_path, mode):
    run_dir = tmp_path / mode
    run_train(overrides(tmp_path, mode, **{"train.max_steps": 4, "method.data_mode": mode}), script=SCRIPT)
    meta = json.loads((run_dir / "drafter" / "config.json").read_text())
    assert meta["method_config"]["data_mode"] == mode and meta["step"] == 4
    # seed 0's coins for steps 0..3 draw both kinds, so the mixture run really mixes
    assert {pick_mode("mixture", 0.5, 0, s, True) for s in range(4)} == {"student", "fixed"}
    losses = eval_losses(run_dir)
    assert losses[4] != losses[2] and all(0 < v < 10 for v in losses.values())


def test_bad_layer_id_fails_at_start_naming_it(tmp_path):
    res = run_train(overrides(tmp_path, "bad", **{"method.keep_layers": "[0,7]"}), script=SCRIPT, check=False)
    assert res.returncode == 2
    assert "layer 7 is outside the target's 2 layers" in res.stderr and "Traceback" not in res.stderr


def test_measured_tau_during_training(tmp_path):
    run_dir = tmp_path / "measured"
    extra = {
        "train.max_steps": 2,
        "train.quick_eval_every": 2,
        "train.quick_eval_prompts": 2,
        "train.quick_eval_tokens": 8,
    }
    res = run_train(overrides(tmp_path, "measured", **extra), script=SCRIPT)
    assert "measured tau" in res.stderr + res.stdout
    measured = json.loads((run_dir / "drafter" / "config.json").read_text())["eval"]
    assert 1.0 <= measured["measured/tau"] <= 5.0  # 4 draft tokens + the bonus token at most
    assert [k for k in measured if k.startswith("measured/accept_pos")] == [
        f"measured/accept_pos{i}" for i in range(4)
    ]
