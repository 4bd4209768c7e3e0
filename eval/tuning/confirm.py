"""The tuner's finalists priced by decoding them: the few settings the speed model ranks best, each run as the eval
will run it (the same decoder, compiled or not, with its lookup branch) beside plain decoding, in rotating rounds
after one untimed decode; the step cost is the decode's own (drafter, verify, lookup search, tree merge,
acceptance, cache compaction), not the sum of the parts the model timed apart.

Why: the parts miss what lies between them. On the main job's heads under AVX2 kernels (float32, compiled) the
model priced a 1-node tree + 4-token branch at ~39 ms a step (the verify width interpolated between the widths it
compiled, the drafter and search timed alone); the eval's decode took 44 ms a step, and the 1.39x the tuner
predicted measured 1.05x; and plain decoding decoded at 27.6 ms a step where its step timed alone read 30.0, so
the speedups were over a slower plain decoding than the eval's (docs/results.md). Acceptance stays the model's
(tokens per step from the probe or the checkpoint's table): one decode of one prompt says little about it. Except
when sampling: there the finalists' tokens per step are decoded too, on the probe's prompts. A wide probe tree
over-reads a narrow tree's acceptance at temperature > 0: where every candidate is rejected the bonus token comes
from the target's residual, i.e. never the heads' own guess, and the next step's heads (reading the hidden state
before that token) guess worse; a wide tree is rejected outright less often. The main job's heads, float32, the
tuning prompts at temperature 1: the wide probe's table read 0.139 at position 1, a 1-node tree decoded 0.092
(greedy: 0.172 and 0.165).
"""

from __future__ import annotations

import numpy as np

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers import VANILLA
from headstart.eval.engine.proposers.base import Setting


def step_s(decoder: Decoder, context: list[int], new_tokens: int, temperature: float, top_p: float) -> float:
    """Mean seconds per decode step (drafter + verify + bookkeeping) of one decode after `context`, no EOS stop."""
    out = decoder.generate(context, new_tokens, temperature, top_p, seed=0, eos_token_ids=[])
    steps = out.stats.step_latency_s
    return sum(steps) / max(len(steps), 1)


def decoded_costs(decoders: dict[str, Decoder], context: list[int], new_tokens: int, reps: int,
                  temperature: float = 0.0, top_p: float = 1.0) -> dict[str, float]:  # fmt: skip
    """Median over `reps` rounds of each decoder's mean step seconds, decoding `new_tokens` after `context`; one
    untimed round first (it compiles each width a compiled decoder meets), then rotating order."""
    names = list(decoders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps + 1):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            t = step_s(decoders[name], context, new_tokens, temperature, top_p)
            if rep:
                times[name].append(t)
    return {n: float(np.median(t)) for n, t in times.items()}


def decoded_tau(
    decoder: Decoder, prompts: list[list[int]], new_tokens: int, temperature: float, top_p: float
) -> float:
    """Tokens per step decoding each prompt (prompt i with seed i), no EOS stop."""
    emitted = steps = 0
    for i, ids in enumerate(prompts):
        out = decoder.generate(ids, new_tokens, temperature, top_p, seed=i, eos_token_ids=[])
        emitted, steps = emitted + sum(out.stats.accepted_per_step), steps + out.stats.target_forwards
    return emitted / max(steps, 1)


def confirm(
    method: str,
    backbone,
    loaded,
    ranked: list[tuple[Setting, dict]],
    context: list[int],
    *,
    n: int,
    new_tokens: int,
    reps: int,
    use,
    prompts: list[list[int]] = (),
) -> tuple[list[tuple[Setting, dict]], float]:
    """The `n` best of `ranked` re-priced by decoding (see the module doc), fastest first, and plain decoding's
    decoded step seconds. Each prediction keeps the model's step as `step_ms_modelled`; `step_ms`, `tokens_per_s`
    and `speedup` become the decoded ones (speedup over plain decoding decoded the same way). Sampling
    (`use.temperature` > 0), `tokens_per_step` is decoded on `prompts` too (the model's kept as
    `tokens_per_step_modelled`)."""
    cache = use.compile_cache or max(map(len, [context, *prompts])) + new_tokens + 256
    compile = "auto" if use.compiled else "eager"
    finalists = ranked[:n]
    decoders = {"plain": Decoder(backbone, VANILLA, max_cache_len=cache, compile=compile)}
    for i, (setting, pred) in enumerate(finalists):
        options = setting.options | {"lookup_tokens": pred.get("branch_tokens", 0)}
        decoders[str(i)] = build_decoder(
            method, backbone, loaded, max_cache_len=cache, compile=compile, **options
        )
    costs = decoded_costs(decoders, context, new_tokens, reps, use.temperature, use.top_p)
    plain = costs["plain"]
    confirmed = []
    for i, (setting, pred) in enumerate(finalists):
        step, decoded = costs[str(i)], dict(pred)
        if use.temperature > 0 and prompts:
            tau = decoded_tau(decoders[str(i)], prompts, new_tokens, use.temperature, use.top_p)
            decoded |= {"tokens_per_step_modelled": pred["tokens_per_step"], "tokens_per_step": tau}
        rate = decoded["tokens_per_step"] / step
        decoded |= {"step_ms_modelled": pred["step_ms"], "step_ms": 1000 * step}
        confirmed.append((setting, decoded | {"tokens_per_s": rate, "speedup": rate * plain}))
    order = sorted(range(len(confirmed)), key=lambda i: (-confirmed[i][1]["tokens_per_s"], i))
    return [confirmed[i] for i in order], plain
