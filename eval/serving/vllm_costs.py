"""vLLM's decoding step cost by verify width, measured in vLLM: what the serve check prices the hybrid's rule with.

The hybrid's rule (eval/tuning/lookup_rule.py) is chosen by predicted speed: tokens per step over the summed cost
of the steps' verify widths. The cost curve headstart's own decoder measures is the wrong one for a server: on a
2-core AVX2 CPU in float32, headstart's eager verify of 2 tokens cost 1.60 plain steps and of 17 tokens 2.69, and
priced so, every rule read slower than plain decoding; vLLM's compiled engine, with its rejection sampler and
bookkeeping, has a curve of its own. So the rule vLLM serves is priced with vLLM's steps.

Two engines in this process on the backbone: vLLM's plain decoding, and its `ngram` method with
num_speculative_tokens = the widest width - 1, whose proposer is replaced by one that drafts exactly w - 1 tokens
per step (the last sampled token repeated: nearly always rejected, so each step verifies w tokens and emits about
one). For each width the same prompt is decoded for `tokens` tokens and every step after the prefill is timed
whole (LLMEngine.step: scheduling, the target's forward, sampling, the rejection sampler, bookkeeping); the plain
engine and the widths take turns, `reps` rounds in alternating order, so load from other processes falls on all
alike. cost(w) = median step at w / the plain engine's median step, made non-decreasing in w: cost(1) is a
speculative engine's step that drafted nothing. Measured on a 2-core AMD EPYC (AVX2, float32, SmolLM2-135M, a
49-token prompt): w3 0.99-1.13 over four runs, w5 1.10-1.24 (headstart's eager curve there: w2 1.60, w3 1.79).

The drafter's own cost, given its speculative config (`drafter`): a widening verify is not all a drafter's step
costs. Medusa heads drafting 2 cost 1.24 plain steps where a forced width 3 cost 1.13 (AVX2 EPYC), and 1.18 where
the probe priced width 3 at 1.00 (AVX-512 Xeon, float32, 51 prompts served): the heads' call, the hidden states
the target hands them, their bookkeeping. Left out, the hybrid's predictions ran 10-28% over what was served, and
every rule was priced as if its drafter's steps were as cheap as its lookup steps. So an engine serving the
drafter alone at its chain of k takes its turns with the rest, and its median step, less the forced width k + 1's,
is what a drafter's step adds (`drafter_price`). A drafter that keeps a KV cache (EAGLE, a draft model) makes its
first pass on every step, lookup steps too (eval/serving/vllm_plugin.py): a second engine at k = 1 prices that
pass, paid each step, apart from the further passes a drafter's step pays.

Run in vLLM's environment (the serve check does, `measure_in_vllm`):

    .venv-vllm/bin/python -m headstart.eval.serving.vllm_costs --model DIR --prompt-ids IDS.json --widest 17 \
        [--drafter '{"speculative_config": {"method": "medusa", "model": HEADS, "num_speculative_tokens": 2}}']
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PREFIX = "RESULT "
REPS, TOKENS = 4, 32  # rounds, and steps timed per width and round (3 x 24 read up to 0.14 apart at a width)


def measure(
    model: str,
    prompt: list[int],
    widest: int,
    dtype: str,
    reps: int = REPS,
    tokens: int = TOKENS,
    eager: bool = False,
    drafter: dict | None = None,
    keeps_cache: bool = False,
) -> dict:
    """{"ms": {w: median step ms}, "cost": {w: cost}} for widths 1..`widest` (w 0: the plain engine), run here;
    `eager`: vLLM's enforce_eager, as the serve check's engines run (headstart/vllm_runner.py `eager`). With
    `drafter` (the engine arguments that serve the drafter alone: its speculative_config drafting k, and what its
    export needs; `keeps_cache`: it makes a first pass every step) also "drafter": `drafter_price` of its steps,
    timed in the same rounds."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engines in this process: their steps timed here
    from vllm import LLM, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    common = {"dtype": dtype, "max_model_len": len(prompt) + tokens + widest + 16, "kv_cache_memory_bytes": 1 << 29,
              "async_scheduling": False, "generation_config": "vllm", "seed": 0, "enforce_eager": eager}  # fmt: skip
    ngram = {"method": "ngram", "num_speculative_tokens": max(widest - 1, 1), "prompt_lookup_min": 1,
             "prompt_lookup_max": 1}  # fmt: skip
    # the n-gram engine last: an engine started after it fails vLLM's start-up scan of loaded modules (numba's)
    engines = {"plain": LLM(model, **common)}
    for name, extras in drafter_engines(drafter, keeps_cache).items():
        engines[name] = LLM(model, **common | extras)
    engines["spec"] = LLM(model, speculative_config=ngram, **common)
    runs = [(w, "spec" if w else "plain") for w in range(widest + 1)]  # (what is timed, the engine timing it)
    runs += [(name, name) for name in engines if name.startswith("drafter")]
    # imported once the engines are up: vLLM's start-up scans every loaded module, and numba's (which the n-gram
    # proposer loads) fails that scan
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    drafts, times = {"n": 0}, {"on": None}

    def forced(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs):
        return [[ids[-1]] * drafts["n"] if len(ids) else [] for ids in sampled_token_ids]

    def timed(step):
        def run(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return step(self, *args, **kwargs)
            finally:
                if times["on"] is not None:
                    times["on"].append(time.perf_counter() - t0)

        return run

    NgramProposer.propose, LLMEngine.step = forced, timed(LLMEngine.step)
    params = {n: SamplingParams(temperature=0, max_tokens=n) for n in (4, tokens)}

    def decode(key, engine: str, n: int) -> list[float]:
        drafts["n"], times["on"] = max(key - 1, 0) if isinstance(key, int) else 0, []
        engines[engine].generate([{"prompt_token_ids": prompt}], params[n], use_tqdm=False)
        out, times["on"] = times["on"], None
        return out[1:]  # the first step is the prefill's

    # first calls (a new shape, the sampler's first batch of drafts) out of the timing
    for key, engine in runs:
        decode(key, engine, 4)
    steps: dict = {key: [] for key, _ in runs}
    for r in range(reps):
        for key, engine in runs if r % 2 == 0 else runs[::-1]:
            steps[key] += decode(key, engine, tokens)
    ms = {key: 1e3 * statistics.median(s) for key, s in steps.items()}
    widths = {w: t for w, t in ms.items() if isinstance(w, int)}
    out = {"ms": widths, "cost": relative_costs(widths)}
    if drafter:
        spec = drafter["speculative_config"]
        k, method = spec["num_speculative_tokens"], spec["method"]
        # the drafter engines' medians, kept beside the price
        drafter_ms = {name: round(ms[name], 3) for name in ("drafter", "drafter1") if name in ms}
        out["drafter"] = drafter_price(ms, k, keeps_cache) | {"k": k, "method": method, "ms": drafter_ms}
    return out


def drafter_engines(drafter: dict | None, keeps_cache: bool) -> dict[str, dict]:
    """{name: engine arguments} of the engines that price a drafter: "drafter" serving it alone at its chain of
    k, and for one that `keeps_cache` "drafter1" at k = 1 (its first pass); none without a drafter."""
    if not drafter:
        return {}
    engines = {"drafter": drafter}
    spec = drafter["speculative_config"]
    if keeps_cache and spec["num_speculative_tokens"] > 1:
        engines["drafter1"] = drafter | {"speculative_config": spec | {"num_speculative_tokens": 1}}
    return engines


def drafter_price(ms: dict, k: int, keeps_cache: bool) -> dict[str, float]:
    """What a drafter adds to a step, in plain steps, from median step ms (0: the plain engine; widths; "drafter":
    the drafter alone at its chain of k, verifying k + 1; "drafter1", for a drafter that `keeps_cache` and k > 1:
    at k = 1) -> {"every": paid on every step (such a drafter's first pass), "step": paid more on a step that
    verifies its chain}. Each is the drafter engine's step less the forced verify of its width, in the same
    rounds; never under 0 (what reads so is noise), the first pass never more than the whole."""
    plain = ms[0]
    whole = max((ms["drafter"] - ms[k + 1]) / plain, 0.0)
    first = 0.0
    if keeps_cache:  # its first pass timed at k = 1 (a chain of 1 is all first pass)
        first = whole if k == 1 else min(max((ms["drafter1"] - ms[2]) / plain, 0.0), whole)
    return {"every": first, "step": whole - first}


def relative_costs(ms: dict[int, float]) -> dict[int, float]:
    """{w: cost} for w >= 1 from median step ms by width (0: the plain engine): the least-squares non-decreasing
    fit of ms[w] / ms[0] (the tuner's, eval/tuning/speed_model.py), never under 1. A wider verify never costs less
    than a narrower one, nor a speculative engine's step less than a plain one's: what reads otherwise is noise
    (two runs on a shared 2-core CPU: w1 1.02 and 0.96, w3 1.13 and 0.99). A running maximum carried one slow width
    to every wider one (an AVX-512 Xeon: w14 1.50, w15 1.54, then w16 1.46 and w17 1.39 read 1.54)."""
    from headstart.eval.tuning.speed_model import non_decreasing

    fitted = non_decreasing({w: t / ms[0] for w, t in ms.items() if w >= 1})
    return {w: max(c, 1.0) for w, c in fitted.items()}


def measure_in_vllm(
    model: str, prompt: list[int], widest: int, dtype: str, reps: int = REPS, eager: bool = False,
    drafter: dict | None = None, keeps_cache: bool = False,
) -> dict:  # fmt: skip
    """`measure` run by vLLM's environment (headstart/vllm_runner.py's venv) -> {"cost": {w: cost}} for widths
    1..widest, a plain step = 1, and {"ms": {w: median step ms}} for widths 0 (the plain engine) ..widest, what the
    costs were fitted to (kept beside them: runs of the probe differ); with `drafter` (its engine arguments;
    `keeps_cache`: it makes a first pass every step) also "drafter": its price (`drafter_price`). Raises VllmError
    with the run's last line when it fails."""
    from headstart.vllm_runner import VllmError, venv_dir

    cmd = [str(venv_dir() / "bin" / "python"), "-m", "headstart.eval.serving.vllm_costs", "--model", model,
           "--prompt-ids", json.dumps(prompt), "--widest", str(widest), "--dtype", dtype, "--reps", str(reps),
           *(["--eager"] if eager else []), *(["--drafter", json.dumps(drafter)] if drafter else []),
           *(["--drafter-keeps-cache"] if keeps_cache else [])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ""}  # nothing of the project's venv leaks in
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    found = [line for line in out.stdout.splitlines() if line.startswith(PREFIX)]
    if out.returncode or not found:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise VllmError(f"timing vLLM's steps by width failed (exit {out.returncode}: {tail})")
    result = json.loads(found[-1][len(PREFIX) :])
    timed = {key: {int(w): v for w, v in result[key].items()} for key in ("cost", "ms")}
    return timed | ({"drafter": result["drafter"]} if "drafter" in result else {})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the backbone's folder as vLLM loads it")
    p.add_argument(
        "--prompt-ids", required=True, help="the context: a JSON list of token ids, or a file of one"
    )
    p.add_argument("--widest", type=int, default=17, help="widths 1..this are timed")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=REPS)
    p.add_argument("--tokens", type=int, default=TOKENS, help="steps timed per width and round")
    p.add_argument(
        "--eager", action="store_true", help="vLLM's enforce_eager (default: compiled, as it serves)"
    )
    p.add_argument(
        "--drafter", default=None, help="JSON: the engine arguments serving the drafter alone (its price)"
    )
    p.add_argument(
        "--drafter-keeps-cache", action="store_true", help="the drafter makes a first pass every step (EAGLE)"
    )
    args = p.parse_args(argv)
    raw = args.prompt_ids
    prompt = json.loads(Path(raw).read_text() if not raw.lstrip().startswith("[") else raw)
    drafter = json.loads(args.drafter) if args.drafter else None
    result = measure(
        args.model, prompt, args.widest, args.dtype, args.reps, args.tokens, args.eager, drafter,
        args.drafter_keeps_cache,
    )  # fmt: skip
    print(PREFIX + json.dumps(result), flush=True)
    print(" ".join(f"w{w} {c:.2f}" for w, c in result["cost"].items()), file=sys.stderr)
    if drafter:
        price = result["drafter"]
        print(
            f"drafter: {price['every']:.3f} every step, {price['step']:.3f} more a drafter's step",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
