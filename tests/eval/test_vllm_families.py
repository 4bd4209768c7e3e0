"""The architecture matrix served in vLLM (slow; skipped without `./launch.sh vllm-setup`): for each tiny family
(models/families.py), Medusa heads trained a few steps on it (the matrix's recipe) are exported as the `vllm/`
layout, vLLM loads the family's HF folder and the heads, and then

- vLLM's greedy output with the heads equals its own plain greedy output (fp32: no near-ties), and
- vLLM accepts the heads' drafts as headstart's decoder does on the same chain and prompts: an export that
  loads but is read differently (speculators #796: a drafter config of another family) still drafts, only
  badly, so equal acceptance is the check that it was read right.

A family vLLM cannot serve fails here with vLLM's own reason, in the log the error names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from headstart.eval.bench.chain_tau import greedy_tau
from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.proposers import chain_options
from headstart.eval.serving.check import engine_args
from headstart.eval.serving.counters import position_rates, spec_counters
from headstart.eval.serving.counters import tau as vllm_tau
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import LoadedDrafter, load_drafter, read_meta
from headstart.models.export import export
from headstart.models.families import TINY_FAMILIES
from headstart.vllm_runner import VllmEngine, engine_spec, is_set_up

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_family_matrix import TEXTS, train_tiny  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not is_set_up(), reason="vLLM not set up (./launch.sh vllm-setup)"),
]
K, NEW = 2, 24
SERVABLE = {
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}  # vLLM's CPU attention: head_dim >= 32


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_family_heads_serve_in_vllm_as_in_headstart(tmp_path, family):
    drafter_dir = train_tiny(tmp_path, family, "medusa", SERVABLE)
    meta = read_meta(drafter_dir)
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": "float32"}))
    target = tmp_path / "target"  # the family's HF folder, as a user's model would be
    backbone.model.save_pretrained(target)
    backbone.tokenizer.save_pretrained(target)
    (heads,) = export(drafter_dir, tmp_path / "export", layouts=["vllm"])
    prompts = [backbone.tokenizer(text)["input_ids"] for text in TEXTS]

    spec = engine_spec(
        target, dtype="float32", max_model_len=256, eager_default=True, skip_tokenizer_init=True
    )
    with VllmEngine(spec, tmp_path / "plain.log") as engine:
        plain = [o["token_ids"] for o in engine.generate(prompts, NEW)["outputs"]]
    medusa = {"method": "medusa", "model": str(heads), "num_speculative_tokens": K}
    with VllmEngine(
        spec | {"speculative_config": medusa} | engine_args("medusa", heads), tmp_path / "spec.log"
    ) as e:
        served = [o["token_ids"] for o in e.generate(prompts, NEW)["outputs"]]
        counters = spec_counters(e.metrics())
    assert served == plain, f"{family}: vLLM with the heads diverged from its own plain greedy output"
    assert counters["drafts"] > 0, f"{family}: vLLM loaded the heads but never drafted"

    loaded = LoadedDrafter(*load_drafter(drafter_dir, backbone, meta), drafter_dir)
    chain, _ = chain_options("medusa", K, loaded.drafter)
    _, ours = greedy_tau(build_decoder("medusa", backbone, loaded, **chain), prompts, NEW)
    theirs = position_rates(counters)
    print(f"{family}: position-1 acceptance vLLM {theirs[0]:.3f}, headstart {ours[0] if ours else 0.0:.3f}")
    assert abs(theirs[0] - (ours[0] if ours else 0.0)) <= 0.1, (family, theirs, ours)


@pytest.mark.parametrize(
    "method, rule",
    [
        ("eagle3", {"min_match": 1, "k": 1, "lookup_tokens": 3}),
        ("eagle3", {"min_match": 1, "k": 1, "lookup_tokens": 2, "max_tokens": 8}),
        ("medusa", {"min_match": 1, "k": 1, "lookup_tokens": 2, "max_tokens": 8}),
        ("eagle3", {"source": "suffix", "min_score": 0.0, "k": 1, "lookup_tokens": 8}),
        ("medusa", {"source": "suffix", "min_score": 1.0, "k": 1, "lookup_tokens": 8}),
    ],
    ids=["eagle3-fixed", "eagle3-growing", "medusa-growing-past-its-heads", "eagle3-suffix", "medusa-suffix"],
)
def test_a_drafter_with_the_lookup_chain_serves_as_in_headstart(tmp_path, method, rule):
    """headstart's plugin with an EAGLE-3 drafter (a KV cache that follows every step; the plugin runs its
    further passes only as far as the step needs them) or Medusa heads (built as the checkpoint ships them, fewer
    than the 8 tokens a growing lookup chain may verify): vLLM stays lossless (fp32 greedy == its plain greedy)
    and accepts as headstart's decoder running the same rule (a chain of 1 behind a lookup chain of 3, or of 2
    growing with its match up to 8: num_speculative_tokens 8; or suffix decoding's drafts of up to 8, whose trees
    hold earlier replies: the prompts go one at a time, as headstart's decoder runs them)."""
    from headstart.eval.serving.check import export_layouts, hybrid_spec
    from headstart.models.decoding import lookup_options, plugin_serving

    if rule.get("source") == "suffix":
        pytest.importorskip("arctic_inference.suffix_decoding", reason="./launch.sh suffix-setup builds it")

    # 8 layers: three distinct fused layers (2, 4, 5); vLLM captures each layer once, so the 2-layer model's
    # (1, 1, 1) reach its drafter as one
    drafter_dir = train_tiny(tmp_path, "llama", method, SERVABLE | {"num_hidden_layers": 8})
    meta = read_meta(drafter_dir)
    if method == "medusa":
        assert meta["method_config"]["num_heads"] < plugin_serving(rule)[0]  # the chain vLLM verifies
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": "float32"}))
    target = tmp_path / "target"
    backbone.model.save_pretrained(target)
    backbone.tokenizer.save_pretrained(target)
    prompts = [backbone.tokenizer(text)["input_ids"] for text in TEXTS]
    lay = next(lay for lay in export_layouts(drafter_dir, meta, tmp_path / "export") if lay.required)

    spec = engine_spec(
        target, dtype="float32", max_model_len=256, eager_default=True, skip_tokenizer_init=True
    )
    with VllmEngine(spec, tmp_path / "plain.log") as engine:
        plain = [o["token_ids"] for o in engine.generate(prompts, NEW)["outputs"]]
    with VllmEngine(spec | hybrid_spec(method, lay, rule), tmp_path / "hybrid.log") as e:
        served = [e.generate([p], NEW)["outputs"][0]["token_ids"] for p in prompts]
        counters = spec_counters(e.metrics())
    assert "headstart lookup hybrid on" in (tmp_path / "hybrid.log").read_text()
    assert served == plain, f"vLLM with the {method} hybrid diverged from its own plain greedy output"

    loaded = LoadedDrafter(*load_drafter(drafter_dir, backbone, meta), drafter_dir)
    chain, _ = chain_options(method, rule["k"], loaded.drafter)
    decoder = build_decoder(method, backbone, loaded, **chain, **lookup_options(rule))
    tau, _ = greedy_tau(decoder, prompts, NEW)
    # tokens per forward, as headstart's (counters.tau: the tokens each request emitted after its prefill)
    theirs = vllm_tau(counters | {"emitted": sum(max(len(out) - 1, 0) for out in served)})
    print(f"{method} hybrid: tau vLLM {theirs:.3f}, headstart {tau:.3f}")
    # a lookup searched in a stale context (the row before the step's tokens) cost vLLM 8.5% of tau here
    assert 0.95 <= theirs / tau <= 1.05, (theirs, tau, counters)


