"""A truncated draft vocabulary (models/draft_vocab.py) for Medusa heads: selection by frequency, logits equal to
the full heads' at the kept ids, out-of-vocabulary targets as misses, the token_map through the checkpoint and
the vLLM export, target ids from the proposer, and the default (0) unchanged."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, load_drafter, save_drafter
from headstart.models.draft_vocab import (
    RowCache,
    label_counts,
    most_frequent,
    select_from_data,
    target_to_draft,
)
from headstart.models.export.medusa import read_layout, vllm_engine_args, write_layout
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = BackboneConfig(name="tiny", path="tiny", dtype="float32")


def rows(*labels: list[int]) -> list[dict]:
    return [{"labels": torch.tensor(x)} for x in labels]


def test_selection_by_frequency_on_hand_made_labels():
    data = rows([5, 5, 5, -100, 2, 2, 7], [7, 7, 7, 7, 1, -100])  # 7: 5x, 5: 3x, 2: 2x, 1: 1x
    counts = label_counts(data, 10)
    assert counts.tolist() == [0, 1, 2, 0, 0, 3, 0, 5, 0, 0]
    assert most_frequent(counts, 3).tolist() == [2, 5, 7]  # the top 3, sorted by id
    assert most_frequent(torch.tensor([1, 1, 1, 1]), 2).tolist() == [0, 1]  # ties: the lower id
    token_map, stats = select_from_data(data, 10, 2, min_coverage=0.0)
    assert token_map.tolist() == [5, 7] and stats["draft_vocab_coverage"] == pytest.approx(8 / 11)
    assert stats["labelled_distinct"] == 4
    with pytest.raises(ValueError, match="covers 72.7% of the labelled"):
        select_from_data(data, 10, 2, min_coverage=0.9)
    assert target_to_draft(token_map, 10).tolist() == [-1, -1, -1, -1, -1, 0, -1, 1, -1, -1]


def truncated_heads(backbone, share=True, dv=40, lo=50, **cfg):
    """Heads over the draft vocabulary of ids lo..lo+dv-1 (labels of those ids only), perturbed off the
    identity so the heads differ."""
    heads = build_drafter(
        "medusa", MedusaConfig(num_heads=3, share_lm_head=share, draft_vocab_size=dv, **cfg), backbone
    )
    stats = heads.init_from_data(rows(list(range(lo, lo + dv)) * 2))
    assert stats["draft_vocab_coverage"] == 1.0 and heads.token_map.tolist() == list(range(lo, lo + dv))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return heads


def full_twin(backbone, heads):
    """The same heads over the full vocabulary (shared lm_head; own heads: their rows placed at token_map)."""
    share = heads.lm_heads is None
    full = build_drafter("medusa", MedusaConfig(num_heads=3, share_lm_head=share), backbone)
    state = {k: v for k, v in heads.state_dict().items() if k.startswith("blocks.")}
    full.load_state_dict(state, strict=False)
    if not share:
        with torch.no_grad():
            for a, b in zip(full.lm_heads, heads.lm_heads):
                a.weight[heads.token_map] = b.weight
    return full


@pytest.mark.parametrize("share", [True, False])
def test_truncated_logits_equal_the_full_heads_at_the_kept_ids(backbone, share):
    heads = truncated_heads(backbone, share)
    full = full_twin(backbone, heads)
    hidden, _ = backbone(torch.randint(0, backbone.vocab_size, (2, 9)))
    logits = heads(hidden)  # (K, B, T, Dv)
    assert logits.shape[-1] == 40
    torch.testing.assert_close(logits, full(hidden)[..., heads.token_map])
    assert heads.to_target(logits.argmax(-1)).max() < 90  # target ids, inside the map


def test_shared_rows_are_not_state_and_get_no_gradient(backbone):
    heads = truncated_heads(backbone, share=True)
    assert {k for k in heads.state_dict() if not k.startswith("blocks.")} == {"token_map"}
    ids = torch.randint(0, backbone.vocab_size, (2, 12))
    hidden, _ = backbone(ids)
    loss, _, _ = heads(hidden, ids)
    loss.backward()
    assert backbone.lm_head.weight.grad is None and not heads.head_weight(0).requires_grad
    assert heads.head_weight(0) is heads.head_weight(1)  # gathered once, reused
    cache, w = RowCache(), torch.randn(6, 2)
    first = cache.get(w, torch.tensor([1, 4]))
    w.mul_(2)  # a changed weight (or map) is gathered again
    torch.testing.assert_close(cache.get(w, torch.tensor([1, 4])), 2 * first)


@pytest.mark.parametrize("share", [True, False])
def test_out_of_vocab_targets_add_no_loss_and_count_as_misses(backbone, share):
    heads = truncated_heads(backbone, share).eval()
    full = full_twin(backbone, heads).eval()
    ids = torch.randint(50, 90, (2, 14))
    ids[0, 6], ids[1, 9] = 3, 200  # two labels outside the draft vocabulary (ids 50..89)
    labels = ids.clone()
    labels[:, :2] = -100
    hidden, _ = backbone(ids)
    loss, count, m = heads(hidden, labels)
    ref, logits = 0.0, full(hidden)[..., heads.token_map]  # (K, B, T, Dv) over draft ids
    to_draft = target_to_draft(heads.token_map, backbone.vocab_size)
    for k in range(3):
        tgt = labels[:, k + 2 :]
        inv = (tgt != -100) & (to_draft[tgt.clamp_min(0)] >= 0)  # draftable targets
        lg, t = logits[k][:, : -(k + 2)][inv], to_draft[tgt[inv]]
        ref = ref + heads.cfg.decay**k * F.cross_entropy(lg, t, reduction="sum")
        n = int((tgt != -100).sum())
        assert m[f"head{k}/n"] == n and m[f"head{k}/oov"] == n - int(inv.sum())  # every target counted
        hits = int((lg.argmax(-1) == t).sum())
        assert m[f"head{k}/rank_hist"][0] == hits  # an OOV target is never a hit: top-1 = hits / n
    assert int(m["head0/oov"]) == 2 and count == int((labels[:, 2:] != -100).sum())
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)


def test_default_is_the_full_vocabulary_unchanged(backbone):
    """draft_vocab_size=0 (and >= V) keep the full vocabulary: no token_map, the same state and the same loss."""
    torch.manual_seed(0)
    a = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    torch.manual_seed(0)
    b = build_drafter("medusa", MedusaConfig(num_heads=2, draft_vocab_size=backbone.vocab_size), backbone)
    assert not a.truncated and not b.truncated and a.init_from_data(rows([1, 2])) == {}
    assert list(a.state_dict()) == list(b.state_dict()) and "token_map" not in a.state_dict()
    ids = torch.randint(0, backbone.vocab_size, (2, 10))
    hidden, _ = backbone(ids)
    la, lb = a(hidden, ids), b(hidden, ids)
    assert torch.equal(la[0], lb[0]) and "head0/oov" not in la[2]
    assert torch.equal(a.to_target(torch.tensor([5])), torch.tensor([5]))


@pytest.mark.parametrize("share", [True, False])
def test_token_map_round_trips_through_the_checkpoint(backbone, tmp_path, share):
    heads = truncated_heads(backbone, share)
    save_drafter(tmp_path / "ck", heads, "medusa", heads.cfg, TINY, backbone, extra={"data_stats": {}})
    assert "token_map" in load_file(tmp_path / "ck" / "model.safetensors")
    back, _ = load_drafter(tmp_path / "ck", backbone)
    assert torch.equal(back.token_map, heads.token_map) and back.token_map.dtype == torch.long
    hidden, _ = backbone(torch.randint(0, backbone.vocab_size, (1, 5)))
    torch.testing.assert_close(back(hidden), heads(hidden))


def test_vllm_export_carries_token_map_and_round_trips(backbone, tmp_path):
    heads = truncated_heads(backbone, share=True)
    write_layout(heads, "vllm", tmp_path, "org/base")
    cfg = json.loads((tmp_path / "config.json").read_text())
    t = load_file(tmp_path / "model.safetensors")
    assert cfg["truncated_vocab_size"] == 40 and cfg["vocab_size"] == backbone.vocab_size
    assert cfg["original_lm_head"] is True
    assert t["token_map"].dtype == torch.int64 and torch.equal(t["token_map"], heads.token_map)
    assert t["lm_heads.0.weight"].shape == (40, backbone.hidden_size)  # the kept rows, as vLLM's lm_head
    back = read_layout(tmp_path)
    assert back.truncated and torch.equal(back.token_map, heads.token_map)
    # vLLM's strict load check misses the token_map it registers: turned off for truncated folders only
    assert vllm_engine_args(tmp_path) == {"model_loader_extra_config": {"enable_weights_track": False}}
    write_layout(
        build_drafter("medusa", MedusaConfig(share_lm_head=True), backbone), "vllm", tmp_path / "f", "b"
    )
    assert vllm_engine_args(tmp_path / "f") == {}
    hidden, _ = backbone(torch.randint(0, backbone.vocab_size, (1, 5)))
    torch.testing.assert_close(back(hidden), heads(hidden))


def test_layouts_that_cannot_hold_the_truncation(backbone, tmp_path):
    own = truncated_heads(backbone, share=False)
    for layout in ("vllm", "medusa"):
        with pytest.raises(ValueError, match="share_lm_head=true"):
            write_layout(own, layout, tmp_path / layout, "org/base")
    shared = truncated_heads(backbone, share=True)
    write_layout(shared, "medusa", tmp_path / "repo", "org/base")  # the full lm_head: no truncation there
    back = read_layout(tmp_path / "repo")
    hidden, _ = backbone(torch.randint(0, backbone.vocab_size, (1, 5)))
    torch.testing.assert_close(back(hidden)[..., shared.token_map], shared(hidden))


@pytest.mark.parametrize("share", [True, False])
def test_greedy_speculative_equals_vanilla_with_truncated_heads(backbone, share):
    heads = truncated_heads(backbone, share, dv=120, lo=3)
    vanilla = Decoder(backbone)
    for tree in ("chain", None):
        dec = Decoder(backbone, MedusaOptions(heads, tree=tree, tree_nodes=8))
        for text in ("the cat sat on the mat. the cat", "abc abc abc abc"):
            prompt = backbone.tokenizer(text)["input_ids"]
            ref = vanilla.generate(prompt, 24, eos_token_ids=[])
            assert dec.generate(prompt, 24, eos_token_ids=[]).tokens == ref.tokens
        with torch.inference_mode():
            proposed = dec.proposer.propose(prompt, None).tokens
        assert set(proposed.tolist()) <= set(heads.token_map.tolist())  # target ids, from the map
