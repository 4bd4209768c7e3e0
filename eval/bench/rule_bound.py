"""How much a better hybrid rule could buy: the choice between the drafter's chain and the lookup chain, simulated.

Greedy output does not depend on the drafts (lossless verification), so one plain greedy decode per prompt that
records, at every position, what the drafter would propose (its chain of K, and its first draft's probability)
and the context's longest earlier n-gram match gives the steps of ANY rule choosing between the two
(eval/tuning/replay.py, on which the rule tuner replays its rules). Beside the hybrid's rule (lookup at a match
of m or more, a chain of L growing with its match, eval/engine/proposers/lookup_choice.py) this replays it with
the drafter's confidence deciding (its first draft at probability theta or more keeps the drafter's chain), with
a lookup extension behind the drafter's chain (the n-gram search run again on the context plus the drafts), and
the oracle: whichever chain accepts more at each step, the bound on any rule that picks one of the two chains.

    python eval/bench/rule_bound.py --checkpoint runs/main-medusa-smollm2 --prompts data/tuning_prompts.jsonl \
        --per-category 2

tau only (tokens per target forward, the bonus token included): on a CPU whose verify costs little more for a
wider chain (vLLM's compiled CPU steps on AMX), tau is most of a rule's speed. For a stateless drafter (Medusa's
heads) in float32 a replayed rule's tau is the decoded one's (tests/eval/test_replay.py); elsewhere rounding
can move a draft at a near-tie.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.ngram import find_match
from headstart.eval.engine.proposers import chain_options
from headstart.eval.engine.proposers.prompt_lookup import MAX_NGRAM
from headstart.eval.stage.prompts import chat_ids, load_prompts
from headstart.eval.tuning.lookup_rule import FLOORS, choice
from headstart.eval.tuning.replay import Decoded, Position, Recorder, accepted, record, replay
from headstart.models import registry
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import LoadedDrafter, load_drafter, read_meta, resolve_checkpoint

MAX_CHAIN = 8  # the longest lookup chain searched and replayed (the tuner's first growth step)


@dataclass
class Prompt:
    category: str
    decoded: Decoded


class FirstProbability:
    """The drafter's first draft's probability at each propose: EAGLE drafters through their `top_draft` (the
    first call of a proposal scores the root's children, log-probabilities), Medusa heads through their logits
    (head 1's softmax maximum)."""

    def __init__(self, proposer):
        self.value = 0.0
        self.fresh = True
        drafter = getattr(proposer, "drafter", None)
        heads = getattr(proposer, "heads", None)
        if drafter is not None and hasattr(drafter, "top_draft"):
            top = drafter.top_draft

            def top_draft(h, k):
                score, tok = top(h, k)
                if self.fresh:
                    self.value, self.fresh = float(score.reshape(-1)[0].exp()), False
                return score, tok

            drafter.top_draft = top_draft
        elif heads is not None:
            forward = heads.forward

            def heads_forward(*args, **kwargs):
                logits = forward(*args, **kwargs)
                self.value = float(torch.softmax(logits[0].float(), -1).max())
                return logits

            heads.forward = heads_forward

    def read(self) -> float:
        self.fresh = True
        return self.value


def recorded(
    decoder, prompts: list[list[int]], tokens: int, most: int, suffix: bool = False
) -> list[Decoded]:
    """Plain greedy decodes with both sides recorded at every position (eval/tuning/replay.py): the n-gram match
    at the rule's limit, the drafter's chain and its first draft's probability; `suffix`: suffix decoding's draft
    too."""
    recorder = Recorder(decoder.proposer, [max(MAX_NGRAM, most)], max(MAX_CHAIN, most), suffix)
    recorder.probability = FirstProbability(decoder.proposer).read
    return record(decoder, prompts, tokens, recorder)


# (position, the decode's tokens, t) -> (the chain verified, "lookup" or "drafter")
Rule = Callable[[Position, list[int], int], tuple[list[int], str]]


def lookup_rule(
    m: int,
    L: int,
    most: int | None = None,
    theta: float | None = None,
    extend: int = 0,
    floor: float | None = None,
) -> Rule:
    """The hybrid's rule as the tuner replays it (eval/tuning/lookup_rule.py `choice`: the lookup chain of L, or as
    long as its match up to `most`, where the match is at least m tokens, or 1 once the request's drafter averages
    under `floor` accepted drafts, else the drafter's chain); `theta`: the drafter's chain wherever its first draft
    is at least that likely; `extend`: up to that many lookup tokens behind the drafter's chain (searched on the
    context plus the drafts)."""
    choose = choice((L, m, most, floor))

    def rule(p: Position, tokens: list[int], t: int) -> tuple[list[int], str]:
        chain = choose(p, tokens, t)
        if chain is not p.drafts and (theta is None or p.p1 < theta):
            return chain, "lookup"
        if extend:
            n, more = find_match(np.asarray(tokens[:t] + p.drafts), MAX_CHAIN, extend)
            if n and more:
                return p.drafts + more, "drafter"
        return p.drafts, "drafter"

    return rule


def suffix_first(s: float, then: Rule) -> Rule:
    """Suffix decoding's draft where it scores at least s (its trees: the prompt and earlier replies), else `then`."""

    def rule(p: Position, tokens: list[int], t: int) -> tuple[list[int], str]:
        score, draft = p.suffix
        return (draft, "lookup") if draft and score >= s else then(p, tokens, t)

    return rule


def nothing(p: Position, tokens: list[int], t: int) -> tuple[list[int], str]:
    return [], "plain"


def drafter_alone(p: Position, tokens: list[int], t: int) -> tuple[list[int], str]:
    return p.drafts, "drafter"


def oracle(*rules: Rule) -> Rule:
    """At each step, whichever of `rules`' chains accepts more (the first among ties): it reads the output."""

    def rule(p: Position, tokens: list[int], t: int) -> tuple[list[int], str]:
        return max((r(p, tokens, t) for r in rules), key=lambda option: accepted(option[0], tokens, t))

    return rule


def simulate(prompts: list[Prompt], rule: Rule) -> dict:
    """{"tau", "steps", "lookup_share", "by_category": {category: tau}} of `rule` over the recorded decodes."""
    totals: dict[str, list[int]] = {}
    lookups = []

    def choose(p: Position, tokens: list[int], t: int) -> list[int]:
        chain, side = rule(p, tokens, t)
        lookups.append(side == "lookup")
        return chain

    for prompt in prompts:
        emitted, widths, _ = replay(prompt.decoded, choose)
        for key in ("all", prompt.category):
            acc = totals.setdefault(key, [0, 0])
            acc[0], acc[1] = acc[0] + emitted, acc[1] + sum(widths.values())
    tau = {k: v[0] / v[1] for k, v in totals.items()}
    share = sum(lookups) / max(len(lookups), 1)
    return {"tau": tau.pop("all"), "steps": len(lookups), "lookup_share": share, "by_category": tau}


def rules(m: int, L: int, most: int | None) -> dict[str, Rule]:
    """The rules compared: the drafter alone, the hybrid's rule at its m and at m +- 1, gated by the drafter's
    confidence, extended behind the drafter, m chosen per request by the drafter's acceptance so far, and the
    oracle over the hybrid's two chains."""
    base = lookup_rule(m, L, most)
    out: dict[str, Rule] = {"drafter alone": drafter_alone}
    for mm in sorted({max(1, m - 1), m, m + 1}):
        out[f"lookup at m={mm}"] = lookup_rule(mm, L, most)
    for theta in (0.5, 0.7, 0.9):
        out[f"m={m}, drafter where p1 >= {theta}"] = lookup_rule(m, L, most, theta=theta)
    out[f"m={m}, 4 lookup tokens behind the drafter"] = lookup_rule(m, L, most, extend=4)
    for floor in FLOORS:
        out[f"m=2, m=1 where the drafter averages < {floor} drafts"] = lookup_rule(2, L, most, floor=floor)
    out[f"oracle over m={m}'s two chains"] = oracle(base, out["drafter alone"])
    return out


def suffix_rules(m: int, L: int, most: int | None) -> dict[str, Rule]:
    """With suffix decoding recorded: suffix decoding alone (vLLM's `suffix`, up to the longest chain replayed), its
    hybrid with the drafter (the plugin's `source: "suffix"`), and three chains: its draft where it scores s, else
    the n-gram rule's chain (m, L, growing to `most`, the drafter floor 0.2), else the drafter's; the oracle over
    the three."""
    base, alone = lookup_rule(2, L, most, floor=FLOORS[0]), suffix_first(0.0, nothing)
    out = {"suffix alone": alone}
    for s in (0.0, 1.0, 2.0):
        out[f"suffix at score >= {s:g}, else the drafter"] = suffix_first(s, drafter_alone)
        out[f"suffix at score >= {s:g}, else m=2 floor, else the drafter"] = suffix_first(s, base)
    out["oracle over suffix, n-gram and the drafter"] = oracle(alone, base, drafter_alone)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run dir or drafter folder")
    p.add_argument("--k", type=int, default=2, help="the drafter's chain")
    p.add_argument("--rule", nargs=3, type=int, default=[1, 4, 8], metavar=("M", "L", "MAX"),
                   help="the hybrid's rule: min_match, lookup chain, growing to (0: fixed)")  # fmt: skip
    p.add_argument("--prompts", nargs="+", default=["data/tuning_prompts.jsonl"])
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--suffix", action="store_true", help="also suffix decoding's rules (Arctic Inference)")
    p.add_argument("--out", type=Path, help="write the table as json here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    drafter_dir = resolve_checkpoint(args.checkpoint)
    meta = read_meta(drafter_dir)
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": args.dtype}))
    loaded = LoadedDrafter(*load_drafter(drafter_dir, backbone, meta), drafter_dir)
    proposer = registry.proposer_of(meta["method"])
    chain, _ = chain_options(proposer, args.k, loaded.drafter)
    decoder = build_decoder(proposer, backbone, loaded, **chain)
    questions = load_prompts(args.prompts, args.per_category).prompts
    ids = [chat_ids(backbone.tokenizer, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    print(f"{len(ids)} prompts, {args.tokens} new tokens, {backbone.dtype}, chain of {args.k}", flush=True)
    m, L, most = args.rule
    decodes = recorded(decoder, ids, args.tokens, most, args.suffix)
    prompts = [Prompt(q.category, d) for q, d in zip(questions, decodes)]
    compared = rules(m, L, most or None) | (suffix_rules(m, L, most or None) if args.suffix else {})
    table = {name: simulate(prompts, rule) for name, rule in compared.items()}
    for name, row in table.items():
        print(f"{name:45s} tau {row['tau']:.3f}  lookup on {row['lookup_share']:.0%} of {row['steps']} steps")
    if args.out:
        args.out.write_text(json.dumps({"prompts": len(ids), "rule": args.rule, "rows": table}, indent=1))
    return table


if __name__ == "__main__":
    main()
