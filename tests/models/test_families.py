"""What the families need, piece by piece: the sliding-window part of a tree mask on a hand-worked case, Gemma-2's
final soft cap in `Backbone.logits` (== HF's forward) and in the EAGLE and DistillSpec targets, and the one-line
refusals at load."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig

from headstart.eval.engine.masks import WindowMasks
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.distill import DistillConfig, distill_loss, divergence
from headstart.models.eagle_ttt import teacher_targets
from headstart.models.families import (
    FULL,
    SLIDING,
    FamilyError,
    check_backbone,
    layer_windows,
    softcap,
    tiny_config,
)


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


def test_eagle_targets_go_through_the_soft_cap():
    """Logits [100, 0] capped at 30: 30 tanh(10/3) = 29.92, so the second token keeps e^-29.92 of the mass
    (e^-100 without the cap)."""
    target, weight = torch.tensor([[1.0]]), torch.tensor([[100.0], [0.0]])
    probs, top = teacher_targets(target, weight, chunk=4, dtype=torch.float64, cap=30.0)
    assert top.tolist() == [0]
    assert probs[0, 1].item() == pytest.approx(1 / (1 + math.exp(30 * math.tanh(10 / 3))), rel=1e-6)
    uncapped, _ = teacher_targets(target, weight, chunk=4, dtype=torch.float64)
    assert uncapped[0, 1].item() == pytest.approx(math.exp(-100), rel=1e-6)


def test_distill_loss_with_caps_equals_the_unchunked_capped_divergence():
    """The chunked loss (and its gradients) == the divergence of the capped logits computed directly."""
    g = torch.Generator().manual_seed(0)
    h_s = (torch.randn(5, 8, generator=g) * 3).requires_grad_(True)
    h_t = torch.randn(5, 8, generator=g) * 3
    student, teacher = torch.nn.Linear(8, 11, bias=False), torch.nn.Linear(8, 11, bias=False)
    with torch.no_grad():
        student.weight.mul_(20)
        teacher.weight.mul_(20)  # logits past the caps, so capping matters
    cfg = DistillConfig(loss_chunk=2)
    loss, _, _ = distill_loss(h_s, student, h_t, teacher, cfg, caps=(5.0, 7.0))
    (grad,) = torch.autograd.grad(loss, h_s)
    h2 = h_s.detach().clone().requires_grad_(True)
    want = divergence(softcap(student(h2), 5.0), softcap(teacher(h_t), 7.0), cfg).sum()
    want.backward()
    torch.testing.assert_close(loss, want.float())
    torch.testing.assert_close(grad, h2.grad)
    uncapped, _, _ = distill_loss(h_s, student, h_t, teacher, cfg)
    assert abs(uncapped.item() - loss.item()) > 1e-3


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3", "phi3"])
def test_fixed_shape_path_applies_the_windows(family):
    """The path CUDA graphs replay (static buffers, the whole cache attended, write slots as a tensor), run
    eagerly on CPU, on windowed families: the window is computed from the slot tensor, not from `length`."""
    from headstart.eval.engine.decoder import Decoder
    from headstart.eval.engine.proposers.medusa import MedusaOptions
    from headstart.models.checkpoint import build_drafter
    from headstart.models.medusa import MedusaConfig

    bb = tiny(family, initializer_range=0.1)
    heads = build_drafter("medusa", MedusaConfig(num_heads=3), bb)
    # a short cache: the fixed-shape path attends over all of it at every step
    vanilla, dec = Decoder(bb, max_cache_len=64), Decoder(bb, MedusaOptions(heads), max_cache_len=64)
    vanilla.runner.cuda_graphs = dec.runner.cuda_graphs = True
    for text in ("the cat sat on the mat. the cat sat on the", "abc abc abc abc abc"):
        prompt = bb.tokenizer(text)["input_ids"]
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(16):
                ids.append(int(bb.model(torch.tensor([ids])).logits[0, -1].argmax()))
        ref = ids[len(prompt) :]
        assert vanilla.generate(prompt, 16, eos_token_ids=[]).tokens == ref
        assert dec.generate(prompt, 16, eos_token_ids=[]).tokens == ref
    assert dec.runner._graphs  # the fixed-shape path really ran
