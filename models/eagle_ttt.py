"""What EAGLE training computes beside the draft layer: the training-time-test attention, the teacher's
probabilities, and EAGLE-1's feature loss.

Training-time test (EAGLE-3, Sec. 3.3) unrolls the drafter: step s feeds step s-1's outputs back in, and row t
of step s attends to the step-0 rows <= t and to its own row of steps 1..s (SpecForge's extended mask,
`ttt_mask`). Only the step-0 block is a real (T x T) causal attention; the other s keys of a row are its own,
so `eagle_attention` scores them with s dot products instead of a (T, (s+1) T) masked matrix: the softmax runs
over T + s columns, not (s+1) T. The result equals SDPA under `ttt_mask` (tested), at a fraction of the work.

Rows that train nothing after step 0 (the prompt: step s >= 1 of row t is trained only when token t+2+s is
labelled) are still needed at step 0, whose keys every later row reads, but not after it: `pack_rows` lists
the rows some later step trains, and steps 1.. run on those alone (`ttt_rows`: each query's step-0 position),
with the same result on them, since a row of step s >= 1 reads only the step-0 keys and its own.

The teacher's next-token probabilities do not depend on the step: step s's row t is trained on the target's
distribution at position t + s. `teacher_targets` therefore computes them once per batch, chunk by chunk,
restricted and renormalised over the draft vocabulary, and the steps index into that (N, Dv) table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from headstart.models.families import softcap

ATTENTION = "headstart_eagle"  # the draft layer's attn_implementation


def smooth_l1_sum(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N, H), (N, H) -> SmoothL1 (beta 1) averaged over H, summed over rows (EAGLE-1's feature loss)."""
    return F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1).sum()


def ttt_mask(key_valid: torch.Tensor, step: int) -> torch.Tensor:
    """key_valid (B, T) bool -> (B, 1, T, (step+1) T) bool, True = attend: row t sees the valid step-0 rows
    <= t (always itself) and its own row in steps 1..step (training-time test; SpecForge's extended mask)."""
    b, t = key_valid.shape
    eye = torch.eye(t, dtype=torch.bool, device=key_valid.device).expand(b, t, t)
    causal = torch.ones(t, t, dtype=torch.bool, device=key_valid.device).tril()[None] & key_valid[:, None, :]
    return torch.cat([causal | eye] + [eye] * step, dim=-1)[:, None]


def step0_mask(key_valid: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """key_valid (B, T) bool, rows (B, L) long: each query's step-0 position -> (B, 1, L, T) bool, True =
    attend: the valid step-0 keys <= the query's position, and always its own (`ttt_mask`'s first block)."""
    keys = torch.arange(key_valid.shape[1], device=rows.device)  # (T,)
    causal = (keys[None, None] <= rows[..., None]) & key_valid[:, None, :]  # (B, L, T)
    return (causal | (keys[None, None] == rows[..., None]))[:, None]


def pack_rows(live: torch.Tensor) -> torch.Tensor:
    """live (B, T) bool -> (B, L) long, L = the most live rows of any sequence: each sequence's live positions
    in order, then (as padding, computed and never read) its first other positions. Boolean indexing of a
    packed tensor by `mask.gather(1, order)` then yields the rows in the order full-layout indexing would."""
    order = torch.sort((~live).to(torch.int8), dim=1, stable=True).indices  # live first, each in order
    return order[:, : max(int(live.sum(1).max()), 1)]


def eagle_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The draft layer's attention. With `ttt_valid` ((B, T) bool: which step-0 rows are real tokens) the
    keys are the training-time-test cache, a block of T step-0 rows then s blocks of the queries' own rows,
    and row t attends as `ttt_mask` says; `ttt_rows` (B, L) gives each query's step-0 position when a step
    runs on a subset of the rows (`pack_rows`; default: all T in order). Without `ttt_valid`, plain SDPA
    under `attention_mask` (decoding, tree masks)."""
    valid, rows = kwargs.pop("ttt_valid", None), kwargs.pop("ttt_rows", None)
    if valid is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    b, heads, n, _ = query.shape  # query (B, h, L, d); key, value (B, kvh, T + s L, d)
    t = valid.shape[1]
    groups = heads // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)  # (B, h, T + s L, d)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    blocks = [t] + [n] * ((key.shape[2] - t) // n)
    keys, values = key.split(blocks, 2), value.split(blocks, 2)  # (B, h, T, d), then s x (B, h, L, d)
    scores = (query @ keys[0].transpose(-1, -2)) * scale  # (B, h, L, T)
    mask = ttt_mask(valid, 0) if rows is None else step0_mask(valid, rows)
    scores = scores.masked_fill(~mask, float("-inf"))
    own = [(query * k).sum(-1, keepdim=True) * scale for k in keys[1:]]  # s x (B, h, L, 1)
    # softmax accumulates in fp32 inside the kernel; its output in the compute dtype, like flash attention's P
    probs = torch.softmax(torch.cat([scores, *own], -1), -1)  # (B, h, L, T + s)
    out = probs[..., :t] @ values[0]
    for j, v in enumerate(values[1:]):
        out = out + probs[..., t + j, None] * v
    return out.transpose(1, 2).contiguous(), None  # (B, T, h, d) like every attention function


AttentionInterface.register(ATTENTION, eagle_attention)


@torch.no_grad()
def teacher_targets(
    target: torch.Tensor, weight: torch.Tensor, chunk: int, dtype: torch.dtype, cap: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """target (N, H) the backbone's final normed features, weight (Dv, H) its lm_head rows of the draft
    vocabulary -> (probs (N, Dv) in `dtype`, renormalised over those rows; top (N,) their argmax). Chunked:
    one chunk's logits at a time, never an (N, V) fp32 tensor. `cap`: the backbone's final logit soft cap
    (Gemma-2), applied before the softmax as the target's own forward does."""
    w = weight.to(dtype)
    probs = torch.empty(target.shape[0], w.shape[0], dtype=dtype, device=target.device)
    for s in range(0, target.shape[0], chunk):
        probs[s : s + chunk] = torch.softmax(softcap(target[s : s + chunk].to(dtype) @ w.T, cap), -1)
    return probs, probs.argmax(-1)
