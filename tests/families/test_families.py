"""What the families need, piece by piece: the sliding-window part of a tree mask on a hand-worked case, Gemma-2's
final soft cap in `Backbone.logits` (== HF's forward), and the one-line refusals at load."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from headstart.eval.engine.masks import WindowMasks
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.families import FULL, SLIDING, FamilyError, check_backbone, layer_windows, tiny_config


def tiny(family: str, **kw):
    attn = "eager" if family == "gemma2" else "sdpa"
    return load_backbone(
        BackboneConfig(name=family, path="tiny", attn_implementation=attn, tiny={"family": family, **kw})
    )


def test_window_hides_keys_out_of_each_querys_window():
    """Window 3, prefix of 4 committed slots (positions 0..3), then a tree written at slots 4..6: a root at
    position 4 and two children at position 5. Query at p sees key k iff k > p - 3 (HF's overlay), besides the
    tree's own ancestor pattern."""
    config = tiny_config("mistral", 259, sliding_window=3)
    neg = torch.finfo(torch.float32).min
    tree = torch.tensor([[0, neg, neg], [0, 0, neg], [0, neg, 0]])  # root; child 1; child 2 (not 1's)
    mask = torch.cat([torch.zeros(3, 4), tree], dim=1)[None, None]  # (1, 1, 3, 7)
    out = WindowMasks(config)(mask, torch.tensor([4, 5, 5]), torch.tensor([4, 5, 6]))
    seen = (out[0, 0] == 0).int().tolist()
    assert seen == [
        [0, 0, 1, 1, 1, 0, 0],  # position 4 sees 2, 3, itself
        [0, 0, 0, 1, 1, 1, 0],  # position 5 sees 3, its parent (4), itself
        [0, 0, 0, 1, 1, 0, 1],
    ]


def test_mixed_layers_get_a_mask_per_type_and_full_models_the_mask_itself():
    gemma = tiny_config("gemma3", 259)
    assert layer_windows(gemma) == [8, None]
    mask = torch.zeros(1, 1, 2, 20)
    mask[0, 0, 0, 19] = torch.finfo(torch.float32).min  # a chain: the first query does not see the second
    out = WindowMasks(gemma)(mask, torch.tensor([18, 19]), torch.tensor([18, 19]))
    assert set(out) == {FULL, SLIDING} and out[FULL] is mask
    assert (out[SLIDING][0, 0] == 0).sum(-1).tolist() == [8, 8]  # 11..18 and 12..19
    llama = tiny_config("qwen2", 259)
    assert layer_windows(llama) == [None, None] and WindowMasks(llama)(mask, None, None) is mask


def test_gemma2_logits_apply_the_final_soft_cap():
    bb = tiny("gemma2", initializer_range=2.0)  # large weights: logits well past the cap of 30
    ids = torch.tensor([[5, 9, 33, 70, 101, 7]])
    with torch.no_grad():
        hidden, _ = bb(ids)
        want = bb.model(ids).logits
        raw = bb.lm_head(hidden)
    assert raw.abs().max() > 30 and want.abs().max() <= 30
    torch.testing.assert_close(bb.logits(hidden), want)
    assert tiny("llama").final_softcap is None


def test_attention_soft_cap_needs_eager_in_one_line():
    with pytest.raises(FamilyError, match="attn_implementation=eager") as err:
        load_backbone(BackboneConfig(name="g", path="tiny", tiny={"family": "gemma2"}))
    assert "\n" not in str(err.value)


def test_linear_attention_layers_refused_at_load():
    config = LlamaConfig(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    with pytest.raises(FamilyError, match=r"\['linear_attention'\] layers.*Fix"):
        check_backbone(config, "sdpa")


def test_unknown_tiny_family_names_the_choices():
    with pytest.raises(FamilyError, match="one of .*gemma2"):
        tiny_config("falcon", 259)
