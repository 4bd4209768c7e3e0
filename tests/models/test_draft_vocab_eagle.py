"""EAGLE-1 over a truncated draft vocabulary: logits equal the full drafter's at the kept ids, the teacher's
full-vocabulary argmax outside the map counts as a held-out miss, the token_map through the checkpoint, the
vLLM/EAGLE exports written over the full vocabulary, lossless greedy decoding, and the default unchanged."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.eagle import EagleOptions
from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, load_drafter, save_drafter
from headstart.models.eagle_config import EagleConfig
from headstart.models.export.eagle import read_layout, write_layout

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = BackboneConfig(name="tiny", path="tiny", dtype="float32")


def truncated(backbone, dv=60, lo=40):
    d = build_drafter("eagle", EagleConfig(noise=0.0, draft_vocab_size=dv), backbone)
    stats = d.init_from_data([{"labels": torch.arange(lo, lo + dv).repeat(2)}])
    assert stats["draft_vocab_coverage"] == 1.0 and d.token_map.tolist() == list(range(lo, lo + dv))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return d.eval()


def full_twin(backbone, d):
    full = build_drafter("eagle", EagleConfig(noise=0.0), backbone)
    full.load_state_dict({k: v for k, v in d.state_dict().items() if k != "token_map"})
    return full.eval()


def hidden_of(d, backbone, ids):
    final, _ = backbone(ids)
    return d.body(d.fuse([final]), ids, torch.arange(ids.shape[1])[None])


def test_logits_and_drafts_over_the_kept_ids(backbone):
    d = truncated(backbone)
    full = full_twin(backbone, d)
    ids = torch.tensor([[5, 9, 33, 70, 101, 7]])
    h = hidden_of(d, backbone, ids)
    logits, ref = d.logits(h), full.logits(h)  # (1, T, V); -inf outside the map
    torch.testing.assert_close(logits[..., d.token_map], ref[..., d.token_map])
    assert torch.isinf(logits[..., :40]).all() and torch.isinf(logits[..., 100:]).all()
    _, top = d.top_draft(h, 5)  # target ids
    assert ((top >= 40) & (top < 100)).all()
    assert not backbone.lm_head.weight.requires_grad and "token_map" in d.state_dict()
    assert not any(k.startswith(("_rows", "lm_head")) for k in d.state_dict())


def test_held_out_accuracy_counts_out_of_vocab_teacher_argmax_as_misses(backbone):
    d = truncated(backbone, dv=30, lo=3)
    ids = torch.randint(3, 259, (2, 16))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    final, _ = backbone(ids)
    _, count, m = d([final], final, batch)
    n, oov, hits = int(m["head0/n"]), int(m["head0/oov"]), int(m["head0/rank_hist"][0])
    greedy = backbone.lm_head(final).argmax(-1)[:, 1:-1]  # teacher argmax at the trained positions
    assert n == count and oov == int(((greedy < 3) | (greedy >= 33)).sum()) and oov > 0
    assert hits <= n - oov  # an out-of-vocabulary argmax is never a hit
    d.train()
    _, _, m_train = d([final], final, batch)
    assert "head0/oov" not in m_train  # training steps: top-1 within the draft vocabulary (no full pass)


def test_token_map_round_trips_and_exports_full_vocab(backbone, tmp_path):
    d = truncated(backbone)
    save_drafter(tmp_path / "ck", d, "eagle", d.cfg, TINY, backbone)
    back, _ = load_drafter(tmp_path / "ck", backbone)
    assert torch.equal(back.token_map, d.token_map)
    ids = torch.tensor([[5, 9, 33, 70, 101, 7]])
    torch.testing.assert_close(
        back.logits(hidden_of(back, backbone, ids)), d.logits(hidden_of(d, backbone, ids))
    )
    for layout in ("eagle", "eagle_vllm"):
        write_layout(d, layout, tmp_path / layout, "tiny-base", ["LlamaForCausalLM"])
        assert "token_map" not in load_file(tmp_path / layout / "model.safetensors")  # no loader reads it
        served = read_layout(tmp_path / layout, backbone)  # what vLLM / SGLang serve: the full vocabulary
        assert not served.truncated
        h = hidden_of(d, backbone, ids)
        ref = d.logits(h)[..., d.token_map]
        torch.testing.assert_close(served.logits(h)[..., d.token_map], ref, rtol=1e-5, atol=1e-5)


def test_greedy_speculative_equals_vanilla(backbone):
    d = truncated(backbone, dv=120, lo=3)
    vanilla = Decoder(backbone, "vanilla", max_cache_len=256)
    prompt = list(range(40, 60))
    ref = vanilla.generate(prompt, 32).tokens
    for kw in ({"tree_nodes": 12}, {"tree_nodes": 3, "num_draft_tokens": 3, "topk": 1}):
        assert Decoder(backbone, EagleOptions(d, **kw), max_cache_len=256).generate(prompt, 32).tokens == ref


def test_default_is_unchanged(backbone):
    d = build_drafter("eagle", EagleConfig(), backbone)
    big = build_drafter("eagle", EagleConfig(draft_vocab_size=backbone.vocab_size), backbone)
    assert not d.truncated and not big.truncated and d.init_from_data([{"labels": torch.arange(5)}]) == {}
    assert "token_map" not in d.state_dict() and list(d.state_dict()) == list(big.state_dict())
    assert d.head_weight() is backbone.lm_head.weight
