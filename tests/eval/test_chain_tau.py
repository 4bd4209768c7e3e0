"""eval/bench/chain_tau.py: drafters side by side on the same prompts, chain tau and position rates that add up,
and a drafter of another backbone refused in one line."""

import json

import pytest

from headstart.eval.bench import chain_tau
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _drafter(path, seed: int, tiny_seed: int = 3):
    import torch

    cfg = BackboneConfig(
        name="tiny", path="tiny", dtype="float32", tiny={"seed": tiny_seed, "initializer_range": 0.2}
    )
    bb, mcfg = load_backbone(cfg), MedusaConfig(num_heads=2)
    torch.manual_seed(seed)
    return save_drafter(path, build_drafter("medusa", mcfg, bb), "medusa", mcfg, cfg, bb)


def test_two_drafters_scored_on_the_same_prompts(tmp_path, capsys):
    a, b = _drafter(tmp_path / "a" / "drafter", 0), _drafter(tmp_path / "b" / "drafter", 1)
    out = tmp_path / "rows.json"
    chain_tau.main([
        "--checkpoints", str(a), str(b), "--k", "2", "--lookup", "2", "1", "--branch", "2", "--prompts", "dev", "--per-category", "1",
        "--tokens", "8", "--dtype", "float32", "--out", str(out),
    ])  # fmt: skip
    data = json.loads(out.read_text())
    assert data["prompts"] == 11 and len(data["rows"]) == 2  # one per dev category
    for row in data["rows"]:
        assert 1.0 <= row["tau"] <= 3.0 and row["hybrid_tau"] >= 1.0 and 1.0 <= row["branch_tau"] <= 5.0
        # tau = 1 (the target's own token) + the drafts accepted per step, position by position
        assert row["tau"] == pytest.approx(1.0 + sum(row["position_rates"]), abs=0.2)
    assert "chain of 2 tau" in capsys.readouterr().out and data["branch"] == 2


def test_a_drafter_of_another_backbone_is_refused(tmp_path, monkeypatch):
    a = _drafter(tmp_path / "a" / "drafter", 0)
    b = _drafter(tmp_path / "b" / "drafter", 0)
    meta = json.loads((b / "config.json").read_text())
    meta["backbone"]["path"] = "other"
    (b / "config.json").write_text(json.dumps(meta))
    with pytest.raises(SystemExit, match="another backbone than"):
        chain_tau.main(
            ["--checkpoints", str(a), str(b), "--prompts", "dev", "--tokens", "4", "--dtype", "float32"]
        )
