"""The hybrid's rule, tuned: how long a prompt-lookup match must be before its chain replaces the drafter's, and
how long that chain is.

The hybrid (eval/engine/proposers/lookup_choice.py in headstart's decoder, eval/serving/vllm_plugin.py in vLLM)
verifies each step either the drafter's chain of k or the L tokens that followed the longest suffix n-gram seen
earlier, the latter when that n-gram has at least m tokens. A longer lookup chain only adds tokens behind the
same match (its accepted prefix is never shorter), and the lookup chain of vLLM's `ngram` is DRAFT_TOKENS long, so
L is searched from k up to that (the plugin serves a lookup chain longer than a Medusa drafter's heads).

Each rule decodes the tuning prompts greedily once; its tau and the verify width of every step it took are kept,
and it is priced with this machine's verify cost by width (`verify_costs`: one target forward of w chained tokens
over a prompt's cache, relative to a plain step): predicted speed = tokens emitted / the steps' summed costs, what
a speedup over plain decoding would be if drafting were free (the drafter's own cost is left out: the lookup
saves it on the steps it takes). The best speed wins; among rules within SLACK of it the shortest L (the narrower
verify) and the largest m (fewer drafts replaced). The chosen (L, m) is then tried with chains that grow with
their match (suffix decoding's rule: a match of n > L tokens verifies n) up to each of GROWTH, kept when its
predicted speed is higher: growth changes only the steps whose match is longer than L, and their wider verifies
are priced. Where Arctic Inference's suffix tree is installed, suffix decoding's own draft (the prompt's and the
earlier replies' suffix trees, up to LONG_CHAIN tokens) is tried in place of the n-gram chain at each min_score of
SUFFIX_SCORES, and kept when it prices faster than the n-gram rule (the plugin's `source: "suffix"`). Prompts
the figure is later scored on must not be among the tuning prompts (the caller's duty, checked in
eval/serve_check.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass, field

from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.proposers.prompt_lookup import DRAFT_TOKENS, MAX_NGRAM

SLACK = 0.01  # relative: a fixed rule this close to the best predicted speed counts as tied
# the chains a growing match may verify, at most (multiples of 1, 2 and 4: vLLM's MTP divisibility); suffix
# decoding's own tree is 24 deep
GROWTH = (8, 16)
LONG_CHAIN = GROWTH[-1]
# suffix decoding's draft is taken when its score (the tokens it expects accepted) reaches this: any draft, up to
# Arctic Inference's own rule beside a 3-token speculator
SUFFIX_SCORES = (0.0, 1.0, 2.0, 3.0)
COST_REPS = 7
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
    # per rule: steps by verify width (1 + drafts), and the predicted speed over plain decoding they price to
    widths_by_rule: dict[str, dict[str, int]] = field(default_factory=dict)
    speed_by_rule: dict[str, float] = field(default_factory=dict)
    verify_cost: dict[str, float] = field(default_factory=dict)  # by width, a plain step = 1, this machine
    source: str = "ngram"  # "suffix": suffix decoding's draft of up to lookup_tokens (min_match None)
    min_score: float | None = None  # "suffix": the score its draft needs

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def served_k(self) -> int:
        """num_speculative_tokens of the engine serving the hybrid (the drafter keeps its first k)."""
        return max(self.k, self.lookup_tokens, self.max_tokens or 0)


def lookup_lengths(k: int) -> list[int]:
    """The lookup chain lengths to try: k up to ngram's DRAFT_TOKENS."""
    return list(range(k, max(k, DRAFT_TOKENS) + 1))


def growth(L: int, longest: int | None) -> list[int]:
    """The growing chains to try behind a lookup chain of L: each of GROWTH past L and under `longest` (what the
    drafter can serve), and `longest` itself; none when `longest` is None or not past L."""
    if longest is None or longest <= L:
        return []
    return sorted({g for g in GROWTH if L < g < longest} | {longest})


