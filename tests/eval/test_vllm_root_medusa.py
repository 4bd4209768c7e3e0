"""Root-token Medusa heads (`method.root_token`) served by headstart's vLLM plugin (slow; skipped without
`./launch.sh vllm-setup`): heads whose root projection alone is fitted on a tiny Llama's own greedy
continuations, so that what they accept comes from the root they read, exported as the `vllm/` layout (the plugin's `HeadstartRootMedusaModel`), and then

- vLLM's greedy output with them equals its plain greedy output (fp32), alone and behind the lookup chain, and
- vLLM's tau matches headstart's decoder on the same chain, and is nearer it than to the same heads with their
  root projection zeroed: vLLM reads the root, not only the hidden state."""

from __future__ import annotations

import pytest
import torch

from headstart.eval.bench.chain_tau import greedy_tau
from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers import chain_options
from headstart.eval.serving.check import engine_args, export_layouts, hybrid_spec
from headstart.eval.serving.counters import spec_counters
from headstart.eval.serving.counters import tau as vllm_tau
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import LoadedDrafter, build_drafter, load_drafter, read_meta, save_drafter
from headstart.models.decoding import lookup_options
from headstart.models.medusa import MedusaConfig
from headstart.vllm_runner import VllmEngine, engine_spec, is_set_up

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not is_set_up(), reason="vLLM not set up (./launch.sh vllm-setup)"),
]
K, NEW = 2, 32
TEXTS = [
    "the cat sat on the mat. the cat sat on the",
    "Once upon a time, there was",
    "1, 2, 3, 4, 5, 6, 7,",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
]
TINY = {
    "seed": 0,
    "initializer_range": 0.1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}


def fitted_root_heads(backbone, prompts) -> torch.nn.Module:
    heads = build_drafter("medusa", MedusaConfig(num_heads=K, share_lm_head=True, root_token=True), backbone)
    rows = []
    for prompt in prompts:  # the backbone's own greedy continuation: what the heads will be asked to predict
        ids = torch.tensor([prompt + Decoder(backbone).generate(prompt, 48).tokens])
        labels = ids.clone()
        labels[:, : len(prompt)] = -100
        rows.append((ids, labels, backbone(ids)[0]))
    # the root's projection alone learns (the blocks stay the identity): zeroed, the heads would draft the
    # backbone's own next token again, so what they accept comes from reading the root
    opt = torch.optim.AdamW([heads.root_proj.weight], lr=3e-3)
    for _ in range(60):
        for ids, labels, hidden in rows:
            loss, n, _ = heads(hidden, labels, input_ids=ids)
            (loss / n).backward()
            opt.step()
            opt.zero_grad()
    return heads


def served(spec: dict, prompts, log) -> tuple[list[list[int]], float]:
    """(greedy outputs, tau as headstart counts it) of a vLLM engine, the prompts one at a time."""
    with VllmEngine(spec, log) as engine:
        outs = [engine.generate([p], NEW)["outputs"][0]["token_ids"] for p in prompts]
        counters = spec_counters(engine.metrics())
    return outs, vllm_tau(counters | {"emitted": sum(max(len(o) - 1, 0) for o in outs)})


def test_root_heads_serve_in_vllm_as_in_headstart(tmp_path):
    cfg = BackboneConfig(name="tiny-root", path="tiny", dtype="float32", tiny=TINY)
    backbone = load_backbone(cfg)
    prompts = [backbone.tokenizer(text)["input_ids"] for text in TEXTS]
    heads = fitted_root_heads(backbone, prompts)
    drafter_dir = save_drafter(tmp_path / "run" / "drafter", heads, "medusa", heads.cfg, cfg, backbone)
    meta = read_meta(drafter_dir)
    target = tmp_path / "target"
    backbone.model.save_pretrained(target)
    backbone.tokenizer.save_pretrained(target)
    (lay,) = [lay for lay in export_layouts(drafter_dir, meta, tmp_path / "export") if lay.required]

    loaded = LoadedDrafter(*load_drafter(drafter_dir, backbone, meta), drafter_dir)
    chain, _ = chain_options("medusa", K, loaded.drafter)
    ours, _ = greedy_tau(build_decoder("medusa", backbone, loaded, **chain), prompts, NEW)
    blind = build_drafter("medusa", heads.cfg, backbone)  # the same heads, their root projection zeroed
    blind.load_state_dict(heads.state_dict())
    torch.nn.init.zeros_(blind.root_proj.weight)
    ours_blind, _ = greedy_tau(build_decoder("medusa", backbone, drafter=blind, **chain), prompts, NEW)

    spec = engine_spec(
        target, dtype="float32", max_model_len=256, eager_default=True, skip_tokenizer_init=True
    )
    plain, _ = served(spec, prompts, tmp_path / "plain.log")
    medusa = {"method": "medusa", "model": str(lay.folder), "num_speculative_tokens": K}
    alone, theirs = served(
        spec | {"speculative_config": medusa} | engine_args("medusa", lay.folder),
        prompts,
        tmp_path / "alone.log",
    )
    print(
        f"root heads, chain of {K}: tau vLLM {theirs:.3f}, headstart {ours:.3f} (root zeroed: {ours_blind:.3f})"
    )
    assert alone == plain, "vLLM with the root heads diverged from its own plain greedy output"
    assert 0.95 <= theirs / ours <= 1.05 and abs(theirs - ours) < abs(theirs - ours_blind), (
        theirs,
        ours,
        ours_blind,
    )

    rule = {"min_match": 1, "k": K, "lookup_tokens": 3}
    hybrid, theirs = served(spec | hybrid_spec("medusa", lay, rule), prompts, tmp_path / "hybrid.log")
    decoder = build_decoder("medusa", backbone, loaded, **chain, **lookup_options(rule))
    ours, _ = greedy_tau(decoder, prompts, NEW)
    print(f"root heads behind the lookup chain: tau vLLM {theirs:.3f}, headstart {ours:.3f}")
    assert hybrid == plain, "vLLM with the root heads' hybrid diverged from its own plain greedy output"
    assert 0.95 <= theirs / ours <= 1.05, (theirs, ours)
