"""Summed training metrics, reduced across processes before they become means (so a per-head accuracy is
hits / targets over all ranks, not a mean of per-rank ratios).

Keys: `loss_sum` and `count` (every method); `head{k}/...` (Medusa-style heads); any other top-level
`<name>_sum` becomes `<name>` = sum / count (e.g. DistillSpec's `accept_sim_sum`)."""

from __future__ import annotations

import math
import time

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
            out[f"{prefix}head{k}/top1"] = hist[0].item()  # out-of-draft-vocabulary targets are misses
            if f"head{k}/oov" in totals:  # their share (a truncated draft vocabulary)
                out[f"{prefix}head{k}/oov"] = (totals[f"head{k}/oov"] / n).item()
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


class GradNorm:
    """Clips the drafter's gradients and keeps the global norm before clipping, averaged over the log interval
    (DeepSpeed clips itself: its engine's norm)."""

    def __init__(self) -> None:
        self.total, self.n = 0.0, 0

    def add(self, acc: Accelerator, drafter, max_norm: float) -> None:
        norm = acc.clip_grad_norm_(drafter.parameters(), max_norm)
        if norm is None and hasattr(drafter, "get_global_grad_norm"):
            norm = drafter.get_global_grad_norm()
        if norm is not None and math.isfinite(float(norm)):
            self.total, self.n = self.total + float(norm), self.n + 1

    def summarize(self) -> dict[str, float]:
        out = {"train/grad_norm": self.total / self.n} if self.n else {}
        self.total, self.n = 0.0, 0
        return out


class Throughput:
    """Tokens (non-padding) and samples per second over the log interval, summed over processes."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.start, self.tokens, self.samples = time.perf_counter(), 0, 0

    def add(self, batch: dict) -> None:
        mask = batch.get("attention_mask")
        self.tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        self.samples += len(batch["input_ids"])

    def summarize(self, acc: Accelerator) -> dict[str, float]:
        counts = torch.tensor([self.tokens, self.samples], dtype=torch.float64, device=acc.device)
        tokens, samples = acc.reduce(counts, reduction="sum").tolist()
        seconds = max(time.perf_counter() - self.start, 1e-9)
        self.reset()
        return {"train/tokens_per_s": tokens / seconds, "train/samples_per_s": samples / seconds}


def progress(step: int, t, num_processes: int, batches_per_epoch: int) -> dict[str, float]:
    """Samples seen (all processes) and epochs (fractional) after `step` optimizer steps."""
    micro = step * t.grad_accum  # micro-batches each process has taken
    return {
        "train/samples_seen": float(micro * t.micro_batch_size * num_processes),
        "train/epoch": micro / batches_per_epoch,
    }
