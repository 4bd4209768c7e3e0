"""Cross-entropy through a vocabulary projection without materializing the (N, V) logits at once.

`linear_cross_entropy(x, W, target)` equals `F.cross_entropy(x @ W.T, target, reduction="sum")`, but walks the
N rows in chunks: each chunk's logits are formed, reduced to the loss and turned into the gradients for x and W
right away (the Liger-kernel "fused linear cross-entropy" trick), so peak memory holds one chunk's logits
instead of N x V (for 4 Medusa heads on batch 4 x 512 and a 49k vocabulary that is 1.6 GB in fp32), and
backward only scales the stored gradients: nothing is recomputed.

`linear_soft_cross_entropy(x, W, probs, top)` is the same with a soft target: -sum_v p_v log softmax(x @ W.T)_v
against a teacher's probabilities (EAGLE's loss), whose gradient wrt the logits is softmax - p.

Both take several losses in one call: `segment` (N,) says which loss each row belongs to (Medusa's heads,
EAGLE-3's training-time-test steps, all through one projection) and `row_weight` (N,) weighs rows (their
decay); the projection is then cast once, its gradient accumulated in one buffer, and the per-chunk (n, V)
buffers are reused across chunks (fresh 100 MB allocations page-fault on every chunk; on a CPU that costs more
than the softmax).

They also return, for free, a histogram of the target's rank among the logits (ranks 0..RANKS-1) per segment:
top-1 and top-5 accuracy come from it, and the decoder builds trees from it.

`mix` (models/losses.py `LossMix`) turns the objective into w_ce * CE + w_lk * (1 - acceptance), the LK loss:
with a hard target its gradient is CE's scaled per row by q_t; with a soft one it takes a (n, V) bool mask
[q < p] and two more passes over the chunk, still one chunk's logits at a time.
"""

from __future__ import annotations

import torch

from headstart.models.losses import LossMix

RANKS = 10
CE = LossMix()  # plain cross-entropy, the default objective


