"""eval/bench/decode.py on the tiny backbone: every row present, HF forwards counted, greedy outputs agree."""

from __future__ import annotations

import json

import pytest
import torch

from headstart.eval.bench.decode import ForwardCounter, main
from headstart.eval.errors import EvalError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_benchmark_rows_on_tiny(tmp_path):
    out = tmp_path / "bench"
    argv = ["--backbone", "tiny", "--draft", "tiny", "--n", "2", "--max-new-tokens", "12", "--device", "cpu",
            "--budget-s", "2", "--prompts", "dev", "spec_bench"]  # fmt: skip
    rows = {r["method"]: r for r in main([*argv, "--out", str(out)])}
    assert list(rows) == ["ours vanilla", "ours prompt_lookup", "ours lookahead", "ours draft", "HF greedy",
                          "HF prompt_lookup", "HF assisted"]  # fmt: skip
    assert rows["ours vanilla"]["tau"] == 1.0 and rows["HF greedy"]["tau"] == 1.0  # one token per forward
    assert (
        rows["ours vanilla"]["speedup_vs_ours_vanilla"] == 1.0
        and rows["HF greedy"]["ratio_vs_hf_greedy"] == 1.0
    )
    for r in rows.values():  # float32 greedy: every method reproduces our vanilla output
        assert r["matches_ours_vanilla"] == 1.0 and r["tau"] >= 1.0 and r["tokens_per_s"] > 0
    saved = json.loads((out / "bench.json").read_text())
    assert saved["settings"]["prompt_sets"] == ["dev", "spec_bench"]  # read as one set
    assert saved["conditions"]["threads"] >= 1 and saved["conditions"]["load_avg_after"] is not None
    assert saved["timing"]["pairs"] >= 2 and all(len(r["speedup_ci"]) == 2 for r in saved["rows"])
    assert len(saved["rows"]) == 7 and "| HF assisted |" in (out / "bench.md").read_text()
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the table as a plot
    # ours: per-token latency and memory beside vanilla's; the draft LM is a second tiny model of known size
    for name in ("ours vanilla", "ours prompt_lookup", "ours lookahead", "ours draft"):
        lat, mem = rows[name]["token_latency_ms"], rows[name]["memory"]
        assert 0 < lat["p50"] <= lat["p99"] and mem["peak_gb"] > 0
    assert rows["HF greedy"]["memory"] is None and rows["HF greedy"]["token_latency_ms"]["p50"] is None
    assert rows["ours vanilla"]["memory"]["overhead_gb"] == 0.0
    draft = rows["ours draft"]["memory"]
    assert draft["drafter_bytes"] == draft["target_bytes"]  # the same tiny architecture drafts
    assert draft["state_bytes"] >= draft["cache_bytes"] > 0  # the draft LM's own KV cache, as long as ours


def test_forward_counter_counts_calls():
    layer = torch.nn.Linear(2, 2)
    with ForwardCounter(layer) as c:
        layer(torch.zeros(1, 2))
        layer(torch.zeros(1, 2))
    layer(torch.zeros(1, 2))  # the hook is gone after the block
    assert c.calls == 2


def test_benchmark_needs_a_model():
    with pytest.raises(EvalError, match="--checkpoint"):
        main(["--n", "2"])


