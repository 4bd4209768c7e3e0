"""DistillSpec (Zhou et al. 2024, "DistillSpec: Improving Speculative Decoding via Knowledge Distillation"): train
a small draft LM toward the frozen target so that more of its proposals are accepted.

Per distilled position, with the target's (teacher's) distribution p and the draft's (student's) q, both
softmax(logits / T):

    forward KL   FKL = sum_v p log(p / q)                                     mass-covering
    reverse KL   RKL = sum_v q log(q / p)                                     mode-seeking
    JSD(beta)        = beta KL(p || m) + (1 - beta) KL(q || m),  m = beta p + (1 - beta) q
                       (GKD, Agarwal et al. 2024, Eq. 1). JSD vanishes at both ends (JSD / beta -> FKL as
                       beta -> 0), so as in trl's `generalized_jsd_loss`, beta = 0 *is* FKL and beta = 1 *is* RKL.
    TVD              = 0.5 sum_v |p - q|

DistillSpec's Lemma 3.1 (Leviathan et al. 2023, Thm 3.5): a token sampled from q and verified against p is
accepted with probability sum_v min(p, q) = 1 - TVD, which training logs as the simulated acceptance rate.

`teacher_topk = k > 0` keeps only the teacher's top-k tokens, renormalized (p = 0 elsewhere; the student keeps its
full softmax): FKL, JSD (beta < 1) and TVD stay finite and the divergence works on (n, k) teacher log-probs
instead of (n, V); RKL (and JSD at beta = 1) would be infinite and are refused.

The loss walks the distilled positions in chunks and forms each chunk's gradient in the forward pass (as
chunked_ce.py does for Medusa), so no (B, T, V) fp32 logits are ever alive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from headstart.models.drafter import DrafterBase
from headstart.models.families import final_softcap, softcap

INITS = ("pretrained", "pruned", "fresh")
DIVERGENCES = ("fkl", "rkl", "jsd", "tvd")
DATA_MODES = ("fixed", "teacher", "student", "mixture")


@dataclass
class DistillConfig:
    init: str = "pruned"  # pretrained | pruned | fresh
    draft_path: str = ""  # init=pretrained: a backbone name, Hub id, folder or .gguf (the same tokenizer)
    keep_layers: list[int] = field(default_factory=list)  # init=pruned: layers kept; []: evenly spaced
    num_layers: int = 6  # init=fresh: decoder layers; init=pruned without keep_layers: how many to keep
    freeze_embeddings: bool = False  # keep the embeddings and lm_head as initialized (fewer trained)
    divergence: str = "fkl"  # fkl | rkl | jsd | tvd
    beta: float = 0.5  # jsd only: 0 = forward KL, 1 = reverse KL
    temperature: float = 1.0  # softmax temperature of both distributions in the loss (and in accept_sim)
    teacher_topk: int = 0  # > 0: only the teacher's top-k probabilities, renormalized
    loss_chunk: int = 256  # positions per chunk of the vocabulary projections in the loss
    data_mode: str = "fixed"  # fixed | teacher | student | mixture (see train/distill_data.py)
    lambda_: float = 0.5  # mixture: probability that a batch is student-generated (else fixed)
    gen_max_new_tokens: int = 64  # teacher / student / mixture: response length limit
    gen_temperature: float = 1.0  # 0 = greedy responses
    seed: int = 0  # seeds the mixture coin and the sampled responses per step (conf: ${train.seed})

    def __post_init__(self) -> None:
        for key, allowed in (("init", INITS), ("divergence", DIVERGENCES), ("data_mode", DATA_MODES)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"method.{key}={getattr(self, key)!r}: expected one of {list(allowed)}")
        if self.init == "pretrained" and not self.draft_path:
            raise ValueError(
                "method.init=pretrained needs method.draft_path (a backbone name, Hub id or folder of the draft LM)"
            )
        if any(i < 0 for i in self.keep_layers) or list(self.keep_layers) != sorted(set(self.keep_layers)):
            raise ValueError(
                f"method.keep_layers={list(self.keep_layers)}: expected distinct layer indices >= 0 in "
                "increasing order"
            )
        if self.num_layers < 1:
            raise ValueError(f"method.num_layers={self.num_layers}: must be >= 1")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"method.beta={self.beta}: must be in [0, 1]")
        if not 0.0 <= self.lambda_ <= 1.0:
            raise ValueError(f"method.lambda_={self.lambda_}: must be in [0, 1] (a probability)")
        if self.temperature <= 0 or self.gen_temperature < 0:
            raise ValueError("method.temperature must be > 0 and method.gen_temperature >= 0 (0 = greedy)")
        if self.teacher_topk < 0 or self.loss_chunk < 1 or self.gen_max_new_tokens < 1:
            raise ValueError("method.teacher_topk must be >= 0, loss_chunk and gen_max_new_tokens >= 1")
        if self.teacher_topk and (self.divergence == "rkl" or (self.divergence == "jsd" and self.beta == 1)):
            raise ValueError(
                f"method.teacher_topk={self.teacher_topk} with reverse KL: q log(q/p) is infinite where the "
                "truncated teacher has p = 0. Fix: method.teacher_topk=0, or divergence fkl / tvd / jsd with beta < 1"
            )


# ---- divergences: pure functions of logits (..., V) -> per-position values (...) --------------------------


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # at least fp32 (bf16 log-probs lose ~0.01 nats); fp64 stays fp64
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)


def teacher_log_probs(
    teacher_logits: torch.Tensor, temperature: float = 1.0, topk: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p over the teacher's support: (..., V) and None, or the top-k renormalized (..., k) and their ids."""
    logp = _log_probs(teacher_logits, temperature)
    if topk <= 0 or topk >= logp.shape[-1]:
        return logp, None
    vals, ids = logp.topk(topk, dim=-1)  # (..., k)
    return vals - vals.logsumexp(-1, keepdim=True), ids


