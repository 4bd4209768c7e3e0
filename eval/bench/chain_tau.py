"""Drafters side by side in headstart's decoder: each checkpoint's greedy tau as a chain of K (what vLLM serves
with num_speculative_tokens=K), and with the hybrid's lookup chain (L tokens at min_match m, the rule of headstart's
vLLM plugin), on the same prompts, beside its held-out per-head top-1 accuracy (final_eval.json). For ablations of
training objectives at equal compute: one backbone load, every drafter decoded on the same prompts in turn.

    python eval/bench/chain_tau.py --checkpoints runs/a runs/b --k 2 --lookup 4 1 --prompts dev spec_bench \
        --per-category 1 --out docs/ablation.json

`--branch B` adds the chain with a B-token prompt-lookup branch merged into its tree (headstart's decoder's
`lookup_tokens`, what the eval stage runs).

tau here is accepted tokens per target forward (the bonus token included), greedy; it predicts vLLM's tau for
the same chain (the serve check holds the two within a few percent).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.proposers import chain_options
from headstart.eval.stage.prompts import chat_ids, load_prompts
from headstart.models import registry
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import (
    LoadedDrafter,
    load_drafter,
    read_final_eval,
    read_meta,
    resolve_checkpoint,
)


def greedy_tau(decoder, prompts: list[list[int]], tokens: int) -> tuple[float, list[float]]:
    """(tau, acceptance by chain position) over the prompts."""
    accepted = forwards = 0
    hits: list[int] = []
    for ids in prompts:
        stats = decoder.generate(list(ids), tokens, temperature=0.0).stats
        accepted, forwards = accepted + sum(stats.accepted_per_step), forwards + stats.target_forwards
        for a in stats.accepted_per_step:  # a - 1 drafts accepted this step (the bonus token counts 1)
            hits += [0] * max(0, a - 1 - len(hits))
            for i in range(a - 1):
                hits[i] += 1
    steps = max(forwards, 1)
    return accepted / steps, [h / steps for h in hits]


def held_out_top1(run: Path) -> list[float]:
    """Per-head held-out top-1 from the run's final_eval.json (empty when absent)."""
    data = read_final_eval(run)
    return [data[f"eval/head{i}/top1"] for i in range(16) if f"eval/head{i}/top1" in data]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", nargs="+", type=Path, required=True, help="run dirs or drafter folders")
    p.add_argument("--k", type=int, default=2, help="the drafter's chain length")
    p.add_argument(
        "--lookup",
        nargs="+",
        type=int,
        metavar="N",
        help="also with the lookup chain: L m [MAX] (chain L at min_match m, growing with its match up to MAX)",
    )
    p.add_argument(
        "--branch",
        type=int,
        default=0,
        metavar="B",
        help="also the chain with a B-token prompt-lookup branch in its tree (headstart's decoder: lookup_tokens)",
    )
    p.add_argument("--prompts", nargs="+", default=["dev", "spec_bench"], help="prompt files or shipped sets")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", type=Path, help="write the rows as json here")
    args = p.parse_args(argv)
    if args.lookup and len(args.lookup) not in (2, 3):
        p.error(f"--lookup takes L m [MAX], got {len(args.lookup)} numbers")
    return args


def score(args, path: Path, backbone, prompts: list[list[int]]) -> dict:
    """One checkpoint's row: held-out top-1, chain tau and position rates, and with --branch / --lookup those."""
    drafter_dir = resolve_checkpoint(path)
    run_meta = read_meta(drafter_dir)
    loaded = LoadedDrafter(*load_drafter(drafter_dir, backbone, run_meta), drafter_dir)
    proposer = registry.proposer_of(run_meta["method"])
    chain, _ = chain_options(proposer, args.k, loaded.drafter)
    row = {"checkpoint": str(path), "held_out_top1": held_out_top1(drafter_dir.parent)}
    t0 = time.perf_counter()
    row["tau"], row["position_rates"] = greedy_tau(
        build_decoder(proposer, backbone, loaded, **chain), prompts, args.tokens
    )
    if args.branch:
        branched = build_decoder(proposer, backbone, loaded, **chain, lookup_tokens=args.branch)
        row["branch_tau"], _ = greedy_tau(branched, prompts, args.tokens)
    if args.lookup:
        L, m, most = (*args.lookup, None)[:3]
        hybrid = build_decoder(proposer, backbone, loaded, **chain, lookup_tokens=L, lookup_min_match=m,
                               lookup_max_tokens=most)  # fmt: skip
        row["hybrid_tau"], _ = greedy_tau(hybrid, prompts, args.tokens)
    row["seconds"] = time.perf_counter() - t0
    return row


def describe(args, row: dict) -> str:
    top1 = " / ".join(f"{a:.3f}" for a in row["held_out_top1"][:3])
    rates = " / ".join(f"{r:.3f}" for r in row["position_rates"])
    branch_tau = f", with a {args.branch}-token branch: {row['branch_tau']:.3f}" if args.branch else ""
    hybrid_tau = (
        f", with lookup {' '.join(map(str, args.lookup))} (L m [max]): {row['hybrid_tau']:.3f}"
        if args.lookup
        else ""
    )
    return (
        f"{row['checkpoint']}: chain of {args.k} tau {row['tau']:.3f} (by position {rates}){branch_tau}"
        f"{hybrid_tau}; held-out top-1 {top1}"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    meta = read_meta(resolve_checkpoint(args.checkpoints[0]))
    for path in args.checkpoints[1:]:
        if read_meta(resolve_checkpoint(path))["backbone"].get("path") != meta["backbone"].get("path"):
            raise SystemExit(
                f"{path}: another backbone than {args.checkpoints[0]}. Fix: compare drafters of one backbone"
            )
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": args.dtype}))
    questions = load_prompts(args.prompts, args.per_category).prompts
    prompts = [chat_ids(backbone.tokenizer, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    print(
        f"{len(prompts)} prompts, {args.tokens} new tokens, {backbone.dtype}, {torch.get_num_threads()} threads"
    )
    rows = []
    for path in args.checkpoints:
        rows.append(score(args, path, backbone, prompts))
        print(describe(args, rows[-1]), flush=True)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "k": args.k,
                    "lookup": args.lookup,
                    "branch": args.branch,
                    "prompts": len(prompts),
                    "tokens": args.tokens,
                    "dtype": str(backbone.dtype),
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