def test_draft_weights_rows_side_by_side(tmp_path):
    """--draft-weights native,int8: one drafter row each, on the checkpoint's tuned tree with a lookup branch;
    both lossless (float32 greedy == ours vanilla); --no-hf drops the HF rows."""
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import build_drafter, save_drafter
    from headstart.models.decoding import write_decoding
    from headstart.models.eagle_config import Eagle3Config

    cfg = BackboneConfig(
        name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2}
    )
    bb, mcfg = load_backbone(cfg), Eagle3Config(aux_layers=[1, 1, 1], draft_vocab_size=64)
    ckpt = save_drafter(tmp_path / "d", build_drafter("eagle3", mcfg, bb), "eagle3", mcfg, cfg, bb)
    write_decoding(ckpt, {"decoder": {"num_draft_tokens": 2, "tree_nodes": 5, "topk": 2}})
    argv = ["--checkpoint", str(ckpt), "--n", "2", "--max-new-tokens", "12", "--device", "cpu", "--budget-s", "0",
            "--draft-weights", "native,int8", "--lookup-tokens", "2", "--no-hf"]  # fmt: skip
    rows = {r["method"]: r for r in main(argv)}
    assert list(rows) == ["ours vanilla", "ours eagle3 (native)", "ours eagle3 (native) + lookup 2",
                          "ours eagle3 (int8)", "ours eagle3 (int8) + lookup 2", "ours prompt_lookup",
                          "ours lookahead"]  # fmt: skip
    assert all(r["matches_ours_vanilla"] == 1.0 and r["ratio_vs_hf_greedy"] is None for r in rows.values())
    drafts = {m: r["draft_ms_per_step"] for m, r in rows.items()}
    assert drafts["ours vanilla"] < drafts["ours eagle3 (int8)"]  # vanilla: the decoder's no-op, ~2 us
    with pytest.raises(EvalError, match="--draft-weights int8,int8"):
        main([*argv, "--draft-weights", "int8,int8"])  # the last one given wins


def test_several_drafters_in_one_table(tmp_path):
    """--checkpoint A B C: a Medusa, an EAGLE-3 and a DistillSpec drafter of one backbone, a row each named by its
    run (the tree drafters also with their lookup branch; the draft model has no tree to carry one), timed in
    the same rounds, all lossless; two drafters in same-named run folders are refused in one line."""
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import build_drafter, save_drafter
    from headstart.models.distill import DistillConfig
    from headstart.models.eagle_config import Eagle3Config
    from headstart.models.medusa import MedusaConfig

    cfg = BackboneConfig(
        name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2}
    )
    bb = load_backbone(cfg)
    eagle_cfg, medusa_cfg = Eagle3Config(aux_layers=[1, 1, 1], draft_vocab_size=64), MedusaConfig(num_heads=2)
    eagle = save_drafter(
        tmp_path / "e3" / "drafter", build_drafter("eagle3", eagle_cfg, bb), "eagle3", eagle_cfg, cfg, bb
    )
    medusa = save_drafter(
        tmp_path / "heads" / "drafter", build_drafter("medusa", medusa_cfg, bb), "medusa", medusa_cfg, cfg, bb
    )
    distill_cfg = DistillConfig(keep_layers=[0])
    draft = save_drafter(
        tmp_path / "ds" / "drafter",
        build_drafter("distillspec", distill_cfg, bb),
        "distillspec",
        distill_cfg,
        cfg,
        bb,
    )
    argv = ["--checkpoint", str(medusa), str(eagle), str(draft), "--n", "2", "--max-new-tokens", "8", "--device",
            "cpu", "--budget-s", "0", "--lookup-tokens", "2", "--no-hf"]  # fmt: skip
    rows = {r["method"]: r for r in main(argv)}
    assert list(rows) == ["ours vanilla", "ours medusa [heads]", "ours medusa [heads] + lookup 2",
                          "ours eagle3 [e3]", "ours eagle3 [e3] + lookup 2", "ours draft [ds]",
                          "ours prompt_lookup", "ours lookahead"]  # fmt: skip
    assert all(r["matches_ours_vanilla"] == 1.0 for r in rows.values())
    twin = save_drafter(
        tmp_path / "x" / "heads", build_drafter("medusa", medusa_cfg, bb), "medusa", medusa_cfg, cfg, bb
    )
    with pytest.raises(EvalError, match=r"share a run folder name \(\['heads', 'heads'\]\)"):
        main(["--checkpoint", str(medusa), str(twin), "--n", "1"])
