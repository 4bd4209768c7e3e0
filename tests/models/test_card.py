"""Model cards publish nothing local (issue #11 (9)): the base model is backbone.hub_id or a Hub id / base name,
the data and prompts files by base name, the training-conversation count from the data stats, no raw dicts."""

from __future__ import annotations

import json

from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.export import export
from headstart.models.medusa import MedusaConfig


def test_card_names_no_local_paths_and_counts_conversations(backbone, tmp_path, monkeypatch):
    home = tmp_path / "home" / "alice"
    local_model, data_file = home / "models" / "my-llama", home / "data" / "chats.jsonl"
    local_model.mkdir(parents=True)
    data_file.parent.mkdir(parents=True)
    data_file.write_text("")
    bcfg = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})
    cfg = MedusaConfig(num_heads=2)
    job = {
        "data": {"source": str(data_file), "max_length": 96, "responses": "dataset"},
        "optim": {"lr": 0.001},
    }
    stats = {"train": {"rows": 44, "samples": 42}, "eval": {"samples": 4}}
    run = tmp_path / "run"
    save_drafter(
        run / "drafter",
        build_drafter("medusa", cfg, backbone),
        "medusa",
        cfg,
        bcfg,
        backbone,
        extra={"step": 6, "job": job, "data_stats": stats},
    )
    meta_file = run / "drafter" / "config.json"
    meta = json.loads(meta_file.read_text())
    meta["backbone"]["path"] = str(local_model)  # as if trained on a local folder (same weights: tiny)
    meta_file.write_text(json.dumps(meta))
    prompts = {"file": str(home / "prompts" / "dev.jsonl"), "n": 22, "categories": {"x": 22}}
    (run / "eval").mkdir()
    report = {"method": "medusa", "temperature": 0.0, "prompts": prompts, "tau": 1.5, "speedup": 1.2}
    (run / "eval" / "report.json").write_text(json.dumps(report))
    # export() imports load_backbone when called: the local folder resolves to the tiny model it stands for
    monkeypatch.setattr("headstart.models.backbone.load_backbone", lambda c, device="cpu": backbone)
    folders = export(run, tmp_path / "out", [])
    for folder in folders:
        card = (folder / "README.md").read_text()
        config = (folder / "config.json").read_text()
        assert str(home) not in card + config, card
        assert "base_model: my-llama" in card and "`chats.jsonl`" in card
        assert "42 training conversations" in card and "22 prompts from `dev.jsonl`" in card
        assert "{'" not in card  # no Python dict repr


def test_hub_id_is_the_base_model():
    from headstart.models.export.card import base_model_id, public_name

    assert base_model_id({"hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct", "path": "pkg://x/y.gguf"}) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert (
        base_model_id({"hub_id": None, "path": "Qwen/Qwen2.5-0.5B-Instruct"}) == "Qwen/Qwen2.5-0.5B-Instruct"
    )
    assert (
        public_name("/srv/models/x.gguf") == "x.gguf"
        and public_name("sharegpt-package") == "sharegpt-package"
    )
