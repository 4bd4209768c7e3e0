"""Weight-only int8 drafter layers (models/int8.py): the projection matches nn.Linear to int8 rounding, only
shapes the kernel takes are replaced, the modes refuse what they cannot do, and drafters quantized for decoding
keep decoding lossless."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers import proposer_config
from headstart.models import int8
from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.int8 import (
    Int8Linear,
    for_decoding,
    for_draft_model,
    int8_pays,
    quantize_linears,
    weights_of,
)
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_projection_matches_the_linear_to_int8_rounding(dtype, bias):
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=bias).to(dtype)
    q = Int8Linear(lin)
    x = torch.randn(2, 5, 96, dtype=dtype)
    ref = lin(x).float()
    y = q(x)
    assert y.shape == (2, 5, 40) and y.dtype == dtype
    err = (y.float() - ref).abs().max() / ref.abs().max()
    assert err < (0.02 if dtype == torch.bfloat16 else 0.01)
    assert q(x[:, :0]).shape == (2, 0, 40)  # no rows, no kernel call
    assert q.weight_int8.dtype == torch.int8 and q.weight_int8.abs().max() == 127  # each row uses the range
    torch.testing.assert_close(q.weight.float(), lin.weight.float(), atol=float(q.scale.max()), rtol=0)


def test_only_linears_the_kernel_takes_are_replaced():
    m = nn.Sequential(nn.Linear(64, 8), nn.Sequential(nn.Linear(100, 64), nn.Linear(32, 3)), nn.LayerNorm(64))
    assert quantize_linears(m) == 2  # in_features 100 is not a multiple of 32: left as trained
    assert isinstance(m[0], Int8Linear) and isinstance(m[1][1], Int8Linear)
    assert type(m[1][0]) is nn.Linear and type(m[2]) is nn.LayerNorm
    m = nn.Sequential(nn.Linear(64, 8), nn.Linear(64, 8))
    assert quantize_linears(m, within=[m[1]]) == 1 and type(m[0]) is nn.Linear  # a named linear itself


@pytest.fixture
def int8_faster(monkeypatch):
    """auto's timing says int8 pays (as on a CPU with native bf16)."""
    monkeypatch.setattr(int8, "time_projection", lambda linear: (1.0, 0.5))


def test_modes(backbone, int8_faster):
    d = build_drafter("eagle3", Eagle3Config(draft_vocab_size=259), backbone)
    assert for_decoding(d, "cpu", "native") == "native" and weights_of(d) == "native"
    assert for_decoding(d, "cuda", "auto") == "native"  # a GPU keeps the trained weights
    with pytest.raises(ValueError, match="draft_weights=int8 on cuda.*Fix: draft_weights=auto"):
        for_decoding(d, "cuda", "int8")
    with pytest.raises(ValueError, match="draft_weights='fp4'"):
        for_decoding(d, "cpu", "fp4")
    assert for_decoding(d, "cpu", "auto") == "int8"
    assert isinstance(d.fc, Int8Linear) and isinstance(d.layer.mlp.down_proj, Int8Linear)
    medusa = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)  # measured no gain: as trained
    assert for_decoding(medusa, "cpu", "auto") == "native"
    with pytest.raises(ValueError, match="MedusaHeads has no layers served in int8. Fix: draft_weights=auto"):
        for_decoding(medusa, "cpu", "int8")


def test_auto_keeps_the_trained_weights_where_int8_is_slower(backbone, monkeypatch, caplog):
    """As on an AVX2-only CPU computing float32, where the int8 kernel took 3-11x the time."""
    calls = []
    monkeypatch.setattr(int8, "time_projection", lambda linear: calls.append(linear) or (1.0, 3.0))
    d = build_drafter("eagle3", Eagle3Config(draft_vocab_size=259), backbone)
    with caplog.at_level("INFO", logger="headstart.eval"):
        assert for_decoding(d, "cpu", "auto") == "native" and weights_of(d) == "native"
    layers = [m for t in d.int8_modules() for m in t.modules() if type(m) is nn.Linear]
    assert calls == [d.lm_head] and all(m.weight.numel() <= d.lm_head.weight.numel() for m in layers)
    assert (
        "draft_weights=auto: native (one row through the 259 x" in caplog.text and "int8 3.00x" in caplog.text
    )
    assert for_decoding(d, "cpu", "int8") == "int8"  # asked for explicitly: quantized all the same
    pays, why = int8_pays([])
    assert not pays and why == "no layer the kernel takes"


def test_the_timing_is_real():
    lin = nn.Linear(64, 128)
    native, quantized = int8.time_projection(lin)
    assert 0 < native < 1 and 0 < quantized < 1
    pays, why = int8_pays([nn.Linear(64, 8), lin])
    assert isinstance(pays, bool) and why.startswith("one row through the 128 x 64 layer: int8 ")


def _perturbed(drafter):
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return drafter.eval()


EAGLE = {"eagle": EagleConfig(noise=0.0), "eagle3": Eagle3Config(draft_vocab_size=259, ttt_steps=2)}


