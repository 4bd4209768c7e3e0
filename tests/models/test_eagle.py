"""EAGLE drafters: hand-checked losses, the TTT mask and decay, the draft-vocabulary maps, bad input."""

from __future__ import annotations

import math
import os

import pytest
import torch

from headstart.models.checkpoint import build_drafter
from headstart.models.chunked_ce import linear_soft_cross_entropy
from headstart.models.draft_vocab import build_vocab_map, vocab_coverage
from headstart.models.eagle_config import Eagle3Config, EagleConfig, resolve_aux_layers
from headstart.models.eagle_ttt import smooth_l1_sum, teacher_targets, ttt_mask


def _batch(seed: int = 0, b: int = 2, t: int = 12) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 259, (b, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, t - 3 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :3] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss(backbone, method, cfg, batch):
    torch.manual_seed(0)
    d = build_drafter(method, cfg, backbone).eval()
    final, aux = backbone(batch["input_ids"], batch["attention_mask"], layers=d.aux_layers)
    with torch.no_grad():
        return d(aux if d.v3 else [final], final, batch)


def test_smooth_l1_and_soft_ce_by_hand():
    # |0.5| < 1: 0.5 * 0.5^2 = 0.125; |2| >= 1: 2 - 0.5 = 1.5; mean over H = 0.8125 (one row)
    assert smooth_l1_sum(torch.tensor([[0.0, 2.0]]), torch.tensor([[0.5, 0.0]])).item() == pytest.approx(
        0.8125
    )
    eye = torch.eye(2)
    uniform = torch.full((1, 2), 0.5)
    ce, _, hist = linear_soft_cross_entropy(torch.zeros(1, 2), eye, uniform, torch.tensor([0]))
    assert ce.item() == pytest.approx(math.log(2)) and hist[0, 0].item() == 1  # uniform vs uniform: ln 2


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_soft_ce_matches_autograd_reference(chunk):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    probs, top = teacher_targets(
        torch.randn(7, 5, generator=g, dtype=torch.float64), w.detach() * 2, 3, torch.float64
    )
    ce, _, hist = linear_soft_cross_entropy(x, w, probs, top, chunk)
    ce.backward()
    x_ref, w_ref = x.detach().requires_grad_(), w.detach().requires_grad_()
    logits = x_ref @ w_ref.T
    ref = -(probs * torch.log_softmax(logits, -1)).sum()
    ref.backward()
    torch.testing.assert_close(ce, ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad, w_ref.grad)
    assert hist[0, 0].item() == (logits.argmax(-1) == top).sum().item() and hist[0, 1:].sum() == 0
    torch.testing.assert_close(probs.sum(-1), torch.ones(7, dtype=torch.float64))


