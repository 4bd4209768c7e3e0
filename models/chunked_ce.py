"""Cross-entropy through a vocabulary projection without materializing the (N, V) logits at once.

`linear_cross_entropy(x, W, target)` equals `F.cross_entropy(x @ W.T, target, reduction="sum")`, but walks the
N rows in chunks: each chunk's logits are formed, reduced to the loss and turned into the gradients for x and W
right away (the Liger-kernel "fused linear cross-entropy" trick), so peak memory holds one chunk's logits
instead of N x V (for 4 Medusa heads on batch 4 x 512 and a 49k vocabulary that is 1.6 GB in fp32).

It also returns, for free, a histogram of the target's rank among the logits (ranks 0..RANKS-1): top-1 and
top-5 accuracy come from it, and the decoder builds trees from it.
"""

from __future__ import annotations

import torch

RANKS = 10


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, chunk: int, compute_dtype: torch.dtype, full_ranks: bool):  # noqa: D102
        n = x.shape[0]
        need_gx, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(compute_dtype)
        acc = torch.promote_types(compute_dtype, torch.float32)  # fp32, or fp64 when inputs are fp64
        grad_x = torch.empty_like(x) if need_gx else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_gw else None
        loss = torch.zeros((), dtype=acc, device=x.device)
        hist = torch.zeros(RANKS + 1, dtype=torch.long, device=x.device)  # last bucket: rank >= RANKS
        for s in range(0, n, chunk):
            xc = x[s : s + chunk].to(compute_dtype)  # (n, H)
            tc = target[s : s + chunk, None]  # (n, 1)
            logits = xc @ w.T  # (n, V) in the compute dtype: no fp32 copy of the chunk on the hot path
            if full_ranks:  # how many tokens beat the target, in full precision (eval only: an extra pass)
                lf = logits.to(acc)
                rank = (lf > lf.gather(1, tc)).sum(-1)
            # softmax in the compute dtype (the kernel accumulates in fp32); bf16 p_t costs < 0.01 nats of
            # loss precision, and the gradient below is cast to the compute dtype for the matmul anyway.
            probs = torch.softmax(logits, dim=-1)  # (n, V)
            del logits
            p_t = probs.gather(1, tc)  # (n, 1)
            loss -= p_t.to(acc).clamp_min(torch.finfo(acc).tiny).log().sum()
            if not full_ranks:  # top-1 only (training steps): one max-reduction, much cheaper than argmax
                rank = (p_t.squeeze(1) < probs.amax(-1)).long() * RANKS
            hist += torch.bincount(rank.clamp_max(RANKS), minlength=RANKS + 1)
            if need_gx or need_gw:
                g = probs.scatter_add_(
                    1, tc, torch.full_like(p_t, -1.0)
                )  # d loss / d logits = softmax - onehot
                if need_gx:
                    grad_x[s : s + chunk] = (g @ w).to(x.dtype)
                if need_gw:
                    grad_w += (g.T @ xc).to(acc)
        ctx.save_for_backward(grad_x if need_gx else None, grad_w if need_gw else None)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(hist)
        return loss, hist[:RANKS]

    @staticmethod
    def backward(ctx, grad_loss, _ghist):  # noqa: D102
        grad_x, grad_w = ctx.saved_tensors
        gx = grad_x * grad_loss.to(grad_x.dtype) if grad_x is not None else None
        gw = (grad_w * grad_loss).to(ctx.weight_dtype) if grad_w is not None else None
        return gx, gw, None, None, None, None


def linear_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, chunk: int = 1024, full_ranks: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed CE of `x @ weight.T` against `target`, and counts of the target's rank (RANKS,): hist[r] rows
    had exactly r logits above the target's (so hist[0] = top-1 hits, hist[:5].sum() = top-5 hits). With
    `full_ranks=False` only hist[0] is filled (training steps: saves a pass over the vocabulary).

    x: (N, H), weight: (V, H), target: (N,) with every entry a valid class (filter ignored rows first).
    Matmuls run in the autocast dtype when autocast is on, else in x's dtype; the loss is accumulated in fp32.
    """
    if x.shape[0] == 0:
        zero = x.sum() * 0.0 + weight.sum() * 0.0  # keeps the graph connected (DDP expects every param used)
        return zero.float(), torch.zeros(RANKS, dtype=torch.long, device=x.device)
    device_type = x.device.type
    compute_dtype = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
    )
    with torch.autocast(device_type, enabled=False):
        return _LinearCE.apply(x, weight, target, chunk, compute_dtype, full_ranks)