def _objective(probs, logits, p_t, p_max, tc, sc, mix: LossMix, below_buf, grad: bool):
    """One chunk's rows: probs (n, V) = softmax(logits), p_t (n, 1) its value at tc (n, 1) (the target class
    or the teacher's top), p_max (n,) its max, soft targets sc (n, V) or None -> (row loss (n,) in fp32 or
    fp64, d loss / d logits (n, V) written over probs, or None without `grad`). `logits` is clobbered (reused
    as scratch). The LK terms follow models/losses.py."""
    acc = torch.promote_types(probs.dtype, torch.float32)
    row_loss = torch.zeros(probs.shape[0], dtype=acc, device=probs.device)
    if sc is None:
        if mix.ce:
            row_loss += mix.ce * -p_t.squeeze(1).to(acc).clamp_min(torch.finfo(acc).tiny).log()
        if mix.lk:  # one-hot p: acceptance = q_t, gradient q_t (q - e_t)
            row_loss += mix.lk * (1.0 - p_t.squeeze(1).to(acc))
        if not grad:
            return row_loss, None
        g = probs.scatter_add_(1, tc, torch.full_like(p_t, -1.0))  # softmax - onehot
        if not mix.is_ce:
            g.mul_(mix.ce + mix.lk * p_t)
        return row_loss, g
    if mix.ce:  # -sum_v p_v log q_v = logsumexp(z) - p.z, with logsumexp(z) = max(z) - log q_max
        lse = logits.amax(-1).to(acc) - p_max.to(acc).log()  # (n,)
        # (n,) p.z, summed in the compute dtype (an fp32 sum would copy the chunk): the logged loss
        # moves by ~1e-3 nats per row in bf16; the gradient does not depend on it
        row_loss += mix.ce * (lse - torch.mul(sc, logits, out=logits).sum(-1).to(acc))
    if not mix.lk:
        return row_loss, probs.sub_(sc) if grad else None  # softmax - p
    below = torch.lt(probs, sc, out=below_buf[: probs.shape[0]])  # (n, V) m_v = [q_v < p_v]
    p_above = sc.sum(-1) - torch.mul(sc, below, out=logits).sum(-1)  # sum of p where q >= p
    mq = torch.mul(probs, below, out=logits)  # (n, V) m_v q_v
    a = mq.sum(-1)  # (n,) A
    row_loss += mix.lk * (1.0 - (a + p_above).to(acc))
    if not grad:
        return row_loss, None
    # ce (q - p) + lk q (A - m): in place over probs
    g = probs.mul_((mix.ce + mix.lk * a)[:, None]).sub_(sc, alpha=mix.ce).sub_(mq, alpha=mix.lk)
    return row_loss, g


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x, weight, target, soft, index, row_weight, segment, segments, chunk, dtype, full_ranks, mix
    ):  # noqa: D102
        # target (N,) long: the class (hard CE) or, with soft (M, V) probabilities (row index[n] for row n),
        # the teacher's top class, which `hist` ranks.
        n, vocab = x.shape[0], weight.shape[0]
        need_gx, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)  # fp32, or fp64 when inputs are fp64
        grad_x = torch.empty_like(x) if need_gx else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_gw else None
        loss = torch.zeros((), dtype=acc, device=x.device)
        seg_loss = torch.zeros(segments, dtype=acc, device=x.device)
        hist = torch.zeros(segments, RANKS + 1, dtype=torch.long, device=x.device)  # last: rank >= RANKS
        hits = torch.empty(n, dtype=torch.bool, device=x.device)  # per row: the target is the argmax
        rows = min(chunk, n)
        logits_buf, probs_buf = (torch.empty(rows, vocab, dtype=dtype, device=x.device) for _ in range(2))
        soft_buf = torch.empty(rows, vocab, dtype=dtype, device=x.device) if soft is not None else None
        lk_soft = soft is not None and mix.lk > 0
        below_buf = torch.empty(rows, vocab, dtype=torch.bool, device=x.device) if lk_soft else None
        gw_buf = torch.empty(weight.shape, dtype=dtype, device=x.device) if need_gw else None
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            xc = x[s:e].to(dtype)  # (n, H)
            tc = target[s:e, None]  # (n, 1)
            logits = torch.mm(xc, w.T, out=logits_buf[: e - s])  # (n, V) in the compute dtype
            if full_ranks:  # how many tokens beat the target, in full precision (eval only: an extra pass)
                lf = logits.to(acc)
                rank = (lf > lf.gather(1, tc)).sum(-1)
            # softmax in the compute dtype (the kernel accumulates in fp32); bf16 p_t costs < 0.01 nats of
            # loss precision, and the gradient below is cast to the compute dtype for the matmul anyway.
            probs = torch.ops.aten._softmax.out(logits, -1, False, out=probs_buf[: e - s])  # (n, V)
            p_t, p_max = probs.gather(1, tc), probs.amax(-1)  # (n, 1), (n,)
            if not full_ranks:  # top-1 only (training steps): one max-reduction, much cheaper than argmax
                rank = (p_t.squeeze(1) < p_max).long() * RANKS
            sc = None
            if soft is not None:
                sc = soft_buf[: e - s]
                if index is not None:
                    torch.index_select(soft, 0, index[s:e], out=sc)
                else:
                    sc.copy_(soft[s:e])
            row_loss, g = _objective(probs, logits, p_t, p_max, tc, sc, mix, below_buf, need_gx or need_gw)
            seg = segment[s:e] if segment is not None else None
            rw = row_weight[s:e].to(acc) if row_weight is not None else None
            loss += (row_loss * rw).sum() if rw is not None else row_loss.sum()
            rank = rank.clamp_max(RANKS)
            hits[s:e] = rank == 0
            if seg is None:
                seg_loss += row_loss.sum()
                hist[0] += torch.bincount(rank, minlength=RANKS + 1)
            else:
                seg_loss.index_add_(0, seg, row_loss)
                hist.index_put_((seg, rank), torch.ones_like(rank), accumulate=True)
            if need_gx or need_gw:
                if rw is not None:
                    g.mul_(rw.to(dtype)[:, None])
                if need_gx:
                    grad_x[s:e] = (g @ w).to(x.dtype)
                if need_gw:
                    grad_w += torch.mm(g.T, xc, out=gw_buf)
        ctx.save_for_backward(grad_x if need_gx else None, grad_w if need_gw else None)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(seg_loss, hist, hits)
        return loss, seg_loss, hist[:, :RANKS], hits

    @staticmethod
    def backward(ctx, grad_loss, _gseg, _ghist, _ghits):  # noqa: D102
        grad_x, grad_w = ctx.saved_tensors
        gx = grad_x * grad_loss.to(grad_x.dtype) if grad_x is not None else None
        gw = (grad_w * grad_loss).to(ctx.weight_dtype) if grad_w is not None else None
        return gx, gw, *[None] * 10


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on `x` run in: the autocast dtype when autocast is on, else x's own."""
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype


