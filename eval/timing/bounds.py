"""Physical checks on a measured speedup: clean step costs, the bound tau puts on speedup, and the speedup the
step costs predict.

Per emitted token, vanilla decoding pays one width-1 target forward; speculative decoding pays one verify forward
of width W (root + candidates) plus the drafter per 1/tau tokens. A verify forward costs at least a width-1 one
(c_W >= c_1), and the prefill is the same on both sides, so

    speedup <= max(1, tau * c_1 / c_W) <= max(1, tau)                                             (the bound)

(Leviathan et al. 2023, Sec. 3.4, with the drafter's cost dropped). The step costs c_1 and c_W come from a
microbenchmark of a fresh `ModelRunner` on the same backbone: the two widths timed back to back, alternating,
`cost_reps` times each, medians. The *predicted* speedup puts them into each turn's own figures: vanilla takes
prefill + steps_v * (v + b_v), spec takes prefill + steps_s * (v * c_W / c_1 + d + b_s), where v is the vanilla
step cost measured during the run (so load that slows both sides alike scales the prediction too), d and b the
measured drafter and bookkeeping costs per step (medians over the run's pairs). A measured figure off its
prediction by more than `bound_tol` means one side's target forwards ran slower (or faster) than a forward of
its width costs: load that hit one side. Such a figure is re-measured, and flagged if it stays off.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import Tree, chain_tree
from headstart.eval.timing.harness import Interleaved


def verify_shape(decoder) -> tuple[int, Tree | None]:
    """(verify width, the tree verified) of a decoder: (1, None) for vanilla; a dynamic-tree method's largest
    tree is timed as a chain of that width."""
    proposer = decoder.proposer
    if proposer is None:
        return 1, None
    tree = getattr(proposer, "tree", None)
    if not isinstance(tree, Tree) or tree.size != proposer.width:
        tree = chain_tree(proposer.width - 1)
    return proposer.width, tree


def step_costs(
    backbone,
    shapes: dict[str, tuple[int, Tree | None]],
    context: list[int],
    reps: int,
    compiled: dict[str, bool] | None = None,
    max_cache_len: int = 0,
) -> dict:
    """Median seconds of one target forward per named (width, tree) after `context` is cached, each step built
    as the decoder builds it (root tensor, candidates appended). -> {name: seconds}. `compiled`: the names whose
    decoder ran that width compiled (eval/engine/compiled.py), timed on a compiled runner of the decoders'
    `max_cache_len` (so its graphs are the ones already compiled), the rest on an eager one."""
    width = max(w for w, _ in shapes.values())
    need, cuda = len(context) + width + 1, backbone.device.type == "cuda"
    runners = {
        c: ModelRunner(backbone, max(max_cache_len, need), cuda, "max-autotune")
        if c
        else ModelRunner(backbone, need, cuda)
        for c in {bool((compiled or {}).get(name)) for name in shapes}
    }
    dev = backbone.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    pool = context[::-1] * (width // len(context) + 1)  # a context shorter than the widest step repeats
    candidates = torch.tensor(pool[: width - 1] or [0], device=dev)
    names = list(shapes)
    times: dict[str, list[float]] = {n: [] for n in names}
    # runners built outside inference mode (their caches as the decoders'), stepped inside it as the decoders
    # are: a compiled graph guards on its inputs' dispatch keys, and would otherwise be compiled again (~1 GB)
    with torch.inference_mode():
        for r in runners.values():
            r.prefill(context)
        for rep in range(reps + 1):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                w, tree = shapes[name]
                runner = runners[bool((compiled or {}).get(name))]
                sync()
                t0 = time.perf_counter()
                root = torch.tensor([context[-1]], device=dev)
                if tree is None:
                    runner.step(root, last_only=True)
                else:
                    runner.step(torch.cat([root, candidates[: w - 1]]), tree)
                sync()
                if rep > 0:  # the first round warms kernels and CUDA graphs up
                    times[name].append(time.perf_counter() - t0)
    return {n: float(np.median(t)) for n, t in times.items()}


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else 0.0


def predict(timer: Interleaved, costs: dict) -> dict:
    """Per-step costs seen during the run and the speedup the clean step costs predict (median over units)."""
    pairs = list(timer.samples.values())

    def per_step(side: str, key: str) -> float:
        return _median([s[side].extra[key] / max(s[side].steps - 1, 1) for s in pairs])

    v_verify = per_step("vanilla", "verify")
    v_step = v_verify + per_step("vanilla", "draft") + per_step("vanilla", "bookkeeping")
    s_verify = v_verify * costs["spec"] / costs["vanilla"]  # a width-W forward, in the run's own clock
    s_step = s_verify + per_step("spec", "draft") + per_step("spec", "bookkeeping")
    by_unit: dict[int, list[float]] = {}
    for (unit, _), s in timer.samples.items():
        by_unit.setdefault(unit, []).append(min(s["vanilla"].extra["prefill"], s["spec"].extra["prefill"]))
    preds = []
    for (unit, rnd), s in timer.samples.items():
        if rnd:  # one prediction per unit: the token and step counts do not change between rounds
            continue
        prefill = _median(by_unit[unit])
        t_v = prefill + (s["vanilla"].steps - 1) * v_step
        t_s = prefill + (s["spec"].steps - 1) * s_step
        if t_v > 0 and t_s > 0 and s["vanilla"].tokens:
            preds.append((s["spec"].tokens / t_s) / (s["vanilla"].tokens / t_v))
    return {
        "predicted_speedup": _median(preds) if preds else None,
        "vanilla_step_ms": 1000 * v_step,
        "spec_step_ms": 1000 * s_step,
        "verify_ms_measured": {"vanilla": 1000 * v_verify, "spec": 1000 * per_step("spec", "verify")},
        "verify_ms_predicted_spec": 1000 * s_verify,
        "draft_ms_per_step": 1000 * per_step("spec", "draft"),
    }


def check(
    speedup: float | None, tau: float | None, costs: dict, pred: dict, outliers: float, tol: float
) -> dict:
    """The bound, the predicted range and the flags (empty: the figure is consistent with physics)."""
    ratio = min(1.0, costs["vanilla"] / costs["spec"]) if costs["spec"] > 0 else 1.0
    bound = max(1.0, (tau or 1.0) * ratio)
    p = pred["predicted_speedup"]
    flags = []
    if speedup is not None and speedup > bound * (1 + tol):
        flags.append(f"above_bound: {speedup:.3f}x > max(1, tau * c_1 / c_W) = {bound:.3f}x (+{tol:.0%})")
    if speedup is not None and p and not p / (1 + tol) <= speedup <= p * (1 + tol):
        flags.append(f"off_prediction: {speedup:.3f}x vs {p:.3f}x predicted from step costs (+-{tol:.0%})")
    if outliers > 0.25:
        flags.append(f"unstable: {outliers:.0%} of pairs stayed out of line after re-timing")
    return {
        "bound": bound,
        "expected_range": [p / (1 + tol), min(p * (1 + tol), bound * (1 + tol))] if p else None,
        "flags": flags,
    }
