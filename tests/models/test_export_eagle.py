"""EAGLE exports: the names, shapes and config keys engines read, the aux-layer id convention of each engine,
and a round trip (export -> read back -> identical draft logits)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.export.eagle import read_layout, to_layout, write_layout

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
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [
            1,
            1,
            1,
        ]  # vLLM reads this one first: input of layer i
        assert cfg["num_hidden_layers"] == 1 and cfg["vocab_size"] == 259
    else:
        assert cfg["speculators_model_type"] == "eagle3" and cfg["norm_before_residual"] is False
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 1, 1]  # vLLM: input of layer i
        assert cfg["speculators_config"]["verifier"]["name_or_path"] == "tiny-base"
        assert cfg["transformer_layer_config"]["hidden_size"] == h and cfg["draft_vocab_size"] == 64
    back = read_layout(tmp_path, backbone).eval()
    assert back.aux_layers == d.aux_layers
    torch.testing.assert_close(_logits(back, backbone), _logits(d, backbone))


@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
def test_eagle3_full_vocabulary_has_no_map(backbone, tmp_path, layout):
    """draft_vocab_size >= V (clamped to V): vLLM builds no draft_id_to_target_id and refuses a d2t tensor."""
    d = _perturbed(
        build_drafter("eagle3", Eagle3Config(aux_layers=[1, 1, 1], draft_vocab_size=10_000), backbone)
    )
    write_layout(d, layout, tmp_path, "tiny-base", ["LlamaForCausalLM"])
    t = load_file(tmp_path / "model.safetensors")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert "d2t" not in t and "t2d" not in t and cfg["draft_vocab_size"] == 259
    back = read_layout(tmp_path, backbone).eval()
    assert back.t2d.all() and not back.d2t.any()
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


def test_eagle1_vllm_layout_folds_fc_bias_exactly(backbone, tmp_path):
    d = _perturbed(build_drafter("eagle", EagleConfig(), backbone))
    write_layout(d, "eagle_vllm", tmp_path, "tiny-base", ["LlamaForCausalLM"])
    t = load_file(tmp_path / "model.safetensors")
    cfg = json.loads((tmp_path / "config.json").read_text())
    attn = {f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"}
    assert set(t) == {"fc.weight"} | {"layers.0." + n for n in LAYER} | attn  # vLLM's fc has no bias
    assert cfg["bias"] is True  # vLLM builds the q/k/v/o biases for it
    torch.testing.assert_close(t["layers.0.self_attn.o_proj.bias"], d.fc.bias.detach())
    # vLLM's computation: fc without bias, then the layer with the folded biases == ours with fc.bias
    layer, ids = d.layer, torch.tensor([[5, 9, 33, 70]])
    final, _ = backbone(ids)
    emb = backbone.embed_tokens(ids)
    x = torch.cat([emb, final], -1) @ t["fc.weight"].T  # (1, T, H)
    q = x @ t["layers.0.self_attn.q_proj.weight"].T + t["layers.0.self_attn.q_proj.bias"]
    torch.testing.assert_close(q, layer.self_attn.q_proj(d.fc(torch.cat([emb, final], -1))))
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


def test_rope_scaling_is_carried_into_the_draft_layer_and_export(tmp_path):
    """A llama3-scaled RoPE backbone: the draft layer rotates exactly like the backbone, the export says so,
    and an export whose RoPE disagrees with the backbone it is loaded onto is refused, naming the key."""
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    bb = load_backbone(
        BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, "rope_parameters": rope})
    )
    d = build_drafter("eagle3", Eagle3Config(draft_vocab_size=64), bb)
    torch.testing.assert_close(d.rotary.inv_freq, bb.model.model.rotary_emb.inv_freq, rtol=0, atol=0)
    config, tensors = to_layout(d, "eagle3", "tiny", ["LlamaForCausalLM"])
    assert config["rope_theta"] == 500000.0 and config["rope_scaling"]["rope_type"] == "llama3"
    folder = tmp_path / "eagle3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    torch.testing.assert_close(read_layout(folder, bb).rotary.inv_freq, d.rotary.inv_freq)
    plain = load_backbone(BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0}))
    with pytest.raises(ValueError, match="rope_theta=500000.0 but the backbone gives"):
        read_layout(folder, plain)


def test_legacy_rope_attributes_are_read_and_missing_ones_refused():
    from types import SimpleNamespace

    from headstart.models.eagle_config import rope_of

    legacy = SimpleNamespace(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 2.0})
    assert rope_of(legacy) == {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    with pytest.raises(ValueError, match="neither rope_parameters nor rope_theta"):
        rope_of(SimpleNamespace())
