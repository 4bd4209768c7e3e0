"""EAGLE feature drafters: one decoder layer of the backbone's shape that drafts from the target's features.

EAGLE-1/2 (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", Sec. 4;
EAGLE-2 only changes decoding): f_t is the target's pre-lm_head feature (the final *normed* hidden state),

    f^_{t+1} = Layer(fc([e(x_{t+1}); f_t]))          p^_{t+2} = softmax(lm_head(f^_{t+1}))   (frozen e, lm_head)
    L = w_feat * SmoothL1(f^_{t+1}, f_{t+1}) + w_tok * CE(softmax(lm_head(f_{t+1})), p^_{t+2})   (Eq. 1-3)

with uniform noise on the input features while training. The layer has no input norm (EAGLE's layer 0).

EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration ... via Training-Time Test", Sec. 3):
g_t = fc([l_t; m_t; h_t]) fuses low/middle/high target layers (3H -> H); the layer's attention reads
[input_norm(e(x_{t+1})); hidden_norm(g_t)] (2H), the residual is g_t (norm_before_residual = False), and the
logits are lm_head_d(norm(h)) over a reduced draft vocabulary (d2t[i] = target_id(i) - i; t2d a bool mask).
Training-time test: step s feeds step s-1's output hidden as the feature (tokens shifted by one, positions +1),
row t attending to step-0 rows <= t and to its own row of steps 1..s (SpecForge's mask);
L = sum_s decay^s * softCE(p_target, p^_s), the target restricted to the draft vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from headstart.models.chunked_ce import RANKS

HIDDEN_CACHES = ("online", "offline")
HIDDEN_CACHE_DTYPES = ("bfloat16", "float16", "float32")


def _check_hidden_cache(cfg) -> None:
    if cfg.hidden_cache not in HIDDEN_CACHES or cfg.hidden_cache_dtype not in HIDDEN_CACHE_DTYPES:
        raise ValueError(
            f"method.hidden_cache={cfg.hidden_cache!r}, method.hidden_cache_dtype={cfg.hidden_cache_dtype!r}: "
            f"expected one of {HIDDEN_CACHES} and one of {HIDDEN_CACHE_DTYPES}"
        )


@dataclass
class EagleConfig:  # EAGLE-1/2
    w_feat: float = 1.0  # EAGLE-1's v_w
    w_tok: float = 0.1  # EAGLE-1's p_w
    noise: float = 0.2  # uniform noise U(-noise/2, noise/2) on input features while training
    sim_steps: int = 4  # draft chain length of the simulated tau (eval batches)
    loss_chunk: int = 1024  # rows per vocabulary-projection chunk (the soft CE never holds N x V logits)
    # Target features: "online" (the frozen backbone runs in every step) or "offline" (computed once before
    # training into safetensors shards under cache_dir/hidden/, reused while the backbone and data match).
    hidden_cache: str = "online"
    hidden_cache_dtype: str = "bfloat16"  # bfloat16 | float16 | float32 (offline shards only)

    def __post_init__(self) -> None:
        if self.w_feat < 0 or self.w_tok < 0 or self.w_feat + self.w_tok == 0:
            raise ValueError("method.w_feat and method.w_tok must be >= 0 and not both 0")
        if self.noise < 0 or self.sim_steps < 1 or self.loss_chunk < 1:
            raise ValueError("method.noise must be >= 0, method.sim_steps and method.loss_chunk >= 1")
        _check_hidden_cache(self)


@dataclass
class Eagle3Config:
    # HF hidden_states ids = the *input* of decoder layer i (vLLM's convention); [] = (2, N//2, N-3), clamped
    # into [1, N-1] for backbones too shallow for that.
    aux_layers: list[int] = field(default_factory=list)
    ttt_steps: int = 3  # training-time-test unroll (SpecForge: 7)
    decay: float = 0.8  # step s's loss weight is decay**s
    draft_vocab_size: int = 32000  # clamped to the backbone's vocabulary; the most frequent labelled tokens
    min_coverage: float = 0.9  # refuse a draft vocabulary that covers less of the labelled tokens than this
    noise: float = 0.0
    sim_steps: int = 4
    loss_chunk: int = 1024
    hidden_cache: str = "online"  # online | offline (see EagleConfig)
    hidden_cache_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if not 1 <= self.ttt_steps <= 16 or not 0 < self.decay <= 1:
            raise ValueError("method.ttt_steps must be in 1..16 and method.decay in (0, 1]")
        if self.aux_layers and len(self.aux_layers) != 3:
            raise ValueError(f"method.aux_layers={self.aux_layers}: EAGLE-3 fuses exactly 3 layers (or [])")
        if self.draft_vocab_size < 1 or not 0 <= self.min_coverage <= 1:
            raise ValueError("method.draft_vocab_size must be >= 1 and method.min_coverage in [0, 1]")
        if self.noise < 0 or self.sim_steps < 1 or self.loss_chunk < 1:
            raise ValueError("method.noise must be >= 0, method.sim_steps and method.loss_chunk >= 1")
        _check_hidden_cache(self)


def resolve_aux_layers(cfg: Eagle3Config, num_layers: int) -> tuple[int, ...]:
    """The 3 hidden_states ids to fuse, each the input of a decoder layer in [0, N) (what vLLM can capture)."""
    if not cfg.aux_layers:
        return tuple(min(max(i, 1), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))
    bad = [i for i in cfg.aux_layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"method.aux_layers={cfg.aux_layers}: ids {bad} are outside the backbone's {num_layers} layers. "
            f"Fix: ids in 0..{num_layers - 1} (id i = the input of decoder layer i), or [] for the default"
        )
    return tuple(cfg.aux_layers)


def draft_layer_config(backbone_config, vocab_size: int) -> LlamaConfig:
    """A one-layer LlamaConfig with the backbone's attention/MLP shape (EAGLE drafts with a Llama layer)."""
    c = backbone_config
    heads = c.num_attention_heads
    rope = getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        hidden_act=getattr(c, "hidden_act", "silu"),
        rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
        max_position_embeddings=c.max_position_embeddings,
        rope_parameters=dict(rope),
        attention_bias=False,
        attn_implementation="sdpa",
    )


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """counts (V,) of labelled tokens -> d2t (Dv,) long, t2d (V,) bool: the Dv most frequent ids (ties: lower
    id), sorted by id, so draft id i is target id i + d2t[i] (EAGLE-3 / SpecForge convention)."""
    order = torch.argsort(-counts.double() + torch.arange(len(counts)) * 1e-9 / len(counts), stable=True)
    kept = order[:draft_vocab_size].sort().values  # (Dv,)
    t2d = torch.zeros(len(counts), dtype=torch.bool)
    t2d[kept] = True
    return kept - torch.arange(len(kept)), t2d


