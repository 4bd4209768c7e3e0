"""Measured tau (tokens per target forward, greedy) of a DistillSpec draft before vs after distillation, in the
built-in decoder's `draft` method, on a few dev prompts (one per category). "Before" is the draft rebuilt from
the checkpoint's own init (the pruned copy of the target, a fresh model with the same seed, or the pretrained
draft); "after" is the trained checkpoint. Each greedy output is compared token for token with vanilla's
(`greedy_matches_vanilla`: 1.0 in float32; bf16 verify widths can flip near-ties, as in eval/run.py's report).
With `--temperature T > 0` both decode by speculative sampling (the draft's chain accepted by rejection
sampling, lossless in distribution), each prompt with the same seed before and after; only tau is reported
(sampled outputs have no token-for-token reference).

    python eval/bench/distill_tau.py --checkpoint runs/<run> --prompts 8 --tokens 64 [--dtype float32]
    python eval/bench/distill_tau.py --checkpoint runs/<run> --temperature 1
    python eval/bench/distill_tau.py --checkpoint runs/<run> --write-before runs/<run>/undistilled

`--write-before DIR` writes the "before" draft as a drafter folder of the same run (same target, method
settings and layouts) and stops: the undistilled draft then goes through every engine the distilled one does
(`bench-decode --checkpoint`, `serve-check --checkpoint`, vLLM's `draft_model` through its export).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.draft_model import DraftOptions
from headstart.eval.stage.config import DEFAULT_PROMPTS
from headstart.eval.stage.prompts import chat_ids, load_prompts
from headstart.models.backbone import Backbone, BackboneConfig, load_backbone
from headstart.models.checkpoint import (
    build_drafter,
    load_drafter,
    read_meta,
    resolve_checkpoint,
    save_drafter,
)
from headstart.models.distill import DistillConfig


def measure(
    target: Backbone,
    draft_lm,
    prompts: list[list[int]],
    tokens: int,
    k: int,
    ref: list | None,
    temperature: float = 0.0,
) -> dict:
    """tau over the prompts; `ref` (greedy only): vanilla's outputs, compared token for token."""
    draft = Backbone(draft_lm.to(target.dtype), target.tokenizer, name="draft")
    dec = Decoder(target, DraftOptions(draft, num_draft_tokens=k), max_cache_len=1024)
    emitted = forwards = matches = 0
    t0 = time.perf_counter()
    for i, ids in enumerate(prompts):
        out = dec.generate(ids, tokens, temperature=temperature, seed=i)
        if ref is not None:
            matches += out.tokens == ref[i]
        emitted, forwards = emitted + sum(out.stats.accepted_per_step), forwards + out.stats.target_forwards
    result = {"tau": emitted / max(forwards, 1), "seconds": time.perf_counter() - t0}
    if ref is not None:
        result["greedy_matches_vanilla"] = matches / len(prompts)
    return result


def undistilled(meta: dict, target: Backbone):
    """The checkpoint's draft as it was before training: its init rebuilt (`fresh`: with the run's seed)."""
    torch.manual_seed(meta["job"]["train"]["seed"] if "job" in meta else 0)
    return build_drafter("distillspec", DistillConfig(**meta["method_config"]), target)


def write_before(out: Path, meta: dict, bb_cfg: BackboneConfig, target: Backbone) -> None:
    drafter = undistilled(meta, target)
    extra = {"step": 0, "job": meta["job"]} if "job" in meta else {"step": 0}
    save_drafter(out, drafter, "distillspec", drafter.cfg, bb_cfg, target, extra=extra)
    print(f"the undistilled draft written to {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run dir or distillspec drafter folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--prompt-file", default=DEFAULT_PROMPTS)
    p.add_argument("--dtype", default="", help="target and draft dtype (default: the checkpoint's target's)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (checked against vanilla)")
    p.add_argument("--write-before", type=Path, help="write the undistilled draft as a drafter folder here")
    args = p.parse_args()
    if args.temperature < 0:
        p.error(f"--temperature={args.temperature}: must be >= 0 (0 is greedy)")
    ckpt = resolve_checkpoint(args.checkpoint)
    meta = read_meta(ckpt)
    bb_cfg = BackboneConfig(**meta["backbone"])
    target = load_backbone(replace(bb_cfg, dtype=args.dtype) if args.dtype else bb_cfg)
    if args.write_before:
        write_before(args.write_before, meta, bb_cfg, target)
        return
    rows = load_prompts(args.prompt_file, limit_per_category=1).prompts[: args.prompts]
    prompts = [chat_ids(target.tokenizer, [{"role": "user", "content": r.turns[0]}]) for r in rows]
    ref = None
    if args.temperature == 0:
        vanilla = Decoder(target, "vanilla", max_cache_len=1024)
        ref = [vanilla.generate(ids, args.tokens).tokens for ids in prompts]

    before = undistilled(meta, target).draft
    after = load_drafter(ckpt, target)[0].draft
    result = {
        "checkpoint": str(ckpt),
        "step": meta.get("step"),
        "prompts": len(prompts),
        "tokens": args.tokens,
        "num_draft_tokens": args.num_draft_tokens,
        "temperature": args.temperature,
        "dtype": str(target.dtype),
        "before": measure(target, before, prompts, args.tokens, args.num_draft_tokens, ref, args.temperature),
        "after": measure(target, after, prompts, args.tokens, args.num_draft_tokens, ref, args.temperature),
        "eval": meta.get("eval"),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
