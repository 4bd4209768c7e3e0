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
speculative engine's step that drafted nothing. The drafter's own cost is left out, as in headstart's curve (a
lookup step skips it). Measured on a 2-core AMD EPYC (AVX2, float32, SmolLM2-135M, a 49-token prompt): w3
0.99-1.13 over four runs, w5 1.10-1.24 (headstart's eager curve there: w2 1.60, w3 1.79). What it leaves out, there:
Medusa heads drafting 2 cost 1.24 plain steps where a forced width 3 cost 1.13, interleaved in one process (the
heads' call and its bookkeeping), so priced so the hybrid's prediction ran 28% over the serve check's measurement.

Run in vLLM's environment (the serve check does, `measure_in_vllm`):

    .venv-vllm/bin/python -m headstart.eval.serving.vllm_costs --model DIR --prompt-ids IDS.json --widest 17
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
) -> dict:
    """{"ms": {w: median step ms}, "cost": {w: cost}} for widths 1..`widest` (w 0: the plain engine), run here;
    `eager`: vLLM's enforce_eager, as the serve check's engines run (headstart/vllm_runner.py `eager`)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engines in this process: their steps timed here
    from vllm import LLM, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    common = {"dtype": dtype, "max_model_len": len(prompt) + tokens + widest + 16, "kv_cache_memory_bytes": 1 << 29,
              "async_scheduling": False, "generation_config": "vllm", "seed": 0, "enforce_eager": eager}  # fmt: skip
    ngram = {"method": "ngram", "num_speculative_tokens": max(widest - 1, 1), "prompt_lookup_min": 1,
             "prompt_lookup_max": 1}  # fmt: skip
    engines = {"plain": LLM(model, **common), "spec": LLM(model, speculative_config=ngram, **common)}
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

    def decode(w: int, n: int) -> list[float]:
        drafts["n"], times["on"] = max(w - 1, 0), []
        engine = engines["plain" if w == 0 else "spec"]
        engine.generate([{"prompt_token_ids": prompt}], params[n], use_tqdm=False)
        out, times["on"] = times["on"], None
        return out[1:]  # the first step is the prefill's

    widths = list(range(widest + 1))
    for w in widths:  # first calls (a new shape, the sampler's first batch of drafts) out of the timing
        decode(w, 4)
    steps: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(reps):
        for w in widths if r % 2 == 0 else widths[::-1]:
            steps[w] += decode(w, tokens)
    ms = {w: 1e3 * statistics.median(s) for w, s in steps.items()}
    return {"ms": ms, "cost": relative_costs(ms)}


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
    model: str, prompt: list[int], widest: int, dtype: str, reps: int = REPS, eager: bool = False
) -> dict[str, dict[int, float]]:
    """`measure` run by vLLM's environment (headstart/vllm_runner.py's venv) -> {"cost": {w: cost}} for widths
    1..widest, a plain step = 1, and {"ms": {w: median step ms}} for widths 0 (the plain engine) ..widest, what the
    costs were fitted to (kept beside them: runs of the probe differ). Raises VllmError with the run's last line
    when it fails."""
    from headstart.vllm_runner import VllmError, venv_dir

    cmd = [str(venv_dir() / "bin" / "python"), "-m", "headstart.eval.serving.vllm_costs", "--model", model,
           "--prompt-ids", json.dumps(prompt), "--widest", str(widest), "--dtype", dtype, "--reps", str(reps),
           *(["--eager"] if eager else [])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ""}  # nothing of the project's venv leaks in
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    found = [line for line in out.stdout.splitlines() if line.startswith(PREFIX)]
    if out.returncode or not found:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise VllmError(f"timing vLLM's steps by width failed (exit {out.returncode}: {tail})")
    result = json.loads(found[-1][len(PREFIX) :])
    return {key: {int(w): v for w, v in result[key].items()} for key in ("cost", "ms")}


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
    args = p.parse_args(argv)
    raw = args.prompt_ids
    prompt = json.loads(Path(raw).read_text() if not raw.lstrip().startswith("[") else raw)
    result = measure(args.model, prompt, args.widest, args.dtype, args.reps, args.tokens, args.eager)
    print(PREFIX + json.dumps(result), flush=True)
    print(" ".join(f"w{w} {c:.2f}" for w, c in result["cost"].items()), file=sys.stderr)


if __name__ == "__main__":
    main()
