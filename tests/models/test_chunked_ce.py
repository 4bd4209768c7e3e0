import pytest
import torch
import torch.nn.functional as F

from headstart.models.chunked_ce import linear_cross_entropy


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_matches_full_cross_entropy_and_grads(chunk):
    torch.manual_seed(0)
    x = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 13, (10,))
    loss, hist = linear_cross_entropy(x, w, t, chunk=chunk)
    (2.0 * loss).backward()
    gx, gw = x.grad.clone(), w.grad.clone()

    x.grad = w.grad = None
    logits = x @ w.T
    ref = F.cross_entropy(logits, t, reduction="sum")
    (2.0 * ref).backward()
    torch.testing.assert_close(loss.double(), ref)
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    ranks = (logits > logits.gather(1, t[:, None])).sum(-1)
    assert hist[0].item() == (ranks == 0).sum().item()
    assert hist[:5].sum().item() == (ranks < 5).sum().item()
    assert hist.tolist() == [(ranks == r).sum().item() for r in range(len(hist))]


def test_frozen_weight_gets_no_grad():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(13, 8)
    loss, _ = linear_cross_entropy(x, w, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert x.grad is not None and w.grad is None


def test_hand_checked_uniform_logits():
    # zero weights -> uniform over V classes -> CE = log V per row, whatever the target
    x = torch.randn(5, 4)
    w = torch.zeros(7, 4)
    loss, hist = linear_cross_entropy(x, w, torch.arange(5))
    torch.testing.assert_close(loss, torch.tensor(5 * torch.log(torch.tensor(7.0)).item()))
    assert hist[0].item() == 5  # ties: nothing strictly beats the target
