"""The acceptance-targeted (LK) objective: hand-worked values, its limits, and the chunked kernel against the
full-tensor reference (models/losses.py, models/chunked_ce.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from headstart.models.chunked_ce import linear_cross_entropy, linear_soft_cross_entropy
from headstart.models.losses import (
    LossMix,
    acceptance,
    griffin_alive,
    lk_loss,
    mixed_loss,
    soft_cross_entropy,
)


def test_acceptance_by_hand_and_its_limits():
    p = torch.tensor([0.5, 0.5, 0.0])
    # min(.5,.25) + min(.5,.25) + min(0,.5) = 0.5
    torch.testing.assert_close(acceptance(p, torch.tensor([0.25, 0.25, 0.5])), torch.tensor(0.5))
    torch.testing.assert_close(acceptance(p, p), torch.tensor(1.0))  # q == p: always accepted
    torch.testing.assert_close(acceptance(p, torch.tensor([0.0, 0.0, 1.0])), torch.tensor(0.0))  # disjoint
    # a one-hot target (greedy verification): the draft's probability of the target token
    torch.testing.assert_close(
        acceptance(torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.2, 0.7, 0.1])), torch.tensor(0.7)
    )


def test_lk_is_smallest_at_q_equal_p_and_its_gradient_matches_the_closed_form():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, 9, generator=g, dtype=torch.float64), -1)
    at_p = lk_loss(p.log(), p)
    torch.testing.assert_close(at_p, torch.zeros(6, dtype=torch.float64))
    z = torch.randn(6, 9, generator=g, dtype=torch.float64, requires_grad=True)
    loss = lk_loss(z, p)
    assert (loss > at_p).all()
    loss.sum().backward()
    q = torch.softmax(z.detach(), -1)
    m = (q < p).double()
    a = (m * q).sum(-1, keepdim=True)
    torch.testing.assert_close(z.grad, q * (a - m))  # q_j (A - m_j), models/losses.py


def test_loss_mix_refuses_negative_or_all_zero_weights():
    assert LossMix().is_ce and not LossMix(1.0, 0.5).is_ce
    with pytest.raises(ValueError, match="lk_weight"):
        LossMix(1.0, -0.1)
    with pytest.raises(ValueError, match="not both 0"):
        LossMix(0.0, 0.0)


def test_hard_lk_by_hand():
    # zero weights: q uniform over 4 classes, q_t = 1/4 -> LK 3/4 per row, CE log 4
    x, w = torch.randn(3, 5), torch.zeros(4, 5)
    lk, _, _ = linear_cross_entropy(x, w, torch.tensor([0, 1, 3]), mix=LossMix(0.0, 1.0))
    torch.testing.assert_close(lk, torch.tensor(3 * 0.75))
    both, _, _ = linear_cross_entropy(x, w, torch.tensor([0, 1, 3]), mix=LossMix(2.0, 1.0))
    torch.testing.assert_close(both, torch.tensor(3 * (2 * torch.log(torch.tensor(4.0)).item() + 0.75)))


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("mix", [LossMix(0.0, 1.0), LossMix(1.0, 0.5)])
@pytest.mark.parametrize("soft", [False, True])
def test_chunked_matches_the_reference_and_its_gradients(chunk, mix, soft):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 8, generator=g, dtype=torch.float64, requires_grad=True)
    table = torch.softmax(2 * torch.randn(4, 13, generator=g, dtype=torch.float64), -1)
    index = torch.randint(0, 4, (10,), generator=g)
    weight = torch.rand(10, generator=g, dtype=torch.float64)
    hits = torch.empty(10, dtype=torch.bool)
    if soft:
        top = table[index].argmax(-1)
        p = table[index]
        loss, seg, _ = linear_soft_cross_entropy(
            x, w, table, top, chunk, index, row_weight=weight, mix=mix, hits_out=hits
        )
    else:
        top = torch.randint(0, 13, (10,), generator=g)
        p = F.one_hot(top, 13).double()
        loss, seg, _ = linear_cross_entropy(
            x, w, top, chunk, False, row_weight=weight, mix=mix, hits_out=hits
        )
    loss.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    logits = x @ w.T
    rows = mixed_loss(logits, p, mix)
    ref = (rows * weight).sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(seg[0], rows.sum().detach())
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    assert hits.tolist() == (logits.argmax(-1) == top).tolist()


def test_chunked_soft_lk_is_zero_at_q_equal_p_and_positive_around_it():
    # logits = log p through an identity projection: q == p, the minimum (a kink: no gradient asserted there)
    p = torch.softmax(torch.randn(3, 5, dtype=torch.float64), -1)
    eye, mix = torch.eye(5, dtype=torch.float64), LossMix(0.0, 1.0)
    at_p, _, _ = linear_soft_cross_entropy(p.log(), eye, p, p.argmax(-1), mix=mix)
    torch.testing.assert_close(at_p, torch.tensor(0.0, dtype=torch.float64))
    for _ in range(5):
        off, _, _ = linear_soft_cross_entropy(
            p.log() + 0.1 * torch.randn(3, 5), eye, p, p.argmax(-1), mix=mix
        )
        assert off > 0


def test_griffin_alive_by_hand():
    alive = torch.tensor([True, True, True, False])
    hit = torch.tensor([True, False, False, True])
    known = torch.tensor([True, True, False, True])
    # row 1 missed a known target; row 2 had no target (a prompt token) and stays; row 3 was already out
    assert griffin_alive(alive, hit, known).tolist() == [True, False, True, False]


def test_top_k_loss_by_hand_and_its_limits():
    from headstart.models.losses import top_k_loss, top_k_mask

    p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    q = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64)
    assert top_k_mask(p, 2).tolist() == [[True, True, False]]
    # -(0.5 log 0.25 + 0.3 log 0.25) = 0.8 log 4
    torch.testing.assert_close(
        top_k_loss(q.log(), p, 2), torch.tensor([0.8 * math.log(4)], dtype=torch.float64)
    )
    # K >= V: every term, i.e. the soft cross-entropy itself
    torch.testing.assert_close(top_k_loss(q.log(), p, 7), soft_cross_entropy(q.log(), p))
    # for a fixed p, smallest where q puts p's top-K mass in proportion: q = p restricted and renormalized
    g = torch.Generator().manual_seed(0)
    best = torch.tensor([[0.5, 0.3, 1e-9]], dtype=torch.float64) / 0.8
    for _ in range(20):
        other = torch.softmax(torch.randn(1, 3, generator=g, dtype=torch.float64), -1)
        assert top_k_loss(other.log(), p, 2) >= top_k_loss(best.log(), p, 2)


def test_the_hod_table_turns_ce_plus_top_k_into_one_weighted_ce():
    from headstart.models.losses import hod_table, top_k_loss

    g = torch.Generator().manual_seed(1)
    p = torch.softmax(3 * torch.randn(5, 11, generator=g, dtype=torch.float64), -1)
    z = torch.randn(5, 11, generator=g, dtype=torch.float64)
    table, scale = hod_table(p, 3, 0.7)
    torch.testing.assert_close(table.sum(-1), torch.ones(5, dtype=torch.float64))  # a distribution again
    assert (table.argmax(-1) == p.argmax(-1)).all()  # the teacher's top token unchanged
    want = soft_cross_entropy(z, p) + 0.7 * top_k_loss(z, p, 3)
    torch.testing.assert_close(scale.double() * soft_cross_entropy(z, table), want)
    # the chunked kernel with the table and the weight: the same sum, and the same gradient
    x = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 4, generator=g, dtype=torch.float64)
    loss, _, _ = linear_soft_cross_entropy(x, w, table, p.argmax(-1), 2, row_weight=scale.double())
    logits = x @ w.T
    ref = (soft_cross_entropy(logits, p) + 0.7 * top_k_loss(logits, p, 3)).sum()
    torch.testing.assert_close(loss, ref)
    (gx,) = torch.autograd.grad(loss, x)
    (rx,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(gx, rx)
