"""The hybrid's rule, tuned: how long a prompt-lookup match must be before its chain replaces the drafter's, and
how long that chain is.

The hybrid (eval/engine/proposers/lookup_choice.py in headstart's decoder, eval/serving/vllm_plugin.py in vLLM)
verifies each step either the drafter's chain of k or the L tokens that followed the longest suffix n-gram seen
earlier, the latter when that n-gram has at least m tokens. A longer lookup chain only adds tokens behind the
same match (its accepted prefix is never shorter), and the lookup chain of vLLM's `ngram` is DRAFT_TOKENS long, so
L is searched from k up to that (capped by what the drafter can serve: a Medusa export ships max(k, L) heads).
A verify of up to ~5 tokens costs about one of 1 on the hardware this targets (memory-bound steps; docs/results.md
has the CPU's curve) and the drafter's own cost is small (Medusa heads run only on steps the lookup loses), so the
rule is chosen by greedy tau: the highest, then among rules within TAU_SLACK of it the shortest L (the narrower
verify) and the largest m (fewer drafts replaced). The chosen (L, m) is then tried with chains that grow with their
match up to LONG_CHAIN tokens (suffix decoding's rule: a match of n > L tokens verifies n), kept only when its tau
is more than TAU_SLACK higher: those steps verify up to LONG_CHAIN + 1 tokens, which is not free. This decodes the
tuning prompts greedily once per (L, m), once with the drafter alone and once growing; prompts the figure is later
scored on must not be among them (the caller's duty, checked in eval/serve_check.py).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.proposers.prompt_lookup import DRAFT_TOKENS, MAX_NGRAM

TAU_SLACK = 0.01  # relative: a rule this close to the best tau counts as tied
# the longest chain a growing match may verify (a multiple of 1, 2 and 4: vLLM's MTP divisibility)
LONG_CHAIN = 8
log = logging.getLogger("headstart.eval")


@dataclass
class LookupRule:
    min_match: int | None  # None: the drafter alone was best (no lookup chain ever replaces its drafts)
    k: int  # the drafter's chain
    lookup_tokens: int  # L: the lookup chain's length (before a longer match grows it)
    tau_by_rule: dict[str, float]  # "none", "L=<L>,m=<m>" and "L=<L>,m=<m>,max=<M>"
    prompts: int
    max_new_tokens: int
    max_tokens: int | None = None  # chains grow with their match up to this many tokens; None: always L

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def served_k(self) -> int:
        """num_speculative_tokens of the engine serving the hybrid (the drafter keeps its first k)."""
        return max(self.k, self.lookup_tokens, self.max_tokens or 0)


def lookup_lengths(k: int, reachable: int) -> list[int]:
    """The lookup chain lengths to try: k up to ngram's DRAFT_TOKENS, no longer than the drafter can serve."""
    return list(range(k, max(k, min(DRAFT_TOKENS, reachable)) + 1))


def pick_rule(taus: dict[tuple[int, int] | None, float]) -> tuple[int, int] | None:
    """(L, m) or None (the drafter alone) from greedy taus: the best, else the shortest L then largest m among
    rules within TAU_SLACK of it; the drafter alone wins any tie it is in."""
    best = max(taus.values())
    close = [key for key, tau in taus.items() if tau >= best * (1 - TAU_SLACK)]
    if None in close:
        return None
    return min(close, key=lambda key: (key[0], -key[1]))


def rule_name(rule: tuple | None) -> str:
    if rule is None:
        return "none"
    return f"L={rule[0]},m={rule[1]}" + (f",max={rule[2]}" if len(rule) > 2 else "")


def tune_lookup_rule(
    backbone, proposer: str, loaded, chain: dict, k: int, prompts: list[list[int]], max_new: int,
    lengths: list[int] | None = None, long_chain: int | None = LONG_CHAIN, known: dict[str, float] | None = None,
) -> LookupRule:  # fmt: skip
    """Greedy tau of the drafter's chain of k (decoder options `chain`) alone and with a lookup chain of each L
    in `lengths` (default: k) chosen at each m -> the rule `pick_rule` keeps, then that rule with chains growing
    up to `long_chain` (None: not tried), kept when its tau is more than TAU_SLACK higher. `known`: taus by
    `rule_name` already measured on these prompts (an older record's), not decoded again."""
    taus: dict = {}

    def score(rule: tuple | None, step: str) -> float:
        if rule_name(rule) in (known or {}):
            taus[rule] = known[rule_name(rule)]
            log.info("lookup rule %s, %s: greedy tau %.3f (recorded)", step, rule_name(rule), taus[rule])
            return taus[rule]
        extra = {}
        if rule is not None:
            extra = {"lookup_tokens": rule[0], "lookup_min_match": rule[1]}
            extra |= {"lookup_max_tokens": rule[2]} if len(rule) > 2 else {}
        decoder = build_decoder(proposer, backbone, loaded, **chain, **extra)
        accepted = forwards = 0
        for ids in prompts:
            stats = decoder.generate(list(ids), max_new, temperature=0.0).stats
            accepted, forwards = accepted + sum(stats.accepted_per_step), forwards + stats.target_forwards
        taus[rule] = accepted / forwards if forwards else 1.0
        log.info(
            "lookup rule %s, %s: greedy tau %.3f on %d prompts",
            step,
            rule_name(rule),
            taus[rule],
            len(prompts),
        )
        return taus[rule]

    rules = [None, *((L, m) for L in lengths or [k] for m in range(1, MAX_NGRAM + 1))]
    for i, rule in enumerate(rules, 1):
        score(rule, f"{i}/{len(rules)}")
    best = pick_rule(taus)
    max_tokens = None
    if best is not None and long_chain is not None and long_chain > best[0]:
        grown = (*best, long_chain)
        if score(grown, "growing with its match") > taus[best] * (1 + TAU_SLACK):
            max_tokens = long_chain
    names = {rule_name(r): tau for r, tau in taus.items()}
    return LookupRule(
        None if best is None else best[1],
        k,
        k if best is None else best[0],
        names,
        len(prompts),
        max_new,
        max_tokens,
    )
