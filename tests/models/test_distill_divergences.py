"""DistillSpec's divergences, hand-checked as trl checks its GKD loss: a 2-class example worked out by hand,
identical inputs give 0, JSD's ends are the two KLs, 1 - TVD is the speculative-sampling acceptance rate, and the
chunked loss (gradients formed in the forward pass) equals the plain one in value and gradient."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from headstart.models.distill import (
    DistillConfig,
    distill_loss,
    divergence,
    forward_kl,
    generalized_jsd,
    reverse_kl,
    teacher_log_probs,
    total_variation,
)

# p = (0.75, 0.25) from logits (log 3, 0); q = (0.5, 0.5) from logits (0, 0)
P_LOGITS = torch.tensor([[math.log(3.0), 0.0]])
Q_LOGITS = torch.tensor([[0.0, 0.0]])


def test_two_class_example_by_hand():
    fkl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # 0.130812
    rkl = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # 0.143841
    m = (0.625, 0.375)  # 0.5 p + 0.5 q
    jsd = 0.5 * (0.75 * math.log(0.75 / m[0]) + 0.25 * math.log(0.25 / m[1])) + 0.5 * (
        0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])
    )  # 0.033822
    assert fkl == pytest.approx(0.130812, abs=1e-6) and rkl == pytest.approx(0.143841, abs=1e-6)
    assert jsd == pytest.approx(0.033822, abs=1e-6)
    assert forward_kl(Q_LOGITS, P_LOGITS).item() == pytest.approx(fkl, abs=1e-6)
    assert reverse_kl(Q_LOGITS, P_LOGITS).item() == pytest.approx(rkl, abs=1e-6)
    assert generalized_jsd(Q_LOGITS, P_LOGITS, beta=0.5).item() == pytest.approx(jsd, abs=1e-6)
    assert total_variation(Q_LOGITS, P_LOGITS).item() == pytest.approx(0.25, abs=1e-7)  # 0.5 (0.25 + 0.25)
    # beta = 0.9: m = 0.9 p + 0.1 q = (0.725, 0.275)
    j9 = 0.9 * (0.75 * math.log(0.75 / 0.725) + 0.25 * math.log(0.25 / 0.275)) + 0.1 * (
        0.5 * math.log(0.5 / 0.725) + 0.5 * math.log(0.5 / 0.275)
    )
    assert generalized_jsd(Q_LOGITS, P_LOGITS, beta=0.9).item() == pytest.approx(j9, abs=1e-6)


def test_temperature_divides_the_logits():
    s, t = torch.randn(3, 7), torch.randn(3, 7)
    for fn in (forward_kl, reverse_kl, total_variation):
        torch.testing.assert_close(fn(s, t, temperature=2.0), fn(s / 2, t / 2))
    # at T = 2 the 2-class example becomes p = softmax((log 3) / 2, 0) = (sqrt3, 1) / (sqrt3 + 1)
    p0 = math.sqrt(3) / (math.sqrt(3) + 1)
    assert total_variation(Q_LOGITS, P_LOGITS, temperature=2.0).item() == pytest.approx(p0 - 0.5, abs=1e-6)


def test_identical_inputs_give_zero_and_distinct_give_positive():
    x = torch.randn(4, 5, 11)
    y = torch.randn(4, 5, 11)
    for kind in ("fkl", "rkl", "jsd", "tvd"):
        cfg = DistillConfig(divergence=kind, beta=0.3)
        assert divergence(x, x, cfg).abs().max() < 1e-6, kind
        assert (divergence(x, y, cfg) > 0).all(), kind
        assert divergence(x, y, cfg).shape == (4, 5)


def test_jsd_ends_are_the_two_kls_and_small_beta_approaches_forward_kl():
    s, t = torch.randn(6, 9), torch.randn(6, 9)
    torch.testing.assert_close(generalized_jsd(s, t, beta=0.0), forward_kl(s, t))  # KL(p || q)
    torch.testing.assert_close(generalized_jsd(s, t, beta=1.0), reverse_kl(s, t))  # KL(q || p)
    b = 1e-4  # JSD / beta -> KL(p || q) as beta -> 0 (why beta = 0 is defined as forward KL)
    torch.testing.assert_close(
        generalized_jsd(s.double(), t.double(), beta=b) / b, forward_kl(s, t).double(), rtol=1e-3, atol=1e-5
    )
    assert not torch.allclose(forward_kl(s, t), reverse_kl(s, t))  # the directions really differ


def test_one_minus_tvd_is_the_acceptance_rate_sum_min():
    s, t = torch.randn(5, 13), torch.randn(5, 13)
    p, q = torch.softmax(t, -1), torch.softmax(s, -1)
    torch.testing.assert_close(1 - total_variation(s, t), torch.minimum(p, q).sum(-1))


def test_teacher_topk_truncates_and_renormalizes_the_teacher():
    s, t = torch.randn(4, 10), torch.randn(4, 10)
    for fn in (forward_kl, total_variation):  # k = V is the full distribution
        torch.testing.assert_close(fn(s, t, teacher_topk=10), fn(s, t))
    logp, ids = teacher_log_probs(t, topk=3)
    assert logp.shape == ids.shape == (4, 3) and torch.allclose(logp.exp().sum(-1), torch.ones(4))
    assert (ids == t.topk(3, -1).indices).all()
    # k = 1: p is a point mass on the argmax a, so FKL = -log q_a and TVD = 1 - q_a
    a = t.argmax(-1, keepdim=True)
    q_a = torch.softmax(s, -1).gather(-1, a).squeeze(-1)
    torch.testing.assert_close(forward_kl(s, t, teacher_topk=1), -q_a.log())
    torch.testing.assert_close(total_variation(s, t, teacher_topk=1), 1 - q_a)
    # JSD with a sparse teacher equals the dense formula on the truncated p (zeros outside the top-k)
    p = torch.zeros(4, 10).scatter(-1, ids, logp.exp())
    q = torch.softmax(s, -1)
    m = 0.4 * p + 0.6 * q
    want = 0.4 * torch.xlogy(p, p / m).sum(-1) + 0.6 * (q * (q / m).log()).sum(-1)
    torch.testing.assert_close(generalized_jsd(s, t, beta=0.4, teacher_topk=3), want)


def test_topk_with_reverse_kl_and_bad_values_are_rejected():
    with pytest.raises(ValueError, match="teacher_topk"):
        DistillConfig(divergence="rkl", teacher_topk=8)
    with pytest.raises(ValueError, match="teacher_topk"):
        DistillConfig(divergence="jsd", beta=1.0, teacher_topk=8)
    with pytest.raises(ValueError, match="divergence"):
        DistillConfig(divergence="kl")
    with pytest.raises(ValueError, match="lambda_"):
        DistillConfig(lambda_=1.5)
    with pytest.raises(ValueError, match="beta"):
        DistillConfig(beta=-0.1)
    with pytest.raises(ValueError, match="keep_layers"):
        DistillConfig(keep_layers=[3, 1])
    with pytest.raises(ValueError, match="draft_path"):
        DistillConfig(init="pretrained")


@pytest.mark.parametrize(
    "kind,topk,bias",
    [("fkl", 0, False), ("rkl", 0, False), ("jsd", 5, False), ("tvd", 0, True), ("tvd", 5, False)],
)
def test_chunked_loss_equals_plain_loss_and_gradient(kind, topk, bias):
    torch.manual_seed(0)
    n, h, v = 11, 8, 17
    student, teacher = nn.Linear(h, v, bias=bias), nn.Linear(h, v, bias=bias).requires_grad_(False)
    h_s, h_t = torch.randn(n, h, requires_grad=True), torch.randn(n, h)
    cfg = DistillConfig(divergence=kind, beta=0.3, temperature=1.5, teacher_topk=topk, loss_chunk=4)

    loss, tvd, top1 = distill_loss(h_s, student, h_t, teacher, cfg)
    loss.backward()
    g_h, g_w = h_s.grad.clone(), student.weight.grad.clone()
    g_b = student.bias.grad.clone() if bias else None

    h_s.grad, student.weight.grad = None, None
    if bias:
        student.bias.grad = None
    ref = divergence(student(h_s), teacher(h_t), cfg).sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(g_h, h_s.grad)
    torch.testing.assert_close(g_w, student.weight.grad)
    if bias:
        torch.testing.assert_close(g_b, student.bias.grad)
    with torch.no_grad():
        s, t = student(h_s), teacher(h_t)
    torch.testing.assert_close(tvd, total_variation(s, t, 1.5, topk).sum())
    assert top1 == (s.argmax(-1) == t.argmax(-1)).sum()


def test_loss_compares_the_shared_vocabulary_prefix_and_handles_no_positions():
    student, teacher = nn.Linear(4, 9, bias=False), nn.Linear(4, 12, bias=False)  # teacher vocab padded
    h_s, h_t = torch.randn(3, 4), torch.randn(3, 4)
    loss, _, _ = distill_loss(h_s, student, h_t, teacher, DistillConfig())
    torch.testing.assert_close(loss, forward_kl(student(h_s), teacher(h_t)[:, :9]).sum())
    empty = torch.zeros(0, 4, requires_grad=True)
    loss, tvd, top1 = distill_loss(empty, student, torch.zeros(0, 4), teacher, DistillConfig())
    loss.backward()  # still connected to every parameter (DDP): zero gradients, not none
    assert loss.item() == 0 and tvd.item() == 0 and top1.item() == 0
    assert student.weight.grad is not None and not student.weight.grad.any()


def test_bf16_autocast_loss_and_gradient_track_fp32():
    torch.manual_seed(0)
    student, teacher = nn.Linear(16, 50, bias=False), nn.Linear(16, 50, bias=False).requires_grad_(False)
    h_s, h_t = torch.randn(20, 16, requires_grad=True), torch.randn(20, 16)
    cfg = DistillConfig(loss_chunk=7)
    ref, _, _ = distill_loss(h_s, student, h_t, teacher, cfg)
    ref.backward()
    g_ref, h_s.grad, student.weight.grad = student.weight.grad.clone(), None, None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = distill_loss(h_s, student, h_t, teacher, cfg)
    loss.backward()
    assert loss.dtype == torch.float32 and student.weight.grad.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(student.weight.grad, g_ref, rtol=0.1, atol=2e-2)