def pick_rule(values: dict[tuple[int, int] | None, float]) -> tuple[int, int] | None:
    """(L, m) or None (the drafter alone) from each rule's value (predicted speed): the best, else the shortest L
    then largest m among rules within SLACK of it; the drafter alone wins any tie it is in."""
    best = max(values.values())
    close = [key for key, value in values.items() if value >= best * (1 - SLACK)]
    if None in close:
        return None
    return min(close, key=lambda key: (key[0], -key[1]))


def rule_name(rule: tuple | None) -> str:
    if rule is None:
        return "none"
    if rule[0] == "suffix":
        return f"suffix,s={rule[1]:g},max={rule[2]}"
    return f"L={rule[0]},m={rule[1]}" + (f",max={rule[2]}" if len(rule) > 2 else "")


def steps_by_width(forwards: int, proposed_by_position: list[int]) -> Counter:
    """A chain decoder's steps by verify width: proposed_by_position[i] steps had a draft at position i, so
    p[j - 1] - p[j] had exactly j drafts (width j + 1) and the rest of the forwards none (width 1)."""
    p = [*proposed_by_position, 0]
    out = Counter({j + 1: p[j - 1] - p[j] for j in range(1, len(p)) if p[j - 1] - p[j]})
    if forwards - p[0]:
        out[1] += forwards - p[0]
    return out


def predicted_speed(tau: float, widths: dict[int, int], cost: dict[int, float]) -> float:
    """Tokens per plain step's time: tau * steps / their summed verify costs (cost by width, a plain step = 1;
    a width past the curve costs as its widest)."""
    steps = sum(widths.values())
    if not steps:
        return 1.0
    most = max(cost)
    return tau * steps / sum(n * cost[min(w, most)] for w, n in widths.items())


def suffix_available() -> bool:
    """Whether Arctic Inference's suffix tree imports here (the suffix-decoding lookup can be tuned)."""
    from importlib.util import find_spec

    return find_spec("arctic_inference") is not None


def untried_suffix(record: dict) -> bool:
    """A record tuned without suffix decoding where it could be tried now (re-tuned: its decodes are reused)."""
    return suffix_available() and not any(name.startswith("suffix") for name in record.get("tau_by_rule", {}))


def verify_costs(backbone, context: list[int], widest: int, reps: int = COST_REPS) -> dict[int, float]:
    """This machine's verify cost by width 1..`widest` after `context` is cached (eval/timing/bounds.py's
    step_costs, eager, as the tuner times them), relative to width 1, made non-decreasing."""
    from headstart.eval.engine.tree import chain_tree
    from headstart.eval.timing.bounds import step_costs
    from headstart.eval.tuning.speed_model import non_decreasing

    shapes = {str(w): (w, None if w == 1 else chain_tree(w - 1)) for w in range(1, widest + 1)}
    timed = non_decreasing({int(w): s for w, s in step_costs(backbone, shapes, context, reps).items()})
    return {w: s / timed[1] for w, s in timed.items()}


