"""Summed training metrics, reduced across processes before they become means (so a per-head accuracy is
hits / targets over all ranks, not a mean of per-rank ratios).

Keys: `loss_sum` and `count` (every method); `head{k}/...` (Medusa-style heads); any other top-level
`<name>_sum` becomes `<name>` = sum / count (e.g. DistillSpec's `accept_sim_sum`)."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from headstart.models.chunked_ce import RANKS


class MetricSums:
    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for key, value in metrics.items():
            value = value.detach().double()
            self.sums[key] = self.sums[key] + value if key in self.sums else value

    def summarize(self, acc: Accelerator, prefix: str) -> dict[str, float]:
        if not self.sums:
            return {}
        keys = sorted(self.sums)
        flat = torch.cat([self.sums[k].reshape(-1) for k in keys]).to(acc.device)
        flat = acc.reduce(flat, reduction="sum").cpu()
        totals, i = {}, 0
        for key in keys:
            n = self.sums[key].numel()
            totals[key] = flat[i : i + n]
            i += n
        count = totals["count"].clamp_min(1)
        out = {f"{prefix}loss": (totals["loss_sum"] / count).item()}
        for key in keys:
            if key.endswith("_sum") and "/" not in key and key != "loss_sum":
                out[f"{prefix}{key[: -len('_sum')]}"] = (totals[key] / count).item()
        k = 0
        while f"head{k}/n" in totals:
            n = totals[f"head{k}/n"].clamp_min(1)
            hist = totals[f"head{k}/rank_hist"] / n
            out[f"{prefix}head{k}/loss"] = (totals[f"head{k}/loss_sum"] / n).item()
            out[f"{prefix}head{k}/top1"] = hist[0].item()
            if prefix == "eval/":  # training steps only count top-1 (see linear_cross_entropy's full_ranks)
                out[f"{prefix}head{k}/top5"] = hist[:5].sum().item()
                out |= {f"{prefix}head{k}/rank{r}": hist[r].item() for r in range(len(hist))}
            k += 1
        return out


def head_topk_accuracy(eval_metrics: dict) -> list[list[float]]:
    """Per head, P(target has rank r) for r = 0..9 on held-out data: the decoder builds trees from it."""
    out, k = [], 0
    while f"eval/head{k}/rank0" in eval_metrics:
        out.append([eval_metrics[f"eval/head{k}/rank{r}"] for r in range(RANKS)])
        k += 1
    return out
