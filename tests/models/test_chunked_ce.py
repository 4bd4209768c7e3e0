import pytest
import torch
import torch.nn.functional as F

from headstart.models import chunked_ce
from headstart.models.chunked_ce import linear_cross_entropy, linear_soft_cross_entropy


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_matches_full_cross_entropy_and_grads(chunk):
    torch.manual_seed(0)
    x = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 13, (10,))
    loss, seg, hist = linear_cross_entropy(x, w, t, chunk=chunk)
    hist = hist[0]
    (2.0 * loss).backward()
    gx, gw = x.grad.clone(), w.grad.clone()

    x.grad = w.grad = None
    logits = x @ w.T
    ref = F.cross_entropy(logits, t, reduction="sum")
    (2.0 * ref).backward()
    torch.testing.assert_close(loss.double(), ref)
    torch.testing.assert_close(seg, ref.detach()[None])
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    ranks = (logits > logits.gather(1, t[:, None])).sum(-1)
    assert hist[0].item() == (ranks == 0).sum().item()
    assert hist[:5].sum().item() == (ranks < 5).sum().item()
    assert hist.tolist() == [(ranks == r).sum().item() for r in range(len(hist))]


def test_frozen_weight_gets_no_grad():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(13, 8)
    loss, _, _ = linear_cross_entropy(x, w, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert x.grad is not None and w.grad is None


def test_hand_checked_uniform_logits():
    # zero weights -> uniform over V classes -> CE = log V per row, whatever the target
    x = torch.randn(5, 4)
    w = torch.zeros(7, 4)
    loss, _, hist = linear_cross_entropy(x, w, torch.arange(5))
    torch.testing.assert_close(loss, torch.tensor(5 * torch.log(torch.tensor(7.0)).item()))
    assert hist[0, 0].item() == 5  # ties: nothing strictly beats the target


def test_matmuls_run_in_the_autocast_dtype(monkeypatch):
    """Under bf16 autocast the chunk matmuls run in bf16 (4x faster on CPU than fp32), fp32 otherwise."""
    seen = []
    apply = chunked_ce._LinearCE.apply
    monkeypatch.setattr(chunked_ce._LinearCE, "apply", lambda *a: seen.append(a[9]) or apply(*a))
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    probs = torch.softmax(torch.randn(4, 16), -1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        linear_cross_entropy(x, w, torch.tensor([0, 1, 2, 3]))
        linear_soft_cross_entropy(x, w, probs, probs.argmax(-1))
    linear_cross_entropy(x, w, torch.tensor([0, 1, 2, 3]))
    assert seen == [torch.bfloat16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("soft", [False, True])
def test_segments_and_row_weights_equal_separate_weighted_calls(soft):
    """Several losses through one call (Medusa's heads, EAGLE-3's steps): the weighted total, each segment's
    own sum and rank counts, and the gradients equal separate calls summed with the same weights."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 6, generator=g, dtype=torch.float64, requires_grad=True)
    segment = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2])
    weights = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    table = torch.softmax(torch.randn(4, 11, generator=g, dtype=torch.float64), -1)
    index = torch.randint(0, 4, (9,), generator=g)
    target = table[index].argmax(-1) if soft else torch.randint(0, 11, (9,), generator=g)

    def call(rows, **kw):
        if soft:
            return linear_soft_cross_entropy(x[rows], w, table, target[rows], 2, index[rows], **kw)
        return linear_cross_entropy(x[rows], w, target[rows], 2, False, **kw)

    loss, seg, hist = call(slice(None), segment=segment, segments=3, row_weight=weights[segment])
    loss.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ref = 0.0
    for k in range(3):
        part, part_seg, part_hist = call(segment == k)
        ref = ref + weights[k] * part
        torch.testing.assert_close(seg[k], part_seg[0])
        assert hist[k].tolist() == part_hist[0].tolist()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
