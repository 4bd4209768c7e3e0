"""eval/bench/distill_tau.py on a tiny checkpoint: greedy reports tau before / after and the token-for-token match
with vanilla; with --temperature > 0 it reports tau only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from conftest import tiny_backbone

from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, load_drafter, read_meta, save_drafter
from headstart.models.distill import DistillConfig

REPO = Path(__file__).resolve().parents[2]
TINY = {"seed": 0, "initializer_range": 0.2}


def test_distill_tau_greedy_and_sampled(tmp_path):
    target = tiny_backbone(**TINY)
    cfg = DistillConfig(keep_layers=[0])
    drafter = build_drafter("distillspec", cfg, target)
    bb_cfg = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny=TINY)
    save_drafter(tmp_path / "drafter", drafter, "distillspec", cfg, bb_cfg, target, extra={"step": 3})
    cmd = [sys.executable, "eval/bench/distill_tau.py", "--checkpoint", str(tmp_path), "--prompts", "2"]
    cmd += ["--tokens", "12"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    results = {}
    for temperature in ("0", "1"):
        res = subprocess.run(
            [*cmd, "--temperature", temperature],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        results[temperature] = json.loads(res.stdout)
    greedy, sampled = results["0"], results["1"]
    assert greedy["step"] == 3 and greedy["prompts"] == 2 and greedy["temperature"] == 0.0
    for side in ("before", "after"):  # an untrained checkpoint: after is the init, so both agree
        assert greedy[side]["greedy_matches_vanilla"] == 1.0 and 1.0 <= greedy[side]["tau"] <= 5.0
        assert "greedy_matches_vanilla" not in sampled[side] and 1.0 <= sampled[side]["tau"] <= 5.0
    assert greedy["before"]["tau"] == greedy["after"]["tau"]
    assert sampled["before"]["tau"] == sampled["after"]["tau"]  # same seeds, same draft: same samples


def test_write_before_saves_the_init_as_a_drafter_of_the_same_run(tmp_path):
    """The undistilled draft goes through every engine as a checkpoint: its weights are the init's (here the
    pruned copy of the target), not the trained ones, and its target and settings are the run's."""
    target = tiny_backbone(**TINY)
    cfg = DistillConfig(keep_layers=[1])
    trained = build_drafter("distillspec", cfg, target)
    with torch.no_grad():
        for p in trained.draft.parameters():
            p.add_(0.5)  # as if distilled
    bb_cfg = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny=TINY)
    save_drafter(tmp_path / "drafter", trained, "distillspec", cfg, bb_cfg, target, extra={"step": 7})
    res = subprocess.run(
        [sys.executable, "eval/bench/distill_tau.py", "--checkpoint", str(tmp_path)]
        + ["--write-before", str(tmp_path / "before")],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    before, meta = load_drafter(tmp_path / "before", target)
    assert meta["step"] == 0 and meta["method_config"]["keep_layers"] == [1]
    assert meta["backbone"] == read_meta(tmp_path / "drafter")["backbone"]
    init = build_drafter("distillspec", cfg, target).draft.state_dict()
    for key, value in before.draft.state_dict().items():
        torch.testing.assert_close(value, init[key])
        assert not torch.equal(value, trained.draft.state_dict()[key])