def _apply(x, weight, target, soft, index, row_weight, segment, segments, chunk, full_ranks, mix, hits_out):
    if x.shape[0] == 0:
        zero = x.sum() * 0.0 + weight.sum() * 0.0  # keeps the graph connected (DDP expects every param used)
        empty = torch.zeros(segments, dtype=torch.float32, device=x.device)
        return zero.float(), empty, torch.zeros(segments, RANKS, dtype=torch.long, device=x.device)
    dtype = compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        loss, seg_loss, hist, hits = _LinearCE.apply(
            x, weight, target, soft, index, row_weight, segment, segments, chunk, dtype, full_ranks, mix
        )
    if hits_out is not None:
        hits_out.copy_(hits)
    return loss, seg_loss, hist


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    chunk: int = 1024,
    full_ranks: bool = True,
    segment: torch.Tensor | None = None,
    segments: int = 1,
    row_weight: torch.Tensor | None = None,
    mix: LossMix = CE,
    hits_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed CE of `x @ weight.T` against `target` -> (loss, per-segment loss sums (S,), rank counts (S,
    RANKS)): hist[k, r] rows of segment k had exactly r logits above the target's (hist[k, 0] = top-1 hits,
    hist[k, :5].sum() = top-5 hits). With `full_ranks=False` only hist[:, 0] is filled (training steps: saves a
    pass over the vocabulary).

    x: (N, H), weight: (V, H), target: (N,) with every entry a valid class (filter ignored rows first);
    segment: (N,) long in [0, segments) (default: all 0); row_weight: (N,) scales each row's loss (the
    returned loss is the weighted sum; the per-segment sums are unweighted). Matmuls run in the autocast
    dtype when autocast is on, else in x's dtype; the loss is accumulated in fp32.

    mix: the objective per row, mix.ce * CE + mix.lk * (1 - q_target) (the LK loss of a one-hot target,
    models/losses.py); the per-segment sums are of that objective. hits_out: (N,) bool, filled with each
    row's top-1 hit (the target is the argmax), e.g. for GRIFFIN's mask of the next step.
    """
    return _apply(
        x, weight, target, None, None, row_weight, segment, segments, chunk, full_ranks, mix, hits_out
    )


def linear_soft_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    probs: torch.Tensor,
    top: torch.Tensor,
    chunk: int = 1024,
    index: torch.Tensor | None = None,
    segment: torch.Tensor | None = None,
    segments: int = 1,
    row_weight: torch.Tensor | None = None,
    full_ranks: bool = False,
    mix: LossMix = CE,
    hits_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed soft cross-entropy -sum_n sum_v P[n, v] log softmax(x @ weight.T)[n, v] -> like
    `linear_cross_entropy`, the histogram ranking the teacher's argmax (`top`) among the student's logits.

    probs: (M, V) teacher probabilities, rows summing to 1 (no grad; any float dtype, e.g. bf16 to keep a
    table of them small); row n's target is probs[index[n]] (index: (N,) long; default: row n); top: (N,)
    the teacher's argmax for each row of x. mix: mix.ce * soft CE + mix.lk * (1 - sum_v min(P, Q)) (the LK
    loss, models/losses.py); hits_out as in `linear_cross_entropy`, for `top`.
    """
    soft = probs.detach()
    return _apply(
        x, weight, top, soft, index, row_weight, segment, segments, chunk, full_ranks, mix, hits_out
    )