def _log_probs_pair(student_logits, teacher_logits, temperature: float, topk: int):
    """(log q on the teacher's support, log p, q's mass outside the support or None for the full vocabulary)."""
    logp, ids = teacher_log_probs(teacher_logits, temperature, topk)
    logq = _log_probs(student_logits, temperature)
    if ids is None:
        return logq, logp, None
    q_sup = logq.gather(-1, ids)  # (..., k)
    return q_sup, logp, (1.0 - q_sup.exp().sum(-1)).clamp_min(0.0)


def _fkl(logq, logp, off):
    return (logp.exp() * (logp - logq)).sum(-1)  # p = 0 off the support: no terms there


def _rkl(logq, logp, off):
    if off is not None:
        raise ValueError("reverse KL needs the teacher's full distribution (teacher_topk=0)")
    return (logq.exp() * (logq - logp)).sum(-1)


def _jsd(logq, logp, off, beta: float):
    if beta == 0.0:
        return _fkl(logq, logp, off)
    if beta == 1.0:
        return _rkl(logq, logp, off)
    logm = torch.logaddexp(logp + math.log(beta), logq + math.log1p(-beta))  # log(beta p + (1 - beta) q)
    js = (beta * logp.exp() * (logp - logm) + (1 - beta) * logq.exp() * (logq - logm)).sum(-1)
    if (
        off is not None
    ):  # where p = 0: m = (1 - beta) q, so (1 - beta) q log(q / m) = -(1 - beta) log(1 - beta) q
        js = js - (1 - beta) * math.log1p(-beta) * off
    return js


def _tvd(logq, logp, off):
    tv = (logp.exp() - logq.exp()).abs().sum(-1)
    return 0.5 * (tv if off is None else tv + off)  # off the support |0 - q| sums to q's mass there


def forward_kl(student_logits, teacher_logits, temperature: float = 1.0, teacher_topk: int = 0):
    """KL(p || q) per position."""
    return _fkl(*_log_probs_pair(student_logits, teacher_logits, temperature, teacher_topk))


def reverse_kl(student_logits, teacher_logits, temperature: float = 1.0):
    """KL(q || p) per position (needs the teacher's full distribution)."""
    return _rkl(*_log_probs_pair(student_logits, teacher_logits, temperature, 0))


def generalized_jsd(
    student_logits, teacher_logits, beta: float = 0.5, temperature: float = 1.0, teacher_topk: int = 0
):
    """GKD's JSD(beta) per position; beta = 0 is forward KL(p || q), beta = 1 is reverse KL(q || p)."""
    return _jsd(*_log_probs_pair(student_logits, teacher_logits, temperature, teacher_topk), beta)


def total_variation(student_logits, teacher_logits, temperature: float = 1.0, teacher_topk: int = 0):
    """0.5 sum |p - q| per position; 1 - TVD is the acceptance rate of speculative sampling."""
    return _tvd(*_log_probs_pair(student_logits, teacher_logits, temperature, teacher_topk))