def tune_lookup_rule(
    backbone, proposer: str, loaded, chain: dict, k: int, prompts: list[list[int]], max_new: int,
    lengths: list[int] | None = None, long_chain: int | None = LONG_CHAIN, known: dict | None = None,
    cost: dict[int, float] | None = None, suffix: bool | None = None,
) -> LookupRule:  # fmt: skip
    """Greedy tau and verify widths of the drafter's chain of k (decoder options `chain`) alone and with a lookup
    chain of each L in `lengths` (default: k) chosen at each m, priced by `cost` (default: `verify_costs` measured
    here over the median tuning prompt) -> the rule `pick_rule` keeps, then that rule with chains growing to each
    of `growth(L, long_chain)`, kept when faster, then suffix decoding's draft at each of SUFFIX_SCORES (`suffix`;
    default: where its suffix tree is installed), kept when faster still. `known`: an older record's
    {"tau_by_rule", "widths_by_rule"} for these prompts, rules in both not decoded again."""
    taus: dict = {}
    widths: dict = {}
    old_taus, old_widths = (known or {}).get("tau_by_rule", {}), (known or {}).get("widths_by_rule", {})
    if cost is None:
        context = sorted(prompts, key=len)[len(prompts) // 2]
        cost = verify_costs(backbone, context, (long_chain or DRAFT_TOKENS) + 1)
        log.info("lookup rule: verify cost by width %s", ", ".join(f"w{w} {c:.2f}" for w, c in cost.items()))
    speed = lambda rule: predicted_speed(taus[rule], widths[rule], cost)  # noqa: E731

    def score(rule: tuple | None, step: str) -> float:
        name = rule_name(rule)
        if name in old_taus and name in old_widths:
            taus[rule], widths[rule] = old_taus[name], {int(w): n for w, n in old_widths[name].items()}
            log.info("lookup rule %s, %s: greedy tau %.3f (recorded)", step, name, taus[rule])
            return speed(rule)
        extra = {}
        if rule is not None and rule[0] == "suffix":
            extra = {"lookup_tokens": rule[2], "lookup_min_score": rule[1]}
        elif rule is not None:
            extra = {"lookup_tokens": rule[0], "lookup_min_match": rule[1]}
            extra |= {"lookup_max_tokens": rule[2]} if len(rule) > 2 else {}
        decoder = build_decoder(proposer, backbone, loaded, **chain, **extra)
        accepted = forwards = 0
        steps: Counter = Counter()
        for ids in prompts:
            stats = decoder.generate(list(ids), max_new, temperature=0.0).stats
            accepted, forwards = accepted + sum(stats.accepted_per_step), forwards + stats.target_forwards
            steps += steps_by_width(stats.target_forwards, stats.proposed_by_position)
        taus[rule], widths[rule] = (accepted / forwards if forwards else 1.0), dict(steps)
        log.info(
            "lookup rule %s, %s: greedy tau %.3f, predicted %.3fx on %d prompts",
            step, name, taus[rule], speed(rule), len(prompts),
        )  # fmt: skip
        return speed(rule)

    rules = [None, *((L, m) for L in lengths or [k] for m in range(1, MAX_NGRAM + 1))]
    for i, rule in enumerate(rules, 1):
        score(rule, f"{i}/{len(rules)}")
    best = pick_rule({rule: speed(rule) for rule in rules})
    max_tokens, chosen = None, speed(best)
    if best is not None:
        for most in growth(best[0], long_chain):
            faster = score((*best, most), f"growing with its match to {most}")
            if faster > chosen:
                max_tokens, chosen = most, faster
    suffix_rule = None
    if suffix_available() if suffix is None else suffix:
        tried = [("suffix", s, long_chain or LONG_CHAIN) for s in SUFFIX_SCORES]
        for i, rule in enumerate(tried, 1):
            score(rule, f"suffix decoding {i}/{len(tried)}")
        fastest = max(tried, key=lambda rule: (speed(rule), rule[1]))
        suffix_rule = fastest if speed(fastest) > chosen else None
    else:
        log.info(
            "lookup rule: suffix decoding not tried (no Arctic Inference here; ./launch.sh suffix-setup)"
        )
    # the rule kept: suffix decoding's, else the n-gram's (L, m[, max]) or the drafter alone (min_match None)
    fields = {"source": "ngram", "min_match": None if best is None else best[1], "lookup_tokens": k if best is None else best[0], "max_tokens": max_tokens}  # fmt: skip
    if suffix_rule is not None:
        fields = {"source": "suffix", "min_score": suffix_rule[1], "min_match": None, "lookup_tokens": suffix_rule[2], "max_tokens": None}  # fmt: skip
    return LookupRule(
        k=k,
        tau_by_rule={rule_name(r): tau for r, tau in taus.items()},
        prompts=len(prompts),
        max_new_tokens=max_new,
        widths_by_rule={rule_name(r): {str(w): n for w, n in sorted(ws.items())} for r, ws in widths.items()},
        speed_by_rule={rule_name(r): speed(r) for r in taus},
        verify_cost={str(w): c for w, c in cost.items()},
        **fields,
    )
