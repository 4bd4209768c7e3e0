"""Training objectives for drafters beyond cross-entropy, as pure functions of tensors.

Acceptance (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Sec. 3.1): a
token drafted from q and verified against the target's p is accepted with probability

    alpha(p, q) = sum_v min(p_v, q_v) = 1 - TV(p, q)

(greedy verification is the limit of a one-hot p). The LK loss ("LK losses", arXiv 2602.23881) trains on
1 - alpha directly; cross-entropy only bounds it (Pinsker: TV <= sqrt(KL / 2)). With logits z and q =
softmax(z), m_v = [q_v < p_v] (where q is short of p) and A = sum_v m_v q_v,

    d(1 - alpha) / dz_j = q_j (A - m_j)                                                     (LK gradient)

and for a one-hot p at class t: 1 - alpha = 1 - q_t, gradient q_t (q - e_t), i.e. cross-entropy's gradient
scaled by q_t: rows the draft already gets right count more, hopeless ones less.

`LossMix` is the weighted sum w_ce * CE + w_lk * (1 - alpha) the methods take (`method.ce_weight`,
`method.lk_weight`); models/chunked_ce.py computes it chunk by chunk over the vocabulary. The functions here
are the readable references (full (N, V) tensors) the chunked kernel is tested against.

GRIFFIN (Hu et al. 2025, "GRIFFIN: Effective Token Alignment for Faster Speculative Decoding", Sec. 3.2):
step s of the training-time-test unroll is only ever run at serve time where steps 0..s-1 drafted the
target's token, so `griffin_alive` masks step s's loss where an earlier step missed.

HASS's harmonized objective distillation (Zhang et al. 2025, "Learning Harmonized Representations for
Speculative Sampling", Sec. 3.1): a tree drafts the draft's top-k tokens, so what decoding needs is the target's
top tokens ranked right, and the objective adds the target's top-K terms of the cross-entropy once more:

    L = CE(p, q) + w * L_topK,      L_topK = -sum_{v in topK(p)} p_v log q_v

Both are cross-entropies against p's mass, so L = (1 + w m) * CE(p', q) with m = sum_{v in topK(p)} p_v and
p' = (p + w p * [v in topK(p)]) / (1 + w m), a distribution again: `hod_table` turns the teacher's table into
p' and a per-row weight 1 + w m, and the chunked soft cross-entropy computes L unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossMix:
    """Weights of the token objective: w_ce * cross-entropy + w_lk * (1 - acceptance); both >= 0, not both 0."""

    ce: float = 1.0
    lk: float = 0.0

    def __post_init__(self) -> None:
        if self.ce < 0 or self.lk < 0 or self.ce + self.lk == 0:
            raise ValueError(
                f"method.ce_weight={self.ce}, method.lk_weight={self.lk}: both must be >= 0 and not both 0. "
                "Fix: ce_weight=1 lk_weight=0 (cross-entropy), 0/1 (LK only) or both > 0 (the hybrid)"
            )

    @property
    def is_ce(self) -> bool:
        """Plain cross-entropy at weight 1: the kernels' original path, bit for bit."""
        return self.ce == 1.0 and self.lk == 0.0


def loss_mix(cfg) -> LossMix:
    """A method config's `ce_weight` / `lk_weight` as a LossMix (checked)."""
    return LossMix(cfg.ce_weight, cfg.lk_weight)


def acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """p, q (..., V) probabilities -> (...) sum_v min(p_v, q_v): the probability a draft from q is accepted
    under p (1 when q == p, 0 when their supports are disjoint)."""
    return torch.minimum(p, q).sum(-1)


def lk_loss(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """logits (N, V) of the draft, p (N, V) target probabilities -> (N,) 1 - acceptance(p, softmax(logits))."""
    return 1.0 - acceptance(p, torch.softmax(logits, -1))


def soft_cross_entropy(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(N, V), (N, V) -> (N,) -sum_v p_v log softmax(logits)_v."""
    return -(p * torch.log_softmax(logits, -1)).sum(-1)


def mixed_loss(logits: torch.Tensor, p: torch.Tensor, mix: LossMix) -> torch.Tensor:
    """(N, V) logits, (N, V) target probabilities (one-hot rows for hard labels) -> (N,) per-row objective
    mix.ce * CE + mix.lk * (1 - acceptance): the reference for models/chunked_ce.py."""
    out = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    if mix.ce:
        out = out + mix.ce * soft_cross_entropy(logits, p)
    if mix.lk:
        out = out + mix.lk * lk_loss(logits, p)
    return out


def griffin_alive(alive: torch.Tensor, hit: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """GRIFFIN's mask, one step on: alive (N,) bool, the rows whose earlier steps all drafted right; hit (N,)
    bool, this step's draft argmax is the target's token; known (N,) bool, this step has a target at the row.
    -> (N,) bool for the next step. A row without a target here (a prompt token, which serving never drafts)
    stays as it was."""
    return alive & (hit | ~known)


def top_k_mask(p: torch.Tensor, k: int) -> torch.Tensor:
    """(N, V) probabilities -> (N, V) bool, True on each row's k most probable entries (all of them when k >= V)."""
    k = min(k, p.shape[-1])
    return torch.zeros_like(p, dtype=torch.bool).scatter_(-1, p.topk(k, dim=-1).indices, True)


def top_k_loss(logits: torch.Tensor, p: torch.Tensor, k: int) -> torch.Tensor:
    """logits (N, V) of the draft, p (N, V) target probabilities -> (N,) HASS's -sum_{v in topK(p)} p_v log q_v."""
    return -(p * top_k_mask(p, k) * torch.log_softmax(logits, -1)).sum(-1)


def hod_table(p: torch.Tensor, k: int, weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) target probabilities -> (p' (N, V), row weight (N,)) with row weight * CE(p', q) = CE(p, q) +
    weight * top_k_loss(q, p, k) for every q: p' = (p + weight * p on its top k) / (1 + weight * their mass)."""
    top = p * top_k_mask(p, k)
    scale = 1.0 + weight * top.sum(-1, dtype=torch.float32)  # (N,)
    return (p + weight * top) / scale[:, None].to(p.dtype), scale