def vocab_coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    return float(counts[t2d].sum() / counts.sum().clamp_min(1))


def smooth_l1_sum(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N, H), (N, H) -> SmoothL1 (beta 1) averaged over H, summed over rows (EAGLE-1's feature loss)."""
    return F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1).sum()


def _soft_ce_chunk(x: torch.Tensor, teacher: torch.Tensor, w_s: torch.Tensor, w_t: torch.Tensor):
    log_q = torch.log_softmax((x @ w_s.T).float(), -1)  # (n, Vs) student
    p = torch.softmax((teacher @ w_t.T).float(), -1)  # (n, Vs) teacher, renormalised over the same ids
    return -(p * log_q).sum(), (log_q.argmax(-1) == p.argmax(-1)).sum()


def soft_cross_entropy(
    x, teacher, w_student, w_teacher, chunk: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_rows -sum_v softmax(teacher @ w_teacher.T)_v * log_softmax(x @ w_student.T)_v, and top-1 agreements.
    Each chunk of rows is recomputed in backward (activation checkpointing), so peak memory holds one chunk's
    logits, never N x V."""
    loss, hits = x.new_zeros((), dtype=torch.float32), torch.zeros((), dtype=torch.long, device=x.device)
    for s in range(0, x.shape[0], chunk):
        args = (x[s : s + chunk], teacher[s : s + chunk], w_student, w_teacher)
        ce, h = (
            checkpoint(_soft_ce_chunk, *args, use_reentrant=False)
            if x.requires_grad
            else _soft_ce_chunk(*args)
        )
        loss, hits = loss + ce, hits + h
    return loss, hits


def ttt_mask(key_valid: torch.Tensor, step: int) -> torch.Tensor:
    """key_valid (B, T) bool -> (B, 1, T, (step+1) T) bool, True = attend: row t sees the valid step-0 rows
    <= t (always itself) and its own row in steps 1..step (training-time test; SpecForge's extended mask)."""
    b, t = key_valid.shape
    eye = torch.eye(t, dtype=torch.bool, device=key_valid.device).expand(b, t, t)
    causal = torch.ones(t, t, dtype=torch.bool, device=key_valid.device).tril()[None] & key_valid[:, None, :]
    return torch.cat([causal | eye] + [eye] * step, dim=-1)[:, None]


class EagleDrafter(nn.Module):
    """EAGLE-1 (`cfg: EagleConfig`) or EAGLE-3 (`cfg: Eagle3Config`) draft head over a frozen backbone."""

    def __init__(self, cfg, backbone_config, vocab_size: int) -> None:
        super().__init__()
        self.cfg, self.v3 = cfg, isinstance(cfg, Eagle3Config)
        self.layer_config = lc = draft_layer_config(backbone_config, vocab_size)
        self.num_backbone_layers = backbone_config.num_hidden_layers
        self.vocab_size, h = vocab_size, lc.hidden_size
        self.layer = LlamaDecoderLayer(lc, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(lc)
        if self.v3:
            self.aux_layers = resolve_aux_layers(cfg, self.num_backbone_layers)
            self.fc = nn.Linear(3 * h, h, bias=False)
            attn = self.layer.self_attn  # q/k/v read [embedding; feature] (2H)
            for name in ("q_proj", "k_proj", "v_proj"):
                setattr(attn, name, nn.Linear(2 * h, getattr(attn, name).out_features, bias=False))
            self.layer.hidden_norm = LlamaRMSNorm(h, eps=lc.rms_norm_eps)
            self.norm = LlamaRMSNorm(h, eps=lc.rms_norm_eps)
            dv = min(cfg.draft_vocab_size, vocab_size)
            self.lm_head = nn.Linear(h, dv, bias=False)
            self.register_buffer("d2t", torch.zeros(dv, dtype=torch.long))
            self.register_buffer(
                "t2d",
                torch.ones(vocab_size, dtype=torch.bool)
                if dv == vocab_size
                else torch.zeros(vocab_size, dtype=torch.bool),
            )
        else:
            self.aux_layers = ()
            self.fc = nn.Linear(2 * h, h, bias=True)
            self.layer.input_layernorm = nn.Identity()  # EAGLE-1's layer 0 has no input norm
        self._frozen: list[nn.Module] = []  # [embed_tokens, lm_head] of the backbone: not registered/saved

    def attach(self, embed: nn.Module, lm_head: nn.Module) -> None:
        self._frozen = [embed, lm_head]

    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor, init_from_lm_head: bool = True) -> None:
        with torch.no_grad():
            self.d2t.copy_(d2t)
            self.t2d.copy_(t2d)
            if init_from_lm_head and self._frozen:  # start from the target's own rows for the kept ids
                self.lm_head.weight.copy_(self._frozen[1].weight[self.draft_ids()].to(self.lm_head.weight))

    def init_from_data(self, dataset) -> dict:
        """EAGLE-3: the draft vocabulary = the most frequent labelled tokens of the training data, stored as
        the d2t/t2d buffers (they travel in the checkpoint, never in a side file). Raises when it covers less
        than `min_coverage` of the labelled tokens. -> stats for the run's data_stats."""
        if not self.v3:
            return {}
        counts = torch.zeros(self.vocab_size, dtype=torch.long)
        for i in range(len(dataset)):
            labels = dataset[i]["labels"]
            counts += torch.bincount(labels[labels != -100], minlength=self.vocab_size)
        d2t, t2d = build_vocab_map(counts, len(self.d2t))
        coverage = vocab_coverage(counts, t2d)
        if coverage < self.cfg.min_coverage:
            raise ValueError(
                f"the draft vocabulary of {len(d2t)} tokens covers {coverage:.1%} of the labelled training "
                f"tokens (method.min_coverage={self.cfg.min_coverage}); the drafter could never propose the "
                "rest. Fix: raise method.draft_vocab_size or lower method.min_coverage"
            )
        self.set_vocab_map(d2t.to(self.d2t.device), t2d.to(self.t2d.device))
        distinct = int((counts > 0).sum())
        return {"draft_vocab_size": len(d2t), "draft_vocab_coverage": coverage, "labelled_distinct": distinct}

    def draft_ids(self) -> torch.Tensor:
        """(Dv,) target id of each draft id (all ids for EAGLE-1)."""
        if not self.v3:
            return torch.arange(self.vocab_size, device=self.fc.weight.device)
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def fuse(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """EAGLE-3: 3 x (..., H) target layers -> (..., H); EAGLE-1: the final feature itself."""
        return self.fc(torch.cat(feats, -1)) if self.v3 else feats[-1]

    def body(self, feat, tokens, positions, mask=None, cache=None) -> torch.Tensor:
        """feat (B, T, H), tokens (B, T) target ids, positions (B, T), additive mask (B, 1, T, S) or None
        (causal over T) -> the layer's output hidden (B, T, H) (EAGLE-1: the predicted feature)."""
        dtype = self.fc.weight.dtype
        emb = self._frozen[0](tokens).to(dtype)  # (B, T, H), frozen
        feat = feat.to(dtype)
        pos_emb = self.rotary(feat, positions)
        layer = self.layer
        if mask is None and tokens.shape[1] > 1:
            mask = ttt_mask(torch.ones_like(tokens, dtype=torch.bool), 0)
        if not self.v3:
            x = self.fc(torch.cat([emb, feat], -1))  # (B, T, H)
            return layer(x, attention_mask=mask, cache=cache, position_embeddings=pos_emb)
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(feat)], -1)  # (B, T, 2H)
        attn, _ = layer.self_attn(
            hidden_states=x, position_embeddings=pos_emb, attention_mask=mask, cache=cache
        )
        h = feat + attn  # the residual is the un-normed feature
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head_weight(self) -> torch.Tensor:
        return self.lm_head.weight if self.v3 else self._frozen[1].weight

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h) if self.v3 else h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) target-vocabulary logits (-inf outside the draft vocabulary)."""
        x = self.head_input(h)
        logits = x @ self.head_weight().to(x.dtype).T  # (..., Dv)
        if not self.v3 or logits.shape[-1] == self.vocab_size:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_ids(), logits)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.layer_config)

    def unroll(self, g, tokens, valid, steps: int, next_tokens) -> list[torch.Tensor]:
        """Training-time test over rows t: g (B, T, H) step-0 features, tokens (B, T), valid (B, T) bool;
        step s runs at positions t + s with step s-1's hidden as its feature and `next_tokens(s, h)` as its
        tokens. -> [h_0, ..., h_{steps-1}], each (B, T, H)."""
        cache, pos = self.new_cache(), torch.arange(g.shape[1], device=g.device)[None]
        hs = []
        for s in range(steps):
            if s:
                g, tokens = hs[-1], next_tokens(s, hs[-1])
            hs.append(self.body(g, tokens, pos + s, ttt_mask(valid, s), cache))
        return hs

    def forward(self, feats: list[torch.Tensor], target: torch.Tensor, batch: dict):
        """feats: the target layers `fuse` reads ((B, T, H) each), target (B, T, H) the final normed feature.
        Row t drafts from (x_{t+1}, feature of t); step s predicts token t+2+s (trained where labels say).
        -> (summed loss, number of step-0 targets, summed metrics) like every method's step."""
        ids, labels = batch["input_ids"], batch["labels"]  # (B, T)
        g = self.fuse([f.to(self.fc.weight.dtype) for f in feats])[:, :-1]  # (B, T-1, H)
        if self.training and self.cfg.noise > 0:
            g = g + (torch.rand_like(g) - 0.5) * self.cfg.noise
        valid = batch["attention_mask"][:, 1:].bool()  # (B, T-1)
        steps = 1 if not self.v3 else self.cfg.ttt_steps

        def shifted(x, s, fill):  # x[:, 1+s+t] for rows t, `fill` past the end
            out = x[:, 1 + s :]
            pad = out.new_full((x.shape[0], s, *x.shape[2:]), fill)
            return torch.cat([out, pad], 1)

        hs = self.unroll(g, ids[:, 1:], valid, steps, lambda s, h: shifted(ids, s, 0))
        w_s = self.head_weight()
        w_t = self._frozen[1].weight[self.draft_ids()] if self.v3 else w_s
        loss, metrics = g.new_zeros((), dtype=torch.float32), {}
        for s, h in enumerate(hs):
            rows = shifted(labels, s + 1, -100) != -100  # (B, T-1): token t+2+s is trained
            teacher = shifted(target, s, 0.0)[rows]  # (N_s, H)
            ce, hits = soft_cross_entropy(self.head_input(h[rows]), teacher, w_s, w_t, self.cfg.loss_chunk)
            step_loss = (
                self.cfg.w_tok * ce + self.cfg.w_feat * smooth_l1_sum(h[rows], teacher) if not self.v3 else ce
            )
            loss = loss + (self.cfg.decay**s if self.v3 else 1.0) * step_loss
            hist = torch.zeros(RANKS, dtype=torch.long, device=h.device)
            hist[0] = hits
            metrics |= {
                f"head{s}/loss_sum": ce.detach(),
                f"head{s}/rank_hist": hist,
                f"head{s}/n": rows.sum(),
            }
            if s == 0:
                count = rows.sum()
        if not self.training:
            metrics["sim_tau_sum"] = self.simulated_tau(
                g, ids, target, valid, shifted(labels, 1, -100) != -100
            )
        return loss, count, metrics

    @torch.no_grad()
    def simulated_tau(self, g, ids, target, valid, rows) -> torch.Tensor:
        """Summed over `rows`, 1 + the accepted length of the drafter's own greedy chain of sim_steps tokens
        (its argmax tokens and hidden states fed back) against the backbone's greedy token at each data
        position. Exact tau when the data is the backbone's own greedy output; a proxy otherwise."""
        lm = self._frozen[1].weight
        greedy = _argmax(target, lm, self.cfg.loss_chunk)  # (B, T) backbone argmax after each position
        cache, pos = self.new_cache(), torch.arange(g.shape[1], device=g.device)[None]
        feat, tokens, ok = g, ids[:, 1:], rows.clone()
        total = rows.sum().to(torch.float64)
        t = g.shape[1]
        for s in range(self.cfg.sim_steps):
            h = self.body(feat, tokens, pos + s, ttt_mask(valid, s), cache)
            draft = self.draft_ids()[_argmax(self.head_input(h), self.head_weight(), self.cfg.loss_chunk)]
            ref = torch.cat([greedy[:, 1 + s :], greedy.new_full((g.shape[0], s), -1)], 1)[:, :t]  # (B, T-1)
            ok = ok & (draft == ref)
            total = total + ok.sum()
            feat, tokens = h, draft
        return total


def _argmax(x: torch.Tensor, weight: torch.Tensor, chunk: int) -> torch.Tensor:
    """argmax over (x @ weight.T) without the (..., V) logits at once: (..., H) -> (...) long."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.cat(
        [(flat[s : s + chunk] @ weight.to(x.dtype).T).argmax(-1) for s in range(0, len(flat), chunk)]
    )
    return out.view(x.shape[:-1])
