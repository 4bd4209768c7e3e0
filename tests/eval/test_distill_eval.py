"""A DistillSpec draft measured in the built-in decoder: quick_eval on the live (unfrozen) draft mid-training,
and eval/run.py on a distillspec checkpoint (method `draft`, the distilled LM as the draft)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_backbone

from headstart.eval.engine.quick import quick_eval
from headstart.models.backbone import Backbone, BackboneConfig
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.distill import DistillConfig
from headstart.models.export.draft import write_hf_draft

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
TINY = {"seed": 0, "initializer_range": 0.2}
BB_CFG = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny=TINY)


def test_backbone_freeze_false_leaves_the_model_as_it_is():
    target = tiny_backbone(**TINY)
    draft = build_drafter(
        "distillspec", DistillConfig(keep_layers=[0]), target
    ).draft  # trainable, train mode
    Backbone(draft, target.tokenizer, freeze=False)
    assert draft.training and all(p.requires_grad for p in draft.parameters())
    Backbone(draft, target.tokenizer)  # the default freezes in place
    assert not draft.training and not any(p.requires_grad for p in draft.parameters())


def test_quick_eval_runs_the_live_draft_and_leaves_it_trainable():
    target = tiny_backbone(**TINY)
    # every target layer kept: the draft is a copy of the target, so (greedy) every draft token is accepted
    drafter = build_drafter("distillspec", DistillConfig(keep_layers=[0, 1]), target)
    drafter.train()
    ids = target.tokenizer("alpha beta gamma")["input_ids"]
    res = quick_eval(target, drafter, "distillspec", [ids, ids[:3]], max_new_tokens=11)
    # 11 tokens = the prefill's + 2 steps of 4 drafts + 1 bonus each: tau = 10 / 2 per prompt
    assert res["new_tokens"] == 22 and res["target_forwards"] == 4 and res["tau"] == 5.0
    assert res["accept_by_position"] == [1.0] * 4
    assert drafter.training and drafter.draft.training
    assert all(p.requires_grad for p in drafter.parameters())
    # a training step still works on the weights the decoder just ran (no inference-mode tensors left behind)
    x = torch.tensor([ids])
    hidden, _ = target(x)
    loss, count, _ = drafter(x, torch.ones_like(x), torch.ones_like(x[:, 1:], dtype=torch.bool), hidden)
    loss.backward()
    assert drafter.draft.model.layers[0].mlp.up_proj.weight.grad is not None


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO / "eval" / "run.py"), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=180, env=env)


def test_eval_cli_scores_a_distillspec_checkpoint_as_a_draft(tmp_path):
    target = tiny_backbone(**TINY)
    cfg = DistillConfig(keep_layers=[0, 1], divergence="tvd")
    drafter = build_drafter("distillspec", cfg, target)
    torch.manual_seed(3)
    with torch.no_grad():  # a copy of the target, nudged: some drafts accepted, some not
        for p in drafter.parameters():
            p.add_(0.02 * torch.randn_like(p))
    ckpt = save_drafter(tmp_path / "drafter", drafter, "distillspec", cfg, BB_CFG, target, extra={"step": 5})
    hf = write_hf_draft(drafter, target, tmp_path / "hf_draft", torch.float32)
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["alpha beta gamma"]},
        {"question_id": 2, "category": "coding", "turns": ["def add(a, b):"]},
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    # native layers on both sides: under draft_weights=auto a checkpoint's draft decodes in int8 on a CPU, which can
    # flip this nudged copy's near-ties (it did on an AVX2 EPYC); the comparison below is of the same weights
    common = [f"checkpoint={ckpt}", f"prompts={prompts}", "max_new_tokens=12", "device=cpu", "warmup=0",
              "draft_weights=native"]  # fmt: skip

    res = cli([*common, f"out_dir={tmp_path / 'ckpt_out'}"], tmp_path)  # method empty: the checkpoint's draft
    assert res.returncode == 0, res.stderr[-3000:]
    by_ckpt = json.loads((tmp_path / "ckpt_out" / "report.json").read_text())
    assert by_ckpt["method"] == "draft" and by_ckpt["draft"] == str(ckpt) and by_ckpt["step"] == 5
    assert by_ckpt["greedy_matches_vanilla"] == 1.0
    assert 1.0 < by_ckpt["tau"] < 5.0 and by_ckpt["speedup"] > 0

    res = cli([*common, "method=draft", f"draft={hf}", f"out_dir={tmp_path / 'hf_out'}"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    by_hf = json.loads((tmp_path / "hf_out" / "report.json").read_text())
    assert by_hf["method"] == "draft" and by_hf["draft"] == str(hf)
    # the same weights in the same dtype: the same proposals, so the same acceptance
    assert by_hf["tau"] == by_ckpt["tau"]
    assert by_hf["acceptance_by_position"] == by_ckpt["acceptance_by_position"]
    assert by_hf["decoding"]["draft_weights"] == by_ckpt["decoding"]["draft_weights"] == "native"

    # a draft named by draft= takes int8 layers too (asked for here; under auto where they time faster)
    int8 = [a for a in common if a != "draft_weights=native"] + ["draft_weights=int8"]
    res = cli([*int8, "method=draft", f"draft={hf}", f"out_dir={tmp_path / 'hf_int8'}"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    by_int8 = json.loads((tmp_path / "hf_int8" / "report.json").read_text())
    assert by_int8["decoding"]["draft_weights"] == "int8" and by_int8["greedy_matches_vanilla"] == 1.0
