"""EAGLE exports: the names, shapes and config keys engines read, the aux-layer id convention of each engine,
and a round trip (export -> read back -> identical draft logits)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.export_eagle import read_layout, write_layout

LAYER = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
]


def _logits(d, backbone):
    ids = torch.tensor([[5, 9, 33, 70, 101, 7]])
    final, aux = backbone(ids, layers=d.aux_layers)
    g = d.fuse(aux if d.v3 else [final])
    pos = torch.arange(6)[None]
    return d.logits(d.body(g, ids, pos))


def _perturbed(d):
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return d.eval()


@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
def test_eagle3_layouts(backbone, tmp_path, layout):
    d = build_drafter("eagle3", Eagle3Config(aux_layers=[1, 1, 1], draft_vocab_size=64), backbone)
    d.set_vocab_map(
        torch.arange(64) * 2, torch.zeros(259, dtype=torch.bool).index_fill_(0, torch.arange(64) * 3, True)
    )
    d = _perturbed(d)
    write_layout(d, layout, tmp_path, "tiny-base", ["LlamaForCausalLM"])
    t = load_file(tmp_path / "model.safetensors")
    cfg = json.loads((tmp_path / "config.json").read_text())
    pre = "midlayer." if layout == "eagle3" else "layers.0."
    h = backbone.hidden_size
    expected = (
        {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
        | {pre + n for n in LAYER}
        | {pre + "input_layernorm.weight", pre + "hidden_norm.weight"}
    )
    assert set(t) == expected
    assert t["fc.weight"].shape == (h, 3 * h) and t[pre + "self_attn.q_proj.weight"].shape[1] == 2 * h
    assert (
        t["lm_head.weight"].shape == (64, h)
        and t["d2t"].dtype == torch.int64
        and t["t2d"].dtype == torch.bool
    )
    assert t["t2d"].shape == (259,)
    if layout == "eagle3":
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 64
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
            0,
            0,
            0,
        ]  # SGLang: output of layer j
        assert cfg["num_hidden_layers"] == 1 and cfg["vocab_size"] == 259
    else:
        assert cfg["speculators_model_type"] == "eagle3" and cfg["norm_before_residual"] is False
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 1, 1]  # vLLM: input of layer i
        assert cfg["speculators_config"]["verifier"]["name_or_path"] == "tiny-base"
        assert cfg["transformer_layer_config"]["hidden_size"] == h and cfg["draft_vocab_size"] == 64
    back = read_layout(tmp_path, backbone).eval()
    assert back.aux_layers == d.aux_layers
    torch.testing.assert_close(_logits(back, backbone), _logits(d, backbone))


def test_eagle1_layout(backbone, tmp_path):
    d = _perturbed(build_drafter("eagle", EagleConfig(), backbone))
    write_layout(d, "eagle", tmp_path, "tiny-base", ["LlamaForCausalLM"])
    t = load_file(tmp_path / "model.safetensors")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert set(t) == {"fc.weight", "fc.bias"} | {"layers.0." + n for n in LAYER}  # no layer-0 input norm
    assert t["fc.weight"].shape == (backbone.hidden_size, 2 * backbone.hidden_size)
    assert (
        cfg["architectures"] == ["LlamaForCausalLM"] and cfg["bias"] is True and cfg["num_hidden_layers"] == 1
    )
    torch.testing.assert_close(
        _logits(read_layout(tmp_path, backbone).eval(), backbone), _logits(d, backbone)
    )


def test_aux_layer_zero_cannot_go_to_sglang(backbone, tmp_path):
    d = build_drafter("eagle3", Eagle3Config(aux_layers=[0, 1, 1], draft_vocab_size=64), backbone)
    with pytest.raises(ValueError, match="output of layer"):
        write_layout(d, "eagle3", tmp_path, "x", [])
    write_layout(d, "speculators", tmp_path, "x", [])  # vLLM can capture the input of layer 0
    with pytest.raises(ValueError, match="cannot be written"):
        write_layout(d, "eagle", tmp_path, "x", [])
