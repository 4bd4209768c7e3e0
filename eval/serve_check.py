"""Serve every exported layout of a drafter in vLLM and hold its acceptance against headstart's decoder.

    ./launch.sh serve-check --checkpoint runs/main-medusa-smollm2 [--prompts FILE] [--k 3] [--n 8 | --per-category 2] [--no-baselines]

`--checkpoint` takes a run directory (its drafter/) or a drafter folder. Writes OUT/serve_check.{json,md}
(default OUT: <run>/serve_check, read by the model card of later exports), the exports it served under
OUT/export and vLLM's logs under OUT/logs. Exits 1 when a layout does not load in vLLM or vLLM's position-1
acceptance is below 0.9x ours, 2 on a usage error. Unless `--no-baselines`, prompt lookup runs beside the
drafter in both engines (vLLM `ngram`, headstart's `prompt_lookup`) and the report compares them overall and by
category (`--per-category 2`: the first 2 prompts of every category; eval/serving/baselines.py). Needs the vLLM environment (`./launch.sh vllm-setup`,
which `./launch.sh serve-check` runs on first use). The library code is eval/serving/check.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from headstart.eval.errors import EvalError
from headstart.eval.serving.check import serve_check
from headstart.eval.stage.config import DEFAULT_PROMPTS
from headstart.eval.stage.prompts import load_prompts, spread
from headstart.eval.tuning.prompts import DEFAULT_TUNING_PROMPTS, normalise
from headstart.models.backbone import BackboneError
from headstart.vllm_runner import VllmError

# tuning prompts the hybrid's rule is chosen on: one plain decode of each (128 tokens; ~2 min on 2 CPU cores),
# every rule replayed on it (eval/tuning/replay.py)
TUNING_PROMPTS = 34


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run dir or drafter folder")
    p.add_argument(
        "--prompts",
        nargs="+",
        default=[DEFAULT_PROMPTS],
        help="Spec-Bench style .jsonl files (first turns are used)",
    )
    p.add_argument(
        "--k",
        type=int,
        default=0,
        help="drafts per step (a chain); 0: decoding.json's K (the tuner's, or vllm-k's), else 3",
    )
    p.add_argument("--n", type=int, default=8, help="prompts, spread over the file")
    p.add_argument("--per-category", type=int, default=0, help="instead of --n: the first N of each category")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip prompt lookup (vLLM ngram / ours) beside the drafter",
    )
    p.add_argument(
        "--hybrid",
        type=int,
        default=None,
        metavar="M",
        help="also serve the drafter with headstart's vLLM plugin: the prompt-lookup chain where its match is >= M "
        "tokens (M = 0: decoding.json's lookup rule, tuned on the tuner's prompts, data/tuning_prompts.jsonl, when absent), beside headstart's decoder running the same rule",
    )
    p.add_argument(
        "--suffix", action="store_true", help="vLLM's suffix decoding beside ngram (arctic-inference)"
    )
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="each engine alone (started, every prompt, stopped) instead of all alive at once: for a target and "
        "draft model that do not fit in memory three times over; speedups then carry the machine's drift",
    )
    p.add_argument("--out", type=Path, help="default: <run>/serve_check")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads for headstart's decoder (vLLM sets its own)"
    )
    p.add_argument("--dtype", default="auto", help="vLLM's and ours: auto (native bf16 where the device has "
                   "it, else float32 / float16 on CUDA) | float32 | bfloat16 | float16")  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the rule's tuning shows its progress
    torch.set_num_threads(args.threads)
    drafter = (
        args.checkpoint / "drafter"
        if (args.checkpoint / "drafter" / "config.json").is_file()
        else args.checkpoint
    )
    out = args.out or drafter.parent / "serve_check"
    try:
        if args.k < 0 or args.n < 1 or args.per_category < 0:
            raise EvalError("--k must be >= 0 (0: the tuner's K, else 3), --n >= 1 and --per-category >= 0")
        if args.per_category:
            chosen = [q for f in args.prompts for q in load_prompts(f, args.per_category).prompts]
        else:
            chosen = spread([q for f in args.prompts for q in load_prompts(f).prompts], args.n)
        categories = None if args.no_baselines else [q.category for q in chosen]
        # the rule is tuned (when decoding.json has none) on the tuner's prompts, never on a scored one
        scored = {normalise(t) for q in chosen for t in q.turns}
        spare = [
            q.turns[0]
            for q in load_prompts(DEFAULT_TUNING_PROMPTS).prompts
            if normalise(q.turns[0]) not in scored
        ]
        report = serve_check(drafter, [q.turns[0] for q in chosen], out, args.k, args.max_new_tokens, categories,
                             args.hybrid, args.suffix, spread(spare, TUNING_PROMPTS), dtype=args.dtype,
                              one_at_a_time=args.one_at_a_time)  # fmt: skip
    except (FileNotFoundError, ValueError, BackboneError, VllmError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print((out / "serve_check.md").read_text())
    if not report["passed"]:
        print("serve check FAILED: " + "; ".join(report["failures"]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":  # vLLM runs in a subprocess; the guard keeps imports side-effect free
    main()