def divergence_and_tvd(
    student_logits, teacher_logits, cfg: DistillConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """The configured divergence and the TVD per position, from one pair of log-softmaxes."""
    terms = _log_probs_pair(student_logits, teacher_logits, cfg.temperature, cfg.teacher_topk)
    tvd = _tvd(*terms)
    if cfg.divergence == "tvd":
        return tvd, tvd
    if cfg.divergence == "jsd":
        return _jsd(*terms, cfg.beta), tvd
    return (_fkl if cfg.divergence == "fkl" else _rkl)(*terms), tvd


def divergence(student_logits, teacher_logits, cfg: DistillConfig) -> torch.Tensor:
    """The configured divergence per position (..., V) -> (...)."""
    return divergence_and_tvd(student_logits, teacher_logits, cfg)[0]


# ---- the loss over distilled positions, chunked ------------------------------------------------------------


class _ChunkedDistill(torch.autograd.Function):
    """Walks the N positions in chunks; each chunk's (n, V) logits are formed, reduced to the divergence and turned
    into the gradients for the draft's hidden states and lm_head right away (the trick of chunked_ce.py), so
    neither the forward nor the backward ever holds more than one chunk's logits, and nothing is recomputed."""

    @staticmethod
    def forward(ctx, h_s, w_s, b_s, h_t, w_t, b_t, cfg: DistillConfig, compute_dtype: torch.dtype, caps):  # noqa: D102
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = torch.promote_types(compute_dtype, torch.float32)
        ws, wt = w_s.to(compute_dtype), w_t.to(compute_dtype)
        bs = None if b_s is None else b_s.to(compute_dtype)
        bt = None if b_t is None else b_t.to(compute_dtype)
        grad_h = torch.empty_like(h_s) if need_h else None
        grad_w = torch.zeros(w_s.shape, dtype=acc, device=w_s.device) if need_w else None
        grad_b = torch.zeros(b_s.shape, dtype=acc, device=b_s.device) if need_b else None
        loss = torch.zeros((), dtype=acc, device=h_s.device)
        tvd = torch.zeros((), dtype=acc, device=h_s.device)
        top1 = torch.zeros((), dtype=torch.long, device=h_s.device)
        for s in range(0, h_s.shape[0], cfg.loss_chunk):
            hs = h_s[s : s + cfg.loss_chunk].to(compute_dtype)  # (n, H_s)
            teacher = F.linear(h_t[s : s + cfg.loss_chunk].to(compute_dtype), wt, bt)  # (n, V), no grad
            teacher = softcap(teacher, caps[1])
            student = F.linear(hs, ws, bs).requires_grad_(need_h or need_w or need_b)  # (n, V): a leaf here
            with torch.enable_grad():  # the gradient is for the raw logits: through the soft cap, if any
                div, tv = divergence_and_tvd(softcap(student, caps[0]), teacher, cfg)  # (n,), (n,)
                chunk_loss = div.sum()
            if student.requires_grad:
                (g,) = torch.autograd.grad(chunk_loss, student)  # (n, V) d loss / d student logits
                g = g.to(compute_dtype)
                if need_h:
                    grad_h[s : s + cfg.loss_chunk] = (g @ ws).to(h_s.dtype)
                if need_w:
                    grad_w += (g.T @ hs).to(acc)
                if need_b:
                    grad_b += g.sum(0).to(acc)
            loss += chunk_loss.detach()
            tvd += tv.detach().sum()
            top1 += (student.argmax(-1) == teacher.argmax(-1)).sum()
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (w_s.dtype, None if b_s is None else b_s.dtype)
        ctx.mark_non_differentiable(tvd, top1)
        return loss, tvd, top1

    @staticmethod
    def backward(ctx, grad_loss, _grad_tvd, _grad_top1):  # noqa: D102
        grad_h, grad_w, grad_b = ctx.saved_tensors
        gh = grad_h * grad_loss.to(grad_h.dtype) if grad_h is not None else None
        gw = (grad_w * grad_loss).to(ctx.dtypes[0]) if grad_w is not None else None
        gb = (grad_b * grad_loss).to(ctx.dtypes[1]) if grad_b is not None else None
        return gh, gw, gb, None, None, None, None, None, None


def distill_loss(
    h_s: torch.Tensor,
    student_head: nn.Module,
    h_t: torch.Tensor,
    teacher_head: nn.Module,
    cfg: DistillConfig,
    caps: tuple[float | None, float | None] = (None, None),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed divergence, summed TVD and greedy top-1 agreements over N distilled positions.

    h_s (N, H_s): the draft's final hidden states (with grad); h_t (N, H_t): the target's (no grad). The rows go
    through both vocabulary projections `loss_chunk` at a time (no (B, T, V) fp32 tensors on a 49k vocabulary).
    Matmuls run in the autocast dtype when autocast is on, else in h_s's dtype; divergences in fp32.
    `caps`: the (student, teacher) final logit soft caps (Gemma-2; None for most families).
    """
    # families pad the vocabulary differently (ids past len(tokenizer) never occur): compare the shared prefix
    v = min(student_head.weight.shape[0], teacher_head.weight.shape[0])
    b_s, b_t = getattr(student_head, "bias", None), getattr(teacher_head, "bias", None)
    device = h_s.device.type
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h_s.dtype
    with torch.autocast(device, enabled=False):
        loss, tvd, top1 = _ChunkedDistill.apply(
            h_s,
            student_head.weight[:v],
            None if b_s is None else b_s[:v],
            h_t.detach(),
            teacher_head.weight[:v].detach(),
            None if b_t is None else b_t[:v].detach(),
            cfg,
            compute,
            caps,
        )
    return loss.float(), tvd.float(), top1


class DistillDrafter(DrafterBase):
    """A plain HF causal LM (`self.draft`) trained toward the frozen target; exports as a standard HF folder."""

    def __init__(self, cfg: DistillConfig, draft: nn.Module) -> None:
        super().__init__()
        self.cfg, self.draft = cfg, draft
        if cfg.freeze_embeddings:  # tied models share one tensor: freezing both is freezing it once
            draft.get_input_embeddings().requires_grad_(False)
            draft.get_output_embeddings().requires_grad_(False)
        # a list, so the frozen target's lm_head is neither registered nor saved
        self._teacher_head: list[nn.Module] = []
        self._teacher_cap: float | None = None

    @property
    def starts_trained(self) -> bool:
        return self.cfg.init != "fresh"

    def attach_teacher_head(self, lm_head: nn.Module, softcap: float | None = None) -> None:
        """`softcap`: the target's final logit soft cap (Gemma-2); the draft's own comes from its config."""
        self._teacher_head, self._teacher_cap = [lm_head], softcap

    def int8_modules(self) -> list[nn.Module]:
        """Decoding on CPU: every projection of the draft LM, its lm_head included (a tied one gets its own int8
        copy; the input embedding, read a row a token, stays as trained). A draft LM's step reads all its
        weights: in int8 half the bytes (models/int8.py has the measured step)."""
        return [self.draft]

    def checkpoint_meta(self) -> dict:
        """What load_drafter needs besides the weights: the draft's HF config."""
        return {"draft_config": self.draft.config.to_dict()}

    def serving(self, backbone, meta: dict | None = None, live: bool = False) -> dict:
        """The draft LM proposes (the decoder's draft-model proposer): frozen in the target's dtype, or, while
        training, as it is (its own dtype, not frozen)."""
        from headstart.models.backbone import Backbone

        if live:
            return {"draft_backbone": Backbone(self.draft, backbone.tokenizer, name="draft", freeze=False)}
        draft = self.draft.to(backbone.dtype)  # served like the target (bf16 on a bf16 target)
        return {"draft_backbone": Backbone(draft, backbone.tokenizer, name="distillspec-draft")}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        teacher_hidden: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """input_ids / attention_mask (B, T) right-padded; loss_mask (B, T-1): position t is distilled when it
        predicts a labelled token t+1; teacher_hidden (B, T, H_t): the target's final normed hidden states.

        Returns (summed divergence, number of distilled positions, summed metrics): `accept_sim` = 1 - TVD and
        `top1_match` = the draft's argmax equals the target's (what greedy verification accepts).
        """
        if not self._teacher_head:
            raise RuntimeError("no teacher lm_head attached: call attach_teacher_head(backbone.lm_head)")
        out = self.draft.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        h_s = out.last_hidden_state[:, :-1][loss_mask]  # (N, H_s)
        h_t = teacher_hidden[:, :-1][loss_mask]  # (N, H_t)
        caps = (final_softcap(self.draft.config), self._teacher_cap)
        loss, tvd, top1 = distill_loss(
            h_s, self.draft.get_output_embeddings(), h_t, self._teacher_head[0], self.cfg, caps
        )
        count = loss_mask.sum()
        metrics = {"accept_sim_sum": count - tvd, "top1_match_sum": top1}
        return loss, count, metrics
