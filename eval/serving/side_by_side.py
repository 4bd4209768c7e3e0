"""Side-by-side timing: every engine alive at once, each prompt run on every engine in turn.

Engines measured one after another see different machines: in earlier serve checks vLLM's plain decoding
ran 12-17% faster after the speculative runs than before them, on the same prompts. With all engines started
first (vLLM's each in its own process, headstart's decoders in this one) and the prompts interleaved, a slow
minute slows every engine alike, so the ratios between them hold. An engine that waits costs the others
nothing: measured on the 2-core CPU, vLLM plain decoding ran 37.2 tok/s alone and 37.5 with a second, idle
engine alive. One thing an engine that just ran does cost the next: vLLM's
worker busy-polls its shared-memory queue for 1 s after each request (`busy_loop_s` in vLLM's shm_broadcast)
before it sleeps, so a runner declares `settle_s` and the next run waits that long. Measured, two identical
plain engines interleaved on 11 prompts x 96 tokens: 24.1 / 25.0 tok/s back to back, 25.5 / 26.2 with a
1.2 s gap, 25.9 / 26.6 alone before / after. The order rotates with the prompt so no engine always runs
first after the previous prompt's longest run.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

from headstart import vllm_runner
from headstart.eval.serving import counters as vc


class Runner(Protocol):
    settle_s: (
        float  # seconds the next run waits after this one (what the engine keeps doing after it answers)
    )

    def warm_up(self, prompt: list[int]) -> None: ...
    def run(self, prompt: list[int], max_new: int) -> tuple[list[int], float]: ...


def strip_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """Output up to (not including) the first EOS: vLLM leaves the stop token out, our decoder keeps it."""
    cut = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
    return list(tokens[:cut])


class VllmRunner:
    """One vLLM engine at batch size 1, greedy; its spec-decode counters read around the timed prompts."""

    settle_s = 1.2  # its worker busy-polls for 1 s after a request: the next run waits this long

    def __init__(self, engine, eos: list[int]) -> None:
        self.engine, self.eos = engine, eos
        self.before: dict | None = None
        self.emitted = 0  # tokens generated after each prefill, EOS included (counters.tau)

    def warm_up(self, prompt: list[int]) -> None:
        self.engine.generate([prompt], 8, stop_token_ids=self.eos)  # first-call costs out of the timing
        self.before = vc.spec_counters(self.engine.metrics())

    def run(self, prompt: list[int], max_new: int) -> tuple[list[int], float]:
        reply = self.engine.generate([prompt], max_new, stop_token_ids=self.eos)
        tokens = reply["outputs"][0]["token_ids"]
        self.emitted += max(len(tokens) - 1, 0)  # the first token is the prefill's
        return strip_eos(tokens, set(self.eos)), reply["time_s"]

    def counters(self) -> dict:
        """Counters accumulated since the warm-up, with the tokens emitted by its decode steps."""
        return vc.delta(vc.spec_counters(self.engine.metrics()), self.before) | {"emitted": self.emitted}


class OursRunner:
    """headstart's decoder in this process; DecodeStats summed over the timed prompts."""

    settle_s = 0.0

    def __init__(self, decoder, eos: set[int]) -> None:
        self.decoder, self.eos = decoder, eos
        self.emitted = self.forwards = 0
        self.accepted: list[int] = []
        self.proposed: list[int] = []

    def warm_up(self, prompt: list[int]) -> None:
        self.decoder.generate(prompt, 8)

    def run(self, prompt: list[int], max_new: int) -> tuple[list[int], float]:
        t0 = time.perf_counter()
        out = self.decoder.generate(prompt, max_new)
        seconds = time.perf_counter() - t0
        s = out.stats
        self.emitted += sum(s.accepted_per_step)
        self.forwards += s.target_forwards
        for acc, counts in ((self.accepted, s.accepted_by_position), (self.proposed, s.proposed_by_position)):
            acc.extend([0] * (len(counts) - len(acc)))
            for i, n in enumerate(counts):
                acc[i] += n
        return strip_eos(out.tokens, self.eos), seconds

    def tau(self) -> float:
        return self.emitted / self.forwards if self.forwards else 1.0

    def position_rates(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted, self.proposed)]


def start_engines(
    stack: ExitStack,
    model: str,
    specs: dict[str, dict],
    max_len: int,
    log_dir: Path,
    tolerate: bool = False,
    dtype: str = "auto",
) -> tuple[dict, dict[str, str]]:
    """Start one vLLM engine per {name: engine_spec extras} (all alive together, so each gets its share of the
    memory fraction), each in `dtype`, each closed by `stack`, its log in `log_dir/<name without "vllm:">.log`. -> (engines,
    errors): with `tolerate`, an engine that fails to start is recorded in `errors` and the others go on."""
    engines, errors = {}, {}
    for name, extra in specs.items():
        spec = vllm_runner.engine_spec(model, dtype, max_len, engines=len(specs), **extra)
        log = log_dir / f"{name.removeprefix('vllm:')}.log"
        try:
            engines[name] = stack.enter_context(vllm_runner.VllmEngine(spec, log))
        except vllm_runner.VllmError as e:
            if not tolerate:
                raise
            errors[name] = str(e)
    return engines, errors


def interleave(
    runners: dict[str, Runner], prompts: list[list[int]], max_new: int, progress=None
) -> dict[str, dict]:
    """Warm every runner up, then run prompt i on each runner in turn, starting from runner i mod n, each
    run after the previous runner's `settle_s`. -> {name: {"outputs": [...], "per_prompt": [(tokens,
    seconds), ...]}} in prompt order. `progress(i, n)` is called after each prompt. The warm-up prompt is the
    first one's first half, not a scored prompt: an engine that remembers past replies (suffix decoding's
    global tree) would otherwise draft the scored reply's start from its own warm-up."""
    names = list(runners)
    for r in runners.values():
        r.warm_up(prompts[0][: max(1, len(prompts[0]) // 2)])
    out = {n: {"outputs": [], "per_prompt": []} for n in names}
    settle = max(getattr(r, "settle_s", 0.0) for r in runners.values())  # after the warm-ups
    for i, p in enumerate(prompts):
        for n in names[i % len(names) :] + names[: i % len(names)]:
            time.sleep(settle)
            tokens, seconds = runners[n].run(p, max_new)
            settle = getattr(runners[n], "settle_s", 0.0)
            out[n]["outputs"].append(tokens)
            out[n]["per_prompt"].append((len(tokens), seconds))
        if progress:
            progress(i + 1, len(prompts))
    return out