def test_the_probe_prices_an_eagle3_drafters_first_pass_apart(tmp_path):
    """eval/serving/vllm_costs.py with an EAGLE-3 drafter (a KV cache: a first pass every step): a second
    drafter engine at k = 1 prices that pass; both parts come back, in plain steps, beside the widths' costs."""
    from headstart.eval.serving.check import export_layouts, layout_spec
    from headstart.eval.serving.vllm_costs import measure_in_vllm

    drafter_dir = train_tiny(tmp_path, "llama", "eagle3", SERVABLE | {"num_hidden_layers": 8})
    meta = read_meta(drafter_dir)
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": "float32"}))
    target = tmp_path / "target"
    backbone.model.save_pretrained(target)
    backbone.tokenizer.save_pretrained(target)
    lay = next(lay for lay in export_layouts(drafter_dir, meta, tmp_path / "export") if lay.required)
    prompt = backbone.tokenizer(TEXTS[0])["input_ids"]
    timed = measure_in_vllm(
        str(target), prompt, 4, "float32", reps=1, eager=True, drafter=layout_spec("eagle3", lay, 2),
        keeps_cache=True,
    )  # fmt: skip
    price = timed["drafter"]
    assert (price["k"], price["method"]) == (2, "eagle3") and set(price["ms"]) == {"drafter", "drafter1"}
    assert price["every"] >= 0.0 and price["step"] >= 0.0 and price["every"] + price["step"] < 5
