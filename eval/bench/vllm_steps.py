"""Where a vLLM decoding step's time goes, per speculative method: the target's forward, the rest of the step,
the drafter's passes and its draft sampling, and headstart's lookup plugin, on the same prompts.

Run with vLLM's environment (it imports vLLM, in one process so that its model runner can be timed):

    .venv-vllm/bin/python -m headstart.eval.bench.vllm_steps --backbone DIR --drafter EXPORT --method eagle3 \
        --k 2 --hybrid '{"min_match": 1, "drafter_tokens": 2, "lookup_tokens": 4, "max_ngram": 8}' --served 8

Each method runs in its own process, one after another on the same prompts (greedy, batch size 1), after a warm-up
prompt; the timings are wall-clock sums of the runner's methods over every step. Steps differ in number between
methods (a speculative step emits 1 + accepted tokens): the table gives milliseconds per step and tokens a
second. Timings from different processes are minutes apart; on a shared machine compare per-step components
(which an idle neighbour does not move much) rather than totals, and take speedups from the serve check, which
interleaves its engines.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import subprocess
import sys
import time

from headstart.eval.serving.baselines import NGRAM_SPEC, SUFFIX_SPEC
from headstart.models.decoding import local_argmax

TIMED_RUNNER = ("execute_model", "_model_forward", "sample_tokens", "propose_draft_token_ids")
TIMED_PROPOSER = ("propose", "_greedy_sample")


def specs(args) -> dict[str, dict]:
    """method name -> LLM keyword arguments."""
    out = {"plain": {}, "ngram": {"speculative_config": dict(NGRAM_SPEC)}}  # as the serve check's baseline
    if args.suffix:  # vLLM's suffix decoding (needs Arctic Inference: ./launch.sh suffix-setup)
        out["suffix"] = {"speculative_config": dict(SUFFIX_SPEC)}
    if args.drafter:
        from headstart.eval.serving.check import engine_args

        drafter = {"method": args.method, "model": args.drafter, "num_speculative_tokens": args.k}
        # what the exported folder needs, as in the serve check
        folder = engine_args(args.method, args.drafter)
        out["drafter"] = {"speculative_config": drafter} | folder
        if args.hybrid:
            served = drafter | {"num_speculative_tokens": args.served} | local_argmax(drafter)
            out["hybrid"] = folder | {
                "speculative_config": served,
                "additional_config": {"headstart_lookup": json.loads(args.hybrid)},
            }
    return out


def timed(cls, name: str, totals: collections.Counter, calls: collections.Counter) -> None:
    f = getattr(cls, name)

    @functools.wraps(f)
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            totals[name] += time.perf_counter() - t0
            calls[name] += 1

    setattr(cls, name, wrapper)


def run_one(args, name: str) -> dict:
    """One method in this process: tokens, seconds, steps and per-step milliseconds of each timed method."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so its runner is timed
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.spec_decode.medusa import MedusaProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from headstart.eval.stage.prompts import chat_ids, load_prompts

    kwargs = specs(args)[name]
    # the layout's own engine arguments (root-token heads: synchronous scheduling too) over the bench's
    engine = {"async_scheduling": False, "generation_config": "vllm"} | kwargs
    llm = LLM(args.backbone, dtype=args.dtype, max_model_len=args.max_model_len, kv_cache_memory_bytes=1 << 29,
              **engine)  # fmt: skip
    tok = AutoTokenizer.from_pretrained(args.backbone)
    prompts = [
        chat_ids(tok, [{"role": "user", "content": q.turns[0]}]) for q in load_prompts(args.prompts).prompts
    ]
    prompts = prompts[: args.n]
    sp = SamplingParams(temperature=0, max_tokens=args.max_new_tokens)
    llm.generate([{"prompt_token_ids": prompts[0]}], sp, use_tqdm=False)  # warm-up
    totals, calls = collections.Counter(), collections.Counter()
    for method in TIMED_RUNNER:
        timed(GPUModelRunner, method, totals, calls)
    for method in TIMED_PROPOSER:
        timed(SpecDecodeBaseProposer, method, totals, calls)
    timed(MedusaProposer, "propose", totals, calls)  # its heads and their drafts' argmax in one call
    t0, tokens = time.perf_counter(), 0
    for p in prompts:
        tokens += len(llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0].outputs[0].token_ids)
    seconds = time.perf_counter() - t0
    steps = calls["execute_model"]
    return {
        "method": name, "tokens": tokens, "seconds": seconds, "steps": steps,
        "ms_per_step": {m: 1e3 * totals[m] / steps for m in totals}, "calls_per_step": {m: calls[m] / steps for m in calls},
    }  # fmt: skip


def table(rows: list[dict]) -> str:
    cols = [
        "execute_model",
        "_model_forward",
        "sample_tokens",
        "propose_draft_token_ids",
        "propose",
        "_greedy_sample",
    ]
    lines = [
        "| method | tokens/s | tokens/step | ms/step | "
        + " | ".join(cols)
        + " | proposes/step | draft samples/step |",
        "|" + "---|" * (len(cols) + 6),
    ]
    for r in rows:
        ms = r["ms_per_step"]
        lines.append(
            f"| {r['method']} | {r['tokens'] / r['seconds']:.1f} | {r['tokens'] / r['steps']:.2f} | "
            f"{1e3 * r['seconds'] / r['steps']:.1f} | "
            + " | ".join(f"{ms.get(c, 0):.2f}" for c in cols)
            + f" | {r['calls_per_step'].get('propose', 0):.2f} | {r['calls_per_step'].get('_greedy_sample', 0):.2f} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", required=True, help="the backbone's folder as vLLM loads it")
    p.add_argument("--drafter", help="an exported layout's folder (vLLM's speculative_config model)")
    p.add_argument(
        "--method", default="eagle3", help="the drafter's method: medusa, eagle or eagle3 (vLLM's names too)"
    )
    p.add_argument("--k", type=int, default=2, help="the drafter's chain alone")
    p.add_argument("--hybrid", help="headstart_lookup settings (JSON) to add the plugin's hybrid")
    p.add_argument(
        "--served", type=int, default=8, help="the hybrid's num_speculative_tokens (longest chain)"
    )
    p.add_argument("--suffix", action="store_true", help="also vLLM's suffix decoding (Arctic Inference)")
    p.add_argument("--prompts", default="spec_bench")
    p.add_argument("--n", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--only", help=argparse.SUPPRESS)  # one method, in this process (the parent's child)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.only:
        print("RESULT " + json.dumps(run_one(args, args.only)), flush=True)
        return
    rows = []
    for name in specs(args):
        cmd = [
            sys.executable,
            "-m",
            "headstart.eval.bench.vllm_steps",
            *(argv or sys.argv[1:]),
            "--only",
            name,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True)
        result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode or not result:
            sys.exit(f"{name}: vLLM failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
        rows.append(json.loads(result[-1][len("RESULT ") :]))
        print(f"{name}: {rows[-1]['tokens'] / rows[-1]['seconds']:.1f} tokens/s", file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