def test_ttt_attention_equals_sdpa_under_the_extended_mask(backbone):
    """The unrolled attention (own-row keys scored as dot products) gives the same outputs and gradients as
    SDPA over the whole (T, (s+1) T) training-time-test mask, padding included."""
    from headstart.models import eagle_ttt

    batch = _batch()
    torch.manual_seed(0)
    cfg = Eagle3Config(ttt_steps=3, draft_vocab_size=64, recompute=False)  # the reference body is swapped
    d = build_drafter("eagle3", cfg, backbone).train()  # out before backward: no recomputation here
    final, aux = backbone(batch["input_ids"], batch["attention_mask"], layers=d.aux_layers)
    d.cfg.noise = 0.0

    def run(fast: bool):
        d.zero_grad()
        if fast:
            loss, _, _ = d(aux, final, batch)
        else:  # the reference: every step through SDPA with the explicit extended mask
            original = d.body

            def body(feat, tokens, positions, mask=None, cache=None, ttt_valid=None, ttt_rows=None):
                assert ttt_rows is None  # every row at every step (skip_prompt_rows is off)
                step = cache.get_seq_length() // tokens.shape[1]
                return original(feat, tokens, positions, ttt_mask(ttt_valid, step), cache)

            d.body = body
            try:
                loss, _, _ = d(aux, final, batch)
            finally:
                del d.body
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in d.parameters() if p.grad is not None]

    fast, fast_grads = run(True)
    ref, ref_grads = run(False)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    assert len(fast_grads) == len(ref_grads) > 0
    for a, b in zip(fast_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert d.layer_config._attn_implementation == eagle_ttt.ATTENTION


def test_eagle1_loss_is_weighted_sum(backbone):
    batch = _batch()
    feat, n, _ = _loss(backbone, "eagle", EagleConfig(w_feat=1.0, w_tok=0.0, noise=0.0), batch)
    tok, _, m = _loss(backbone, "eagle", EagleConfig(w_feat=0.0, w_tok=1.0, noise=0.0), batch)
    both, _, _ = _loss(backbone, "eagle", EagleConfig(w_feat=2.0, w_tok=0.5, noise=0.0), batch)
    torch.testing.assert_close(both, 2 * feat + 0.5 * tok)
    torch.testing.assert_close(tok, m["head0/loss_sum"])
    # rows: token t+2 labelled (positions 3..11 in row 0, 3..8 in row 1) -> 9 + 6
    assert n.item() == 15 and m["head0/n"].item() == 15


def test_ttt_decay_weighting(backbone):
    loss, _, m = _loss(
        backbone, "eagle3", Eagle3Config(ttt_steps=3, decay=0.5, draft_vocab_size=64), _batch()
    )
    expected = m["head0/loss_sum"] + 0.5 * m["head1/loss_sum"] + 0.25 * m["head2/loss_sum"]
    torch.testing.assert_close(loss, expected)
    assert m["head2/n"] < m["head0/n"] + 1  # later steps lose rows at the end of the sequence
    assert 1.0 <= (m["sim_tau_sum"] / m["head0/n"]).item() <= 1 + 4


def test_ttt_mask_by_hand():
    mask = ttt_mask(torch.tensor([[True, True]]), step=1)[0, 0].int().tolist()
    assert mask == [[1, 0, 1, 0], [1, 1, 0, 1]]  # causal step 0, then each row sees only itself
    pad = ttt_mask(torch.tensor([[False, True]]), step=0)[0, 0].int().tolist()
    assert pad == [[1, 0], [0, 1]]  # a padded key is hidden, but a row always sees itself (no NaN rows)


def test_vocab_map_round_trip():
    counts = torch.tensor([5, 0, 3, 9, 1, 0])
    d2t, t2d = build_vocab_map(counts, 3)
    assert d2t.tolist() == [0, 1, 1]  # kept ids 0, 2, 3: draft id i -> i + d2t[i]
    assert t2d.tolist() == [True, False, True, True, False, False]
    assert (torch.arange(3) + d2t).tolist() == t2d.nonzero().flatten().tolist()
    assert vocab_coverage(counts, t2d) == pytest.approx(17 / 18)


def test_aux_layers_defaults_and_errors():
    assert resolve_aux_layers(Eagle3Config(), 32) == (2, 16, 29)  # vLLM/SGLang's default (inputs of layers)
    assert resolve_aux_layers(Eagle3Config(), 2) == (1, 1, 1)  # clamped for the tiny backbone
    with pytest.raises(ValueError, match="outside the backbone's 2 layers"):
        resolve_aux_layers(Eagle3Config(aux_layers=[0, 1, 2]), 2)
    with pytest.raises(ValueError, match="exactly 3"):
        Eagle3Config(aux_layers=[0, 1])


def test_layers_are_distinct_tensors(backbone):
    d = build_drafter("eagle3", Eagle3Config(draft_vocab_size=64), backbone)
    params = [p for _, p in d.named_parameters()]
    assert len({p.data_ptr() for p in params}) == len(params)
    assert d.layer.hidden_norm is not d.layer.input_layernorm
    other = build_drafter("eagle3", Eagle3Config(draft_vocab_size=64), backbone)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(d.parameters(), other.parameters()))
    _, aux = backbone(torch.tensor([[5, 6, 7]]), layers=(0, 1, 2))
    assert not torch.equal(aux[0], aux[1]) and not torch.equal(aux[1], aux[2])
    # the frozen embeddings / lm_head are used, never saved
    assert not any(k.startswith(("embed", "_frozen")) for k in d.state_dict())


def test_vocab_map_from_data_lives_in_the_checkpoint(backbone, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def data(lo, hi):
        return [{"labels": torch.arange(lo, hi).repeat(3)} for _ in range(4)]

    a = build_drafter("eagle3", Eagle3Config(draft_vocab_size=16), backbone)
    stats = a.init_from_data(data(10, 26))
    b = build_drafter("eagle3", Eagle3Config(draft_vocab_size=16), backbone)
    b.init_from_data(data(100, 116))
    assert stats["draft_vocab_coverage"] == 1.0
    assert a.t2d[10:26].all() and not torch.equal(a.d2t, b.d2t) and not torch.equal(a.t2d, b.t2d)
    assert {"d2t", "t2d"} <= set(a.state_dict())  # saved with the weights, nowhere else
    torch.testing.assert_close(a.lm_head.weight, backbone.lm_head.weight[10:26])
    assert os.listdir(tmp_path) == []  # nothing cached in the working directory
    small = build_drafter("eagle3", Eagle3Config(draft_vocab_size=8), backbone)
    with pytest.raises(ValueError, match="covers 50.0% of the labelled"):
        small.init_from_data(data(10, 26))


def test_recomputed_ttt_steps_give_the_same_loss_and_gradients(backbone):
    batch = _batch()
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        cfg = Eagle3Config(ttt_steps=3, draft_vocab_size=64, recompute=recompute)
        d = build_drafter("eagle3", cfg, backbone).train()
        final, aux = backbone(batch["input_ids"], batch["attention_mask"], layers=d.aux_layers)
        loss, _, _ = d(aux, final, batch)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in d.parameters() if p.grad is not None]))
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a, b)
    assert len(ga) == len(gb) > 0
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y)
