"""eval/bench/train.py's DistillSpec variants: the chunked and the naive loss are the same loss (value and
gradient) on the tiny model, and the CLI runs each variant in its own process and reports both."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_backbone

from headstart.eval.bench.train import build, step_loss
from helpers import REPO, env


def test_chunked_and_naive_distill_losses_agree():
    backbone = tiny_backbone(initializer_range=0.2)
    args = argparse.Namespace(variant="distill", draft_layers=1, divergence="jsd", heads=2, dtype="float32")
    drafter = build(args, backbone)
    ids = torch.randint(0, backbone.vocab_size, (2, 24))
    labels = ids.clone()
    labels[:, :6] = -100
    losses, grads = [], []
    for variant in ("distill", "distill_naive"):
        args.variant = variant
        drafter.zero_grad(set_to_none=True)
        loss = step_loss(args, backbone, drafter, ids, labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append(drafter.draft.model.layers[0].self_attn.q_proj.weight.grad.clone())
    assert losses[0] > 0
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.slow  # one subprocess per variant and round (~45 s); the losses are checked in-process below
def test_cli_runs_the_distill_variants_on_tiny(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "eval/bench/train.py", "--backbone", "tiny", "--steps", "1", "--seq-len", "32"]
    cmd += ["--variants", "distill,distill_naive", "--out", str(out), "--repeats", "2"]
    res = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.loads(out.read_text())
    rows = saved["rows"]
    assert [r["variant"] for r in rows] == ["distill", "distill_naive"]
    assert all(r["tokens_per_s"] > 0 and r["peak_rss_mb"] > 0 and r["rounds"] == 2 for r in rows)
    assert (
        rows[1]["speed_x"] == 1.0
        and rows[0]["speed_x_ci"][0] <= rows[0]["speed_x"] <= rows[0]["speed_x_ci"][1]
    )
    assert saved["conditions"]["threads"] >= 1 and "load_avg_after" in saved["conditions"]
    assert "distill_naive" in res.stdout.splitlines()[-2]  # the summary table, then the conditions line
    assert "threads" in res.stdout.splitlines()[-1]


@pytest.mark.parametrize("variant", ["eagle3", "eagle"])
def test_fused_and_naive_eagle_losses_agree(variant, monkeypatch):
    """Ours (teacher table once, every TTT step through one fused soft-CE call) and the EAGLE repo's full fp32
    logits are the same loss: value and gradient."""
    from headstart.eval.bench.train import naive_eagle_loss
    from headstart.models import eagle

    for name in ("teacher_targets", "linear_soft_cross_entropy"):  # restored after the test
        monkeypatch.setattr(eagle, name, getattr(eagle, name))
    backbone = tiny_backbone(initializer_range=0.2)
    args = argparse.Namespace(variant=variant, ttt_steps=3, draft_vocab=64, dtype="float32")
    torch.manual_seed(0)
    drafter = build(args, backbone)
    ids = torch.randint(0, backbone.vocab_size, (2, 24))
    labels = ids.clone()
    labels[:, :6] = -100
    losses, grads = [], []
    for naive in (False, True):
        if naive:
            naive_eagle_loss(eagle, backbone.lm_head.weight, drafter.draft_ids())
        drafter.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # EAGLE-1's feature noise: the same draw both times
        loss = step_loss(args, backbone, drafter, ids, labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append(drafter.fc.weight.grad.clone())
    assert losses[0] > 0
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(grads[0], grads[1])


def test_option_variants_set_their_option_and_run_the_plain_step():
    """`eagle3_skip` is `eagle3` with skip_prompt_rows on: the same loss (the option is exact)."""
    backbone = tiny_backbone(initializer_range=0.2)
    ids = torch.randint(0, backbone.vocab_size, (2, 24))
    labels = ids.clone()
    labels[:, :10] = -100
    losses = []
    for variant in ("eagle3", "eagle3_skip"):
        args = argparse.Namespace(variant=variant, ttt_steps=3, draft_vocab=64, dtype="float32", heads=2)
        torch.manual_seed(0)
        drafter = build(args, backbone)
        assert drafter.cfg.skip_prompt_rows == (variant == "eagle3_skip")
        losses.append(step_loss(args, backbone, drafter, ids, labels).detach())
    torch.testing.assert_close(losses[0], losses[1])
