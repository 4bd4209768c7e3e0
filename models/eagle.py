"""EAGLE feature drafters: one decoder layer of the backbone's shape that drafts from the target's features.

EAGLE-1/2 (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", Sec. 4;
EAGLE-2 only changes decoding): f_t is the target's pre-lm_head feature (the final *normed* hidden state),

    f^_{t+1} = Layer(fc([e(x_{t+1}); f_t]))          p^_{t+2} = softmax(lm_head(f^_{t+1}))   (frozen e, lm_head)
    L = w_feat * SmoothL1(f^_{t+1}, f_{t+1}) + w_tok * CE(softmax(lm_head(f_{t+1})), p^_{t+2})   (Eq. 1-3)

with uniform noise on the input features while training. The layer has no input norm (EAGLE's layer 0).
With `draft_vocab_size` Dv > 0, lm_head is its rows of the Dv most frequent labelled tokens (`token_map`), in
training (the teacher renormalised over them, as EAGLE-3's) and drafting; held-out accuracy counts a teacher
argmax outside them as a miss (models/draft_vocab.py).

EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration ... via Training-Time Test", Sec. 3):
g_t = fc([l_t; m_t; h_t]) fuses low/middle/high target layers (3H -> H); the layer's attention reads
[input_norm(e(x_{t+1})); hidden_norm(g_t)] (2H), the residual is g_t (norm_before_residual = False), and the
logits are lm_head_d(norm(h)) over a reduced draft vocabulary (d2t[i] = target_id(i) - i; t2d a bool mask).
Training-time test: step s feeds step s-1's output hidden as the feature (tokens shifted by one, positions +1),
row t attending to step-0 rows <= t and to its own row of steps 1..s (SpecForge's mask);
L = sum_s decay^s * softCE(p_target, p^_s), the target restricted to the draft vocabulary.
With `hass_topk` K > 0 (both kinds), HASS's objective term: the target's top-K terms of each softCE again, with
weight `hass_weight` (models/losses.py; the logged per-step loss is then the softCE against the reweighted
table). HASS's other half, context alignment, is what EAGLE-3's training-time test already does: step s reads
the target's features up to the row and the draft's own for the s tokens it drafted, as decoding does.

Settings and the draft vocabulary: models/eagle_config.py; the unrolled attention and the teacher's table:
models/eagle_ttt.py; the soft cross-entropy: models/chunked_ce.py.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from headstart.models.chunked_ce import compute_dtype, linear_soft_cross_entropy
from headstart.models.draft_vocab import (
    RowCache,
    build_vocab_map,
    check_coverage,
    check_draft_vocab,
    label_counts,
    select_from_data,
    target_to_draft,
    vocab_coverage,
)
from headstart.models.drafter import DrafterBase
from headstart.models.eagle_config import Eagle3Config, EagleConfig, draft_layer_config, resolve_aux_layers
from headstart.models.eagle_ttt import pack_rows, smooth_l1_sum, teacher_targets
from headstart.models.feature_cache import cached_layers
from headstart.models.losses import griffin_alive, hod_table, loss_mix

__all__ = ["Eagle3Config", "EagleConfig", "EagleDrafter"]


def feature_noise(like: torch.Tensor, batch: dict) -> torch.Tensor:
    """U(0, 1) noise shaped like `like` from the noise's own generator, seeded by (train seed, optimizer step,
    first row id) of the batch: a pure function of the batch, so a run resumed after a kill draws exactly the
    noise an uninterrupted one would, whatever else consumed the global RNG in between (a data-loader iterator
    recreated mid-epoch draws its base seed from it), with nothing to save in the checkpoint."""
    rows = batch.get("row_ids")  # absent in hand-made batches (benchmarks, unit tests)
    seed = 0
    for part in (batch.get("seed", 0), batch.get("step", 0), 0 if rows is None else int(rows[0]), 0x5EED):
        seed = (seed * 1_000_003 + int(part)) % (2**63 - 1)
    gen = torch.Generator(device=like.device).manual_seed(seed)
    return torch.rand(like.shape, generator=gen, device=like.device, dtype=like.dtype)  # like's shape


class EagleDrafter(DrafterBase):
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
        # EAGLE-1 over a truncated draft vocabulary: the frozen lm_head's token_map rows (gathered once, unsaved)
        if not self.v3:  # EAGLE-3's default (32000) is clamped by design; the size used is in data_stats
            check_draft_vocab(cfg.draft_vocab_size, vocab_size)
        self.truncated = not self.v3 and 0 < cfg.draft_vocab_size < vocab_size
        if self.truncated:
            self.register_buffer("token_map", torch.arange(cfg.draft_vocab_size))  # draft id -> target id
            self._rows = RowCache()
        self._frozen: list[nn.Module] = []  # [embed_tokens, lm_head] of the backbone: not registered/saved
        self._softcap: float | None = None  # the backbone's final logit soft cap (Gemma-2), for the targets

    def attach(self, embed: nn.Module, lm_head: nn.Module, softcap: float | None = None) -> None:
        self._frozen, self._softcap = [embed, lm_head], softcap

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
        if self.truncated:  # EAGLE-1: the same selection, kept as token_map
            token_map, stats = select_from_data(
                dataset, self.vocab_size, self.cfg.draft_vocab_size, self.cfg.min_coverage
            )
            with torch.no_grad():
                self.token_map.copy_(token_map)
            return stats
        if not self.v3:
            return {}
        counts = label_counts(dataset, self.vocab_size)
        d2t, t2d = build_vocab_map(counts, len(self.d2t))
        coverage = vocab_coverage(counts, t2d)
        check_coverage(coverage, len(d2t), self.cfg.min_coverage)
        self.set_vocab_map(d2t.to(self.d2t.device), t2d.to(self.t2d.device))
        distinct = int((counts > 0).sum())
        return {"draft_vocab_size": len(d2t), "draft_vocab_coverage": coverage, "labelled_distinct": distinct}

    def feature_cache(self) -> tuple[tuple[int, ...], str] | None:
        """The fused layers (EAGLE-1: none, the final state only) when features are cached offline."""
        return cached_layers(self.cfg, self.aux_layers)

    def serving(self, backbone, meta: dict | None = None, live: bool = False) -> dict:
        """Served in the target's dtype (bf16 on a bf16 target), like a draft model; as it is while training."""
        return {"drafter": self if live else self.to_serving_dtype(backbone.dtype)}

    @property
    def full_draft_vocab(self) -> bool:
        """EAGLE-3 drafting over all of the target's ids (d2t the identity; engines then want no map)."""
        return self.v3 and len(self.d2t) == len(self.t2d)

    def draft_ids(self) -> torch.Tensor:
        """(Dv,) target id of each draft id (all ids for EAGLE-1 over the full vocabulary)."""
        if self.truncated:
            return self.token_map
        if not self.v3:
            return torch.arange(self.vocab_size, device=self._anchor.device)
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def fuse(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """EAGLE-3: 3 x (..., H) target layers -> (..., H); EAGLE-1: the final feature itself."""
        return self.fc(torch.cat(feats, -1)) if self.v3 else feats[-1]

    def body(
        self, feat, tokens, positions, mask=None, cache=None, ttt_valid=None, ttt_rows=None
    ) -> torch.Tensor:
        """feat (B, T, H), tokens (B, T) target ids, positions (B, T), and either a mask (B, 1, T, S) (bool or
        additive; None = causal over T) or `ttt_valid` (B, T) bool for a training-time-test step (the cache
        then holds the earlier steps; `ttt_rows` (B, T) their step-0 positions when a step runs on a subset
        of the rows; see models/eagle_ttt.py) -> the layer's output hidden (B, T, H)
        (EAGLE-1: the predicted feature)."""
        dtype = self.param_dtype
        emb = self._frozen[0](tokens).to(dtype)  # (B, T, H), frozen
        feat = feat.to(dtype)
        pos_emb = self.rotary(feat, positions)
        layer = self.layer
        if ttt_valid is None and mask is None and tokens.shape[1] > 1:
            ttt_valid = torch.ones_like(tokens, dtype=torch.bool)  # plain causal = step 0 of the unroll
        kw = {"attention_mask": mask, "cache": cache, "position_embeddings": pos_emb, "ttt_valid": ttt_valid}
        if ttt_rows is not None:
            kw["ttt_rows"] = ttt_rows
        if not self.v3:
            return layer(self.fc(torch.cat([emb, feat], -1)), **kw)  # (B, T, H)
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(feat)], -1)  # (B, T, 2H)
        attn, _ = layer.self_attn(hidden_states=x, **kw)
        h = feat + attn  # the residual is the un-normed feature
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head_weight(self) -> torch.Tensor:
        if self.v3:
            return self.lm_head.weight
        w = self._frozen[1].weight
        return self._rows.get(w, self.token_map) if self.truncated else w  # (Dv, H)

    @property
    def _anchor(self) -> torch.Tensor:
        """A weight that is never quantized (models/int8.py): where the drafter's dtype and device are read."""
        return self.layer.post_attention_layernorm.weight

    @property
    def param_dtype(self) -> torch.dtype:
        """The layers' dtype (fp32 master weights while training; the serving dtype once cast)."""
        return self._anchor.dtype

    def int8_modules(self) -> list[nn.Module]:
        """Decoding on CPU: the fusion, the layer and EAGLE-3's draft head (called as modules; EAGLE-1's
        projection is the frozen lm_head's rows, kept as they are)."""
        return [self.fc, self.layer] + ([self.lm_head] if self.v3 else [])

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h) if self.v3 else h

    def to_serving_dtype(self, dtype: torch.dtype) -> EagleDrafter:
        """Cast the weights for decoding (bf16 on a bf16 target), keeping RoPE's inverse frequencies in fp32:
        rounded to bf16 they would shift every rotary angle the drafter was trained with."""
        for name, child in self.named_children():
            if name != "rotary":
                child.to(dtype)
        return self

    def top_draft(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(..., H) -> the k most likely next tokens under the draft distribution: (log-probs (..., k) fp32,
        target ids (..., k)). Over the draft vocabulary only (no (..., V) scatter; EAGLE-3's d2t maps ids)."""
        x = self.head_input(h)
        if (
            self.v3
        ):  # its own head, called as a module: nn.Linear, or Int8Linear served in int8 (models/int8.py)
            logits = self.lm_head(x.to(self.param_dtype))
        else:
            w = self.head_weight()  # cast the rows, never the (Dv, H) projection (a frozen bf16 lm_head)
            logits = x.to(w.dtype) @ w.T
        logp = torch.log_softmax(logits.float(), -1)  # (..., Dv)
        score, idx = logp.topk(k, -1)
        return score, self.draft_ids()[idx] if self.v3 or self.truncated else idx

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) target-vocabulary logits (-inf outside the draft vocabulary)."""
        x = self.head_input(h)
        logits = x @ self.head_weight().to(x.dtype).T  # (..., Dv)
        if logits.shape[-1] == self.vocab_size:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_ids(), logits)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.layer_config)

    def unroll(self, g, tokens, valid, steps: int, next_tokens, order=None) -> list[torch.Tensor]:
        """Training-time test over rows t: g (B, T, H) step-0 features, tokens (B, T), valid (B, T) bool;
        step s runs at positions t + s with step s-1's hidden as its feature and `next_tokens(s)` (B, T) as
        its tokens. -> [h_0, ..., h_{steps-1}]: h_0 (B, T, H); with `order` (B, L) (`pack_rows`: the rows a
        later step trains) steps 1.. run on those rows only and return (B, L, H), else (B, T, H).

        While training, each step's activations are recomputed in backward (`cfg.recompute`): only its
        inputs and the keys/values it appends stay alive, so memory does not grow with the steps' attention
        and MLP activations (~200 MB per step at batch 4 x 512 on SmolLM2)."""
        pos = torch.arange(g.shape[1], device=g.device)[None].expand(g.shape[0], -1)  # (B, T)
        rows = pos if order is None else order  # step-0 position of each row of steps 1..
        past: tuple[torch.Tensor, ...] = ()  # (keys, values) of the earlier steps, (B, kvh, T + s L, d)
        hs = []
        recompute = self.training and torch.is_grad_enabled() and getattr(self.cfg, "recompute", False)
        for s in range(steps):
            args = (g, tokens, pos, valid, None, *past)
            if s:
                feat = hs[-1]
                if s == 1 and order is not None:  # step 0's hidden on the kept rows
                    feat = feat.gather(1, order[..., None].expand(-1, -1, feat.shape[-1]))  # (B, L, H)
                step_tokens = next_tokens(s)
                args = (feat, step_tokens if order is None else step_tokens.gather(1, order), rows + s, valid)
                args = (*args, None if order is None else order, *past)
            h, *past = checkpoint(self._step, *args, use_reentrant=False) if recompute else self._step(*args)
            hs.append(h)
        return hs

    def _step(self, feat, tokens, positions, valid, rows, *past):
        """One training-time-test step as a pure function of its inputs (checkpointable): -> (h, keys,
        values), the keys/values including this step's rows."""
        cache = self.new_cache()
        if past:
            cache.update(past[0], past[1], 0)
        h = self.body(feat, tokens, positions, cache=cache, ttt_valid=valid, ttt_rows=rows)
        return h, cache.layers[0].keys, cache.layers[0].values

    def forward(self, feats: list[torch.Tensor], target: torch.Tensor, batch: dict):
        """feats: the target layers `fuse` reads ((B, T, H) each), target (B, T, H) the final normed feature.
        Row t drafts from (x_{t+1}, feature of t); step s predicts token t+2+s (trained where labels say).
        -> (summed loss, number of step-0 targets, summed metrics) like every method's step."""
        ids, labels = batch["input_ids"], batch["labels"]  # (B, T)
        g = self.fuse([f.to(self.param_dtype) for f in feats])[:, :-1]  # (B, T-1, H)
        if self.training and self.cfg.noise > 0:
            g = g + (feature_noise(g, batch) - 0.5) * self.cfg.noise
        valid = batch["attention_mask"][:, 1:].bool()  # (B, T-1)
        steps = 1 if not self.v3 else self.cfg.ttt_steps
        trained = [_shifted(labels, s + 1, -100) != -100 for s in range(steps)]  # (B, T-1): token t+2+s
        skip = self.v3 and self.cfg.skip_prompt_rows  # (ttt_steps >= 2: the config checks)
        order = pack_rows(torch.stack(trained[1:]).any(0)) if skip else None  # (B, L) rows steps 1.. train
        hs = self.unroll(g, ids[:, 1:], valid, steps, lambda s: _shifted(ids, s, 0), order)
        # The teacher's distribution at position j is trained wherever token j+1 is labelled; step s's row t
        # reads position t+1+s. One table for all steps: (positions, Dv) probabilities and their argmax.
        need = torch.zeros_like(labels, dtype=torch.bool)
        need[:, :-1] = labels[:, 1:] != -100  # (B, T)
        index = need.flatten().cumsum(0).view_as(need) - 1  # (B, T) row of position j in the table
        w_t = self._frozen[1].weight[self.draft_ids()] if self.v3 else self.head_weight()
        probs, top = teacher_targets(
            target[need], w_t, self.cfg.loss_chunk, compute_dtype(target), self._softcap
        )
        scale = None  # HASS: the table's top-K terms counted 1 + hass_weight times (models/losses.py)
        if self.cfg.hass_topk:
            probs, scale = hod_table(probs, self.cfg.hass_topk, self.cfg.hass_weight)
        x, at = [], []
        for s, h in enumerate(hs):
            rows = trained[s] if s == 0 or order is None else trained[s].gather(1, order)  # h's layout
            x.append(self.head_input(h[rows]))  # the rows in full-layout order either way
            at.append(_shifted(index, s, 0)[trained[s]])  # (N_s,) table rows of positions t+1+s
        greedy = (
            None if self.training else _argmax(target, self._frozen[1].weight, self.cfg.loss_chunk)
        )  # (B, T)
        oov = None
        if (
            greedy is not None and self.truncated
        ):  # held out: a full-vocabulary argmax outside the map is a miss
            oov = target_to_draft(self.token_map, self.vocab_size)[greedy[need]] < 0  # (table rows,)
        loss, seg_loss, hist, oov_n = self._token_loss(x, at, trained, probs, top, oov, scale)
        if not self.v3:  # EAGLE-1: plus the feature regression
            loss = loss + self.cfg.w_feat * smooth_l1_sum(
                hs[0][trained[0]], _shifted(target, 0, 0.0)[trained[0]]
            )
        metrics = {}
        for s, rows in enumerate(trained):
            metrics |= {
                f"head{s}/loss_sum": seg_loss[s],
                f"head{s}/rank_hist": hist[s],
                f"head{s}/n": rows.sum(),
            }
            if oov_n is not None:
                metrics[f"head{s}/oov"] = oov_n[s]
        if greedy is not None:
            metrics["sim_tau_sum"] = self.simulated_tau(g, ids, greedy, valid, trained[0])
        return loss, trained[0].sum(), metrics

    def _token_loss(self, x, at, trained, probs, top, oov, scale=None):
        """Every step's rows x[s] (N_s, H) against the teacher's table rows at[s] -> (weighted loss, per-step
        loss sums, per-step rank histograms, per-step counts of rows whose teacher argmax is outside a
        truncated vocabulary or None). One projection call for all steps (cast once, one gradient buffer);
        with GRIFFIN's mask one per step, each step's row weights zeroed where an earlier step missed.
        `scale` (table rows,): a weight per teacher row (HASS's `hod_table`), on top of the step's."""
        steps, w_s = len(x), self.head_weight()
        base = [self.cfg.decay**s if self.v3 else self.cfg.w_tok for s in range(steps)]
        segments, segs = steps, [torch.full_like(a, s) for s, a in enumerate(at)]
        if oov is not None:  # those rows: segments steps..2 steps-1 (counted in the loss, not the ranks)
            segments, segs = 2 * steps, [sg + steps * oov[a].long() for sg, a in zip(segs, at)]
        kw = {"full_ranks": not self.training, "mix": loss_mix(self.cfg)}
        chunk, device = self.cfg.loss_chunk, x[0].device
        if not (self.v3 and self.cfg.griffin_mask):
            weight = torch.cat([torch.full(a.shape, base[s]) for s, a in enumerate(at)]).to(device)
            at_all = torch.cat(at)
            if scale is not None:
                weight = weight * scale[at_all]
            loss, seg_loss, hist = linear_soft_cross_entropy(
                torch.cat(x), w_s, probs, top[at_all], chunk, at_all, torch.cat(segs), segments, weight, **kw
            )
        else:
            alive = torch.ones_like(trained[0])  # (B, T-1) no earlier step missed
            loss, seg_loss, hist = 0.0, 0, 0
            for s in range(steps):
                hits = torch.empty(len(at[s]), dtype=torch.bool, device=device)
                weight = base[s] * alive[trained[s]].to(torch.float32)
                if scale is not None:
                    weight = weight * scale[at[s]]
                parts = linear_soft_cross_entropy(
                    x[s], w_s, probs, top[at[s]], chunk, at[s], segs[s], segments, weight, hits_out=hits, **kw
                )
                loss, seg_loss, hist = loss + parts[0], seg_loss + parts[1], hist + parts[2]
                hit = torch.zeros_like(alive).masked_scatter_(trained[s], hits)  # (B, T-1)
                alive = griffin_alive(alive, hit, trained[s])
        oov_n = None
        if oov is not None:
            oov_n = torch.bincount(torch.cat(segs), minlength=segments)[steps:]
            seg_loss, hist = seg_loss[:steps] + seg_loss[steps:], hist[:steps]
        return loss, seg_loss, hist, oov_n

    @torch.no_grad()
    def simulated_tau(self, g, ids, greedy, valid, rows) -> torch.Tensor:
        """Summed over `rows`, 1 + the accepted length of the drafter's own greedy chain of sim_steps tokens
        (its argmax tokens and hidden states fed back) against the backbone's greedy token at each data
        position (`greedy` (B, T): the backbone's argmax after each position). Exact tau when the data is the
        backbone's own greedy output; a proxy otherwise."""
        cache, pos = self.new_cache(), torch.arange(g.shape[1], device=g.device)[None]
        feat, tokens, ok = g, ids[:, 1:], rows.clone()
        total = rows.sum().to(torch.float64)
        t = g.shape[1]
        for s in range(self.cfg.sim_steps):
            h = self.body(feat, tokens, pos + s, cache=cache, ttt_valid=valid)
            draft = self.draft_ids()[_argmax(self.head_input(h), self.head_weight(), self.cfg.loss_chunk)]
            ref = torch.cat([greedy[:, 1 + s :], greedy.new_full((g.shape[0], s), -1)], 1)[:, :t]  # (B, T-1)
            ok = ok & (draft == ref)
            total = total + ok.sum()
            feat, tokens = h, draft
        return total


def _shifted(x: torch.Tensor, s: int, fill) -> torch.Tensor:
    """x (B, T, ...) -> (B, T-1, ...): x[:, 1+s+t] for rows t, `fill` past the end."""
    out = x[:, 1 + s :]
    pad = out.new_full((x.shape[0], s, *x.shape[2:]), fill)
    return torch.cat([out, pad], 1)


def _argmax(x: torch.Tensor, weight: torch.Tensor, chunk: int) -> torch.Tensor:
    """argmax over (x @ weight.T) without the (..., V) logits at once: (..., H) -> (...) long."""
    flat, w = x.reshape(-1, x.shape[-1]), weight.to(x.dtype)  # cast the projection once, not per chunk
    out = torch.cat([(flat[s : s + chunk] @ w.T).argmax(-1) for s in range(0, len(flat), chunk)])
    return out.view(x.shape[:-1])


def build(cfg, backbone, meta: dict | None = None) -> EagleDrafter:
    """An EAGLE-1 (EagleConfig) or EAGLE-3 (Eagle3Config) drafter reading `backbone`'s embeddings and lm_head."""
    drafter = EagleDrafter(cfg, backbone.config, backbone.vocab_size)
    drafter.attach(backbone.embed_tokens, backbone.lm_head, backbone.final_softcap)
    return drafter.to(device=backbone.device)