@pytest.mark.parametrize("method", list(EAGLE))
def test_int8_drafters_decode_losslessly(backbone, method):
    torch.manual_seed(0)
    d = _perturbed(build_drafter(method, EAGLE[method], backbone))
    prompt = list(range(40, 60))
    ref = Decoder(backbone, "vanilla", max_cache_len=256).generate(prompt, 32).tokens
    opts = {"tree_nodes": 12, "num_draft_tokens": 3}
    native = Decoder(backbone, proposer_config(method, drafter=d, **opts), max_cache_len=256).generate(
        prompt, 32
    )
    assert for_decoding(d, "cpu", "int8") == "int8"
    out = Decoder(backbone, proposer_config(method, drafter=d, **opts), max_cache_len=256).generate(
        prompt, 32
    )
    assert out.tokens == native.tokens == ref
    assert isinstance(d.fc, Int8Linear) and isinstance(d.layer.self_attn.q_proj, Int8Linear)
    if d.v3:  # EAGLE-3's own draft head; EAGLE-1 projects with the frozen lm_head's rows
        assert isinstance(d.lm_head, Int8Linear)


def test_an_int8_draft_model_decodes_losslessly(backbone, int8_faster):
    """A DistillSpec draft LM: every projection in int8, the tied lm_head as its own int8 copy, the input
    embedding as trained; the backbone's dtype, device and vocabulary still read without dequantizing."""
    from headstart.models.backbone import Backbone
    from headstart.models.distill import DistillConfig

    # every target layer kept: natively a copy of the target; in int8 its near-ties can draft other tokens
    d = build_drafter("distillspec", DistillConfig(keep_layers=[0, 1]), backbone).eval()
    prompt = list(range(40, 60))
    ref = Decoder(backbone, "vanilla", max_cache_len=256).generate(prompt, 32).tokens
    served = d.serving(backbone)
    native = Decoder(backbone, proposer_config("draft", num_draft_tokens=3, **served), max_cache_len=256)
    native = native.generate(prompt, 32)
    assert for_decoding(d, "cpu", "auto") == "int8"
    draft = d.draft
    assert isinstance(draft.get_output_embeddings(), Int8Linear)
    assert isinstance(draft.model.layers[0].mlp.down_proj, Int8Linear)
    assert type(draft.get_input_embeddings()) is nn.Embedding
    served = d.serving(backbone)
    bb = served["draft_backbone"]
    assert isinstance(bb, Backbone) and bb.vocab_size == backbone.vocab_size and bb.dtype == backbone.dtype
    out = Decoder(backbone, proposer_config("draft", num_draft_tokens=3, **served), max_cache_len=256)
    out = out.generate(prompt, 32)
    assert out.tokens == native.tokens == ref
    assert native.stats.tau > 3 and out.stats.tau > 3  # int8 rounding leaves the draft's argmaxes nearly all


def test_a_draft_model_named_by_the_user_gets_the_same_choice(backbone, monkeypatch):
    """draft=: an HF causal LM, not a checkpoint's drafter: every projection in int8 where it times faster, its
    input embedding as loaded; still lossless as the draft of its target."""
    import copy

    from headstart.models.backbone import Backbone

    model = copy.deepcopy(backbone.model)
    monkeypatch.setattr(int8, "time_projection", lambda linear: (1.0, 3.0))
    assert for_draft_model(model, "cpu", "auto") == "native" and weights_of(model) == "native"
    assert for_draft_model(model, "cuda", "auto") == "native"
    monkeypatch.setattr(int8, "time_projection", lambda linear: (1.0, 0.5))
    assert for_draft_model(model, "cpu", "auto") == "int8"
    assert isinstance(model.get_output_embeddings(), Int8Linear)
    assert type(model.get_input_embeddings()) is nn.Embedding
    prompt = list(range(40, 60))
    ref = Decoder(backbone, "vanilla", max_cache_len=256).generate(prompt, 32).tokens
    draft = Backbone(model, backbone.tokenizer, name="draft", freeze=False)
    config = proposer_config("draft", num_draft_tokens=3, draft_backbone=draft)
    out = Decoder(backbone, config, max_cache_len=256).generate(prompt, 32)
    assert out.tokens == ref and out.stats.tau > 3  # int8 rounding leaves its own argmaxes nearly all


def test_a_decoding_json_is_reused_only_for_the_weights_it_was_tuned_with(backbone):
    from headstart.eval.tuning.records import conditions, matches
    from headstart.eval.tuning.tuner import VERSION
    from headstart.models.checkpoint import LoadedDrafter

    loaded = LoadedDrafter(build_drafter("eagle3", Eagle3Config(draft_vocab_size=259), backbone), {}, None)
    native = {"version": VERSION, "conditions": conditions(backbone, loaded)}
    older = {**native, "conditions": {k: v for k, v in native["conditions"].items() if k != "draft_weights"}}
    assert native["conditions"]["draft_weights"] == "native" and matches(native, backbone, loaded)
    assert matches(older, backbone, loaded)  # written before the key: measured on the trained weights
    for_decoding(loaded.drafter, "cpu", "int8")
    assert not matches(native, backbone, loaded) and not matches(older, backbone, loaded)
    assert matches({"version": VERSION, "conditions": conditions(backbone, loaded)}, backbone, loaded)
