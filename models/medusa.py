"""Medusa-1 heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", Sec. 2.1.1): K heads on the frozen backbone's last hidden state h_t,

    p_t^(k) = softmax(W2^(k) (h + SiLU(W1^(k) h + b1^(k))))        (one residual block; L of them stacked)

where head k (k = 0..K-1 here) predicts token t+k+2, i.e. k+1 places beyond the backbone's own next token.
With `root_token` every head reads h_t + W e(x_{t+1}) instead of h_t: that next token (the root of the draft
tree, the backbone's own choice) through the frozen input embedding e and a zero-initialised W (Hydra, Ankner et
al. 2024, "Sequentially-Dependent Draft Heads for Medusa Decoding": its dependence on the root only).
Loss (Eq. 1): sum_k decay^k * CE_k, computed with the chunked linear cross-entropy (no K x N x V logits).
Options (models/losses.py): the acceptance-targeted LK objective or its CE hybrid (`ce_weight`, `lk_weight`),
and `soft_targets`: head k's row t trains on the backbone's own distribution for token t+k+2, i.e. its
softmax(lm_head(h_{t+k+1})) over the draft vocabulary (Medusa-2's self-distillation on logits), instead of
the data's hard token. The backbone's hidden state at every position is at hand (online or from the offline
cache), so the targets cost one no-grad projection per trained position, not another backbone pass.

With `draft_vocab_size` Dv > 0 the heads project onto Dv rows only (the most frequent labelled tokens, chosen
in `init_from_data`; models/draft_vocab.py): logits are over draft ids, `token_map` (a saved buffer) maps them to
target ids. A target outside the map adds no loss and counts as a miss (see models/draft_vocab.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from headstart.models.chunked_ce import compute_dtype, linear_cross_entropy, linear_soft_cross_entropy
from headstart.models.draft_vocab import RowCache, check_draft_vocab, select_from_data, target_to_draft
from headstart.models.drafter import DrafterBase
from headstart.models.eagle_ttt import teacher_targets
from headstart.models.feature_cache import cached_layers, check_hidden_cache
from headstart.models.losses import loss_mix


@dataclass
class MedusaConfig:
    num_heads: int = 4
    num_layers: int = 1  # residual blocks per head
    share_lm_head: bool = False  # reuse the frozen lm_head: saves K x V x H parameters
    decay: float = 0.8  # head k's loss weight is decay**k
    loss_chunk: int = 1024  # rows per chunk of the vocabulary projection in the loss
    # The backbone's last hidden state: "online" (a backbone forward in every step) or "offline" (computed once
    # before training, models/feature_cache.py): extra epochs then cost only the heads.
    hidden_cache: str = "online"
    hidden_cache_dtype: str = "bfloat16"  # bfloat16 | float16 | float32 (offline shards only)
    # 0: draft over the full vocabulary; else the heads' logits cover the Dv most frequent labelled tokens
    # (>= the backbone's vocabulary: the full one)
    draft_vocab_size: int = 0
    min_coverage: float = 0.9  # refuse a draft vocabulary that covers less of the labelled tokens than this
    # The token objective (models/losses.py): ce_weight * CE + lk_weight * (1 - acceptance); 1/0 = plain CE,
    # 0/1 = the LK loss alone, both > 0 = the hybrid
    ce_weight: float = 1.0
    lk_weight: float = 0.0
    # Train head k on the backbone's distribution at position t+k+1 (renormalised over the draft vocabulary)
    # instead of the data's token t+k+2; the rows trained stay those with a (draftable) label
    soft_targets: bool = False
    # The heads also read the root, the backbone's own next token x_{t+1} (known before drafting): their input
    # is h_t + W e(x_{t+1}), e the frozen input embedding, W zero-initialised (so fresh heads are Medusa's).
    # Hydra's sequential dependence (Ankner et al. 2024), its first step: head k no longer guesses the token
    # it is drafting after. Served by headstart's decoder and, through headstart's plugin, by vLLM; the Medusa
    # repo's layout reads h_t only and cannot hold them
    root_token: bool = False

    def __post_init__(self) -> None:
        loss_mix(self)
        if not 1 <= self.num_heads <= 16:
            raise ValueError(
                f"method.num_heads={self.num_heads}: must be in 1..16. Fix: method.num_heads=4 (the default) "
                "or another value in 1..16"
            )
        if not 0 <= self.num_layers <= 8:
            raise ValueError(f"method.num_layers={self.num_layers}: must be in 0..8")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"method.decay={self.decay}: must be in (0, 1]")
        if self.loss_chunk < 1:
            raise ValueError(f"method.loss_chunk={self.loss_chunk}: must be >= 1")
        check_hidden_cache(self)
        if self.draft_vocab_size < 0 or not 0 <= self.min_coverage <= 1:
            raise ValueError(
                f"method.draft_vocab_size={self.draft_vocab_size}, method.min_coverage={self.min_coverage}: "
                "must be >= 0 (0 = the full vocabulary) and in [0, 1]"
            )


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        # zero-init so a fresh block is the identity and a fresh head reproduces the frozen lm_head
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(DrafterBase):
    def __init__(self, cfg: MedusaConfig, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        dv = cfg.draft_vocab_size
        check_draft_vocab(dv, vocab_size)
        self.truncated = 0 < dv < vocab_size
        self.draft_vocab_size = dv if self.truncated else vocab_size
        if (
            self.truncated
        ):  # draft id -> target id; the real map comes from init_from_data (or the checkpoint)
            self.register_buffer("token_map", torch.arange(dv))
        self._rows = RowCache()  # the shared lm_head's token_map rows (not state: never saved)
        # one list comprehension per head and per block: never `[ResBlock(h)] * n` (that shares weights)
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(cfg.num_layers)])
            for _ in range(cfg.num_heads)
        )
        self.lm_heads = (
            None
            if cfg.share_lm_head
            else nn.ModuleList(
                nn.Linear(hidden_size, self.draft_vocab_size, bias=False) for _ in range(cfg.num_heads)
            )
        )
        self._shared_lm_head: list[nn.Module] = []  # a list so the frozen module is not registered/saved
        self.root_proj = nn.Linear(hidden_size, hidden_size, bias=False) if cfg.root_token else None
        if self.root_proj is not None:
            nn.init.zeros_(self.root_proj.weight)
        self._embed: list[nn.Module] = []  # the backbone's input embedding (root_token): not registered/saved

    def attach_embeddings(self, embed: nn.Module) -> None:
        """Bind the backbone's (frozen) input embedding, which `root_token` heads read the root through."""
        self._embed = [embed]

    @property
    def has_embeddings(self) -> bool:
        return bool(self._embed)

    def read_root(self, hidden: torch.Tensor, root: torch.Tensor | None) -> torch.Tensor:
        """hidden (..., H) in the blocks' dtype, root (...) token ids -> the heads' input: hidden itself, or with
        `root_token` hidden + W e(root)."""
        if self.root_proj is None:
            return hidden
        if root is None or not self._embed:
            raise RuntimeError(
                "root_token heads need the root token ids and the backbone's input embedding "
                "(attach_embeddings(backbone.embed_tokens))"
            )
        weight = self.root_proj.weight
        return hidden + self.root_proj(self._embed[0](root.to(self._embed[0].weight.device)).to(weight.dtype))

    def attach_lm_head(self, lm_head: nn.Module, init: bool = False) -> None:
        """Bind the backbone's lm_head: used directly when shared, else copied into each head when `init`
        (its token_map rows when the draft vocabulary is truncated)."""
        self._shared_lm_head = [lm_head]
        if init and self.lm_heads is not None:
            with torch.no_grad():
                w = lm_head.weight
                rows = w[self.token_map.to(w.device)] if self.truncated else w  # (Dv, H)
                for head in self.lm_heads:
                    head.weight.copy_(rows)

    def init_from_data(self, dataset) -> dict:
        """A truncated draft vocabulary: the most frequent labelled tokens of the training data, stored as the
        token_map buffer (saved with the weights); own heads restart from the frozen lm_head's rows for it.
        -> stats for the run's data_stats (the coverage lands in the checkpoint's config.json)."""
        if not self.truncated:
            return {}
        token_map, stats = select_from_data(
            dataset, self.vocab_size, self.draft_vocab_size, self.cfg.min_coverage
        )
        with torch.no_grad():
            self.token_map.copy_(token_map)
        if self._shared_lm_head:
            self.attach_lm_head(self._shared_lm_head[0], init=True)
        return stats

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids (any shape) -> target ids (the identity over the full vocabulary)."""
        return self.token_map[draft_ids] if self.truncated else draft_ids

    def head_weight(self, k: int) -> torch.Tensor:
        """(Dv, H) the vocabulary projection of head k: its own, or the shared lm_head's token_map rows."""
        if self.lm_heads is not None:
            return self.lm_heads[k].weight
        if not self._shared_lm_head:
            raise RuntimeError(
                "share_lm_head=True but no lm_head attached: call attach_lm_head(backbone.lm_head)"
            )
        weight = self._shared_lm_head[0].weight
        return self._rows.get(weight, self.token_map) if self.truncated else weight

    def feature_cache(self) -> tuple[tuple[int, ...], str] | None:
        """Offline: the final hidden state only (no aux layers)."""
        return cached_layers(self.cfg, ())

    def serving(self, backbone, meta: dict | None = None, live: bool = False) -> dict:
        """The tree is built from the checkpoint's measured per-head accuracies when it has them."""
        return {"drafter": self, "head_accuracy": (meta or {}).get("head_topk_accuracy")}

    def features(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """hidden (..., H) -> K tensors (..., H), the inputs to each head's vocabulary projection."""
        return [block(hidden) for block in self.blocks]

    def forward(
        self,
        hidden: torch.Tensor,
        labels: torch.Tensor | None = None,
        depth: int | None = None,
        root: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        projections: list[torch.Tensor] | None = None,
    ):
        """Without labels: hidden (..., H) -> logits (depth, ..., Dv) of the first `depth` heads (default all),
        for decoding a few positions (over draft ids when truncated: `to_target` maps them); `root` (...) the
        token each position's backbone chose next (read by `root_token` heads only); `projections`: the
        vocabulary projections to use instead of `projections(depth)`'s (a compiled decoder's views of them, held as
        its buffers). With labels: the training loss (see `loss`; `input_ids` give the roots); going through
        forward lets DDP/FSDP hook in."""
        if labels is not None:
            return self.loss(hidden, labels, input_ids)
        h = self.read_root(hidden.to(self.blocks_dtype), root)
        feats = torch.stack([block(h) for block in self.blocks[:depth]])  # (depth, ..., H)
        weights = self.projections(len(feats)) if projections is None else projections
        # cast the features, never the (V, H) weights: no per-step copy of the vocabulary projection
        if len(weights) == 1:  # shared lm_head: one matmul reads the (Dv, H) weight once, not depth times
            return feats.to(weights[0].dtype) @ weights[0].T
        return torch.stack([f.to(w.dtype) @ w.T for f, w in zip(feats, weights)])

    def projections(self, depth: int) -> list[torch.Tensor]:
        """The (Dv, H) vocabulary projections of the first `depth` heads: one when they share the lm_head."""
        return [self.head_weight(0)] if self.lm_heads is None else [self.head_weight(k) for k in range(depth)]

    @property
    def blocks_dtype(self) -> torch.dtype:
        """The residual blocks' dtype (fp32 master weights while training; the serving dtype once cast)."""
        for p in self.blocks.parameters():
            return p.dtype
        return self.head_weight(0).dtype

    def loss(
        self, hidden: torch.Tensor, labels: torch.Tensor, input_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """hidden (B, T, H) from the frozen backbone; labels (B, T) = input ids on trained tokens, -100 elsewhere;
        input_ids (B, T): the roots `root_token` heads read (position t's is token t+1), else unused.

        Returns (weighted summed loss, number of head-0 targets, metrics as summed counts). The caller divides
        by the global head-0 target count (all ranks), so the loss is a per-token mean that does not depend on
        how rows are split across processes.

        Truncated draft vocabulary: a target outside it has no class; its row adds no loss, still counts in
        head{k}/n (so it is a miss in top-1/top-5 and the rank histogram) and in head{k}/oov.
        """
        to_draft = target_to_draft(self.token_map, self.vocab_size) if self.truncated else None  # (V,)
        # the heads' input at every position but the last, read once for all heads (root t is token t+1)
        inputs = hidden
        if self.root_proj is not None:
            inputs = self.read_root(hidden[:, :-1].to(self.blocks_dtype), input_ids[:, 1:])
        table, index = self._teacher(hidden, labels) if self.cfg.soft_targets else (None, None)
        feats, targets, rows_at, counts, oov = [], [], [], [], []
        for k, block in enumerate(self.blocks):
            shift = k + 2
            target = labels[:, shift:]  # (B, T-shift)
            valid = target != -100
            counts.append(valid.sum())
            if to_draft is not None:
                target = to_draft[target.clamp_min(0)].masked_fill(~valid, -1)  # (B, T-shift) draft ids
                oov.append((valid & (target < 0)).sum())
                valid = target >= 0
            # (N_k, H) only rows that have a (draftable) target
            h = inputs[:, : hidden.shape[1] - shift][valid]
            feats.append(block(h.to(self.blocks_dtype)))
            targets.append(target[valid])
            if index is not None:  # the teacher's row of position t+k+1 (it predicts token t+k+2)
                rows_at.append(index[:, shift - 1 : -1][valid])
        loss, seg_loss, hist = self._project(feats, targets, table, rows_at)
        metrics = {}
        for k, n in enumerate(counts):
            metrics[f"head{k}/loss_sum"] = seg_loss[k].detach()
            metrics[f"head{k}/rank_hist"] = hist[k]  # (RANKS,) counts; top-1 = [0]; the rest in eval mode
            metrics[f"head{k}/n"] = n  # every target, draftable or not
            if oov:
                metrics[f"head{k}/oov"] = oov[k]
        count = counts[0]
        return loss, count, metrics

    def _teacher(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Soft targets: the backbone's next-token distribution at each position j >= 1 whose next token is
        labelled, over the draft vocabulary -> (table (M, Dv), index (B, T) = table row of position j)."""
        need = torch.zeros_like(labels, dtype=torch.bool)
        need[:, 1:-1] = labels[:, 2:] != -100  # position 0 feeds no head: head 0 starts at token 2
        index = need.flatten().cumsum(0).view_as(need) - 1  # (B, T)
        w = self._shared_lm_head[0].weight
        w_t = w[self.token_map.to(w.device)] if self.truncated else w  # (Dv, H) the frozen projection
        probs, _ = teacher_targets(hidden[need], w_t, self.cfg.loss_chunk, compute_dtype(hidden))
        return probs, index

    def _project(self, feats, targets, table, rows_at):
        """The heads' features through their vocabulary projections -> (weighted loss, per-head loss sums,
        per-head rank histograms). Against the hard targets, or the teacher's `table` rows `rows_at` (the
        hard targets then only ranked, so accuracy keeps meaning agreement with the data)."""
        full_ranks, chunk, mix, decay = (
            not self.training,
            self.cfg.loss_chunk,
            loss_mix(self.cfg),
            self.cfg.decay,
        )
        device = targets[0].device

        def call(x, w, t, k, **kw):
            if table is None:
                return linear_cross_entropy(x, w, t, chunk, full_ranks, mix=mix, **kw)
            return linear_soft_cross_entropy(x, w, table, t, chunk, k, full_ranks=full_ranks, mix=mix, **kw)

        if self.lm_heads is None:  # one shared projection: every head's rows in one call (cast once)
            segment = torch.cat([torch.full_like(t, k) for k, t in enumerate(targets)])
            weight = torch.cat([torch.full(t.shape, decay**k) for k, t in enumerate(targets)]).to(device)
            at = torch.cat(rows_at) if rows_at else None
            kw = {"segment": segment, "segments": len(targets), "row_weight": weight}
            return call(torch.cat(feats), self.head_weight(0), torch.cat(targets), at, **kw)
        loss, seg_loss, hist = feats[0].new_zeros((), dtype=torch.float32), [], []
        for k, (f, t) in enumerate(zip(feats, targets)):
            ce, sl, hk = call(f, self.head_weight(k), t, rows_at[k] if rows_at else None)
            loss, seg_loss, hist = loss + decay**k * ce, seg_loss + [sl[0]], hist + [hk[0]]
        return loss, seg_loss, hist


def build(cfg: MedusaConfig, backbone, meta: dict | None = None) -> MedusaHeads:
    """Heads for `backbone`, each starting as its frozen lm_head (shared or copied)."""
    heads = MedusaHeads(cfg, backbone.hidden_size, backbone.vocab_size)
    heads.attach_lm_head(backbone.lm_head, init=True)
    heads.attach_embeddings(backbone.embed_tokens)
    return heads
