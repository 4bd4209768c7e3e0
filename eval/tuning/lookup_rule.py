"""The hybrid's rule, tuned: how long a prompt-lookup match must be before its chain replaces the drafter's, and
how long that chain is.

The hybrid (eval/engine/proposers/lookup_choice.py in headstart's decoder, eval/serving/vllm_plugin.py in vLLM)
verifies each step either the drafter's chain of k or the L tokens that followed the longest suffix n-gram seen
earlier, the latter when that n-gram has at least m tokens. A longer lookup chain only adds tokens behind the
same match (its accepted prefix is never shorter), and the lookup chain of vLLM's `ngram` is DRAFT_TOKENS long, so
L is searched from k up to that (the plugin serves a lookup chain longer than a Medusa drafter's heads).

Each rule is replayed on one recorded greedy decode of the tuning prompts (eval/tuning/replay.py: the output does
not depend on the drafts, so the steps a rule takes follow from what each side proposes at every position); its
tau and the verify width of every step it took are kept, and it is priced with a verify cost by width, relative to
a plain step: the serving engine's where the caller has it (the serve check: vLLM's steps,
eval/serving/vllm_costs.py; `cost_source` "vllm"), else headstart's (`verify_costs`: one eager target forward of w
chained tokens over a prompt's cache): predicted speed = tokens emitted / the steps' summed costs. Where the caller
has the drafter's own price too (`drafter_cost`, the serve check's: what a drafter's step adds in vLLM, and what a
drafter with a KV cache adds to every step), the steps that verify the drafter's chain pay it, so a rule that
takes more lookup steps saves what the drafter would have cost there; without it drafting is priced free. The
best speed wins; among rules within SLACK of it the shortest L (the narrower verify) and the largest m (fewer
drafts replaced). The chosen (L, m) is then tried with chains that grow with
their match (suffix decoding's rule: a match of n > L tokens verifies n) up to each of GROWTH, kept when its
predicted speed is higher: growth changes only the steps whose match is longer than L, and their wider verifies
are priced. A rule kept at m >= 2 is then tried with a drafter floor at each of FLOORS (eval/engine/
drafter_floor.py: a request whose drafter's verified chains average under the floor takes a 1-token match, vLLM
`ngram`'s rule), kept when it prices within SLACK of the rule without it or faster: replayed on the tuning prompts
it moved the categories that copy their prompt (translation, summarization, RAG), where the hybrid lost to `ngram`,
toward `ngram` at an unchanged overall tau. Where Arctic Inference's suffix tree is installed, suffix decoding's
own draft (the prompt's and the earlier replies' suffix trees, up to LONG_CHAIN tokens) is tried in place of the
n-gram chain at each min_score of SUFFIX_SCORES, and kept when it prices faster than the n-gram rule prompt by
prompt, beyond SUFFIX_SE standard errors (the plugin's `source: "suffix"`). Prompts the figure is later scored on must not be among the tuning
prompts (the caller's duty, checked in eval/serve_check.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass, field

from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.drafter_floor import DrafterFloor
from headstart.eval.engine.ngram import chain_length
from headstart.eval.engine.proposers.prompt_lookup import DRAFT_TOKENS, MAX_NGRAM
from headstart.eval.tuning import replay
from headstart.models.decoding import lookup_options

SLACK = 0.01  # relative: a fixed rule this close to the best predicted speed counts as tied
# the chains a growing match may verify, at most (multiples of 1, 2 and 4: vLLM's MTP divisibility); suffix
# decoding's own tree is 24 deep
GROWTH = (8, 16)
LONG_CHAIN = GROWTH[-1]
# the drafter floors tried (accepted drafts a step under which a request's lookup takes a 1-token match)
FLOORS = (0.2, 0.4)
# suffix decoding's draft is taken when its score (the tokens it expects accepted) reaches this: any draft, up to
# Arctic Inference's own rule beside a 3-token speculator
SUFFIX_SCORES = (0.0, 1.0, 2.0, 3.0)
# suffix decoding replaces the n-gram rule only when faster prompt by prompt beyond this many standard errors of
# the mean difference: its drafts depend on the replies before (its global tree), and a pooled +1.6% on the 12
# tuning prompts once served at -9% on others
SUFFIX_SE = 2.0
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
    # a request's min_match is 1 once its drafter averages under this many accepted drafts; None: never
    drafter_floor: float | None = None
    # per rule: steps by verify width (1 + drafts), and the predicted speed over plain decoding they price to
    widths_by_rule: dict[str, dict[str, int]] = field(default_factory=dict)
    speed_by_rule: dict[str, float] = field(default_factory=dict)
    # per rule decoded here, per prompt: [tokens accepted, {width: steps}] (the paired test of the suffix rule)
    prompt_steps_by_rule: dict[str, list] = field(default_factory=dict)
    verify_cost: dict[str, float] = field(default_factory=dict)  # by width, a plain step = 1, this machine
    source: str = "ngram"  # "suffix": suffix decoding's draft of up to lookup_tokens (min_match None)
    min_score: float | None = None  # "suffix": the score its draft needs
    # whose steps verify_cost timed: "headstart" (its eager forward, `verify_costs`) or "vllm" (vllm_costs.py)
    cost_source: str = "headstart"
    predicted: float | None = None  # the kept rule's predicted speed over plain decoding
    # what the drafter adds, in plain steps: {"every": each step, "step": each step verifying its chain}; None:
    # drafting priced free. And per rule, the steps that verified the drafter's chain
    drafter_cost: dict | None = None
    drafter_steps_by_rule: dict[str, int] = field(default_factory=dict)

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


def ngram_parts(rule: tuple) -> tuple:
    """An n-gram rule (L, m[, max[, floor]]) as (L, m, max or None, floor or None)."""
    return (*rule, None, None)[:4]


def rule_name(rule: tuple | None) -> str:
    """A rule's name in the record: "none", "suffix,s=<s>,max=<M>" or "L=<L>,m=<m>[,max=<M>][,floor=<f>]" for
    (L, m[, max[, floor]]) (max None: fixed chains)."""
    if rule is None:
        return "none"
    if rule[0] == "suffix":
        return f"suffix,s={rule[1]:g},max={rule[2]}"
    L, m, most, floor = ngram_parts(rule)
    return f"L={L},m={m}" + (f",max={most}" if most else "") + (f",floor={floor:g}" if floor else "")


def steps_by_width(forwards: int, proposed_by_position: list[int]) -> Counter:
    """A chain decoder's steps by verify width: proposed_by_position[i] steps had a draft at position i, so
    p[j - 1] - p[j] had exactly j drafts (width j + 1) and the rest of the forwards none (width 1). What a decoded
    rule's steps are: the reference the replayed widths are tested against (tests/eval/test_replay.py)."""
    p = [*proposed_by_position, 0]
    out = Counter({j + 1: p[j - 1] - p[j] for j in range(1, len(p)) if p[j - 1] - p[j]})
    if forwards - p[0]:
        out[1] += forwards - p[0]
    return out


def predicted_speed(
    tau: float, widths: dict[int, int], cost: dict[int, float], drafted: int = 0, drafter: dict | None = None
) -> float:
    """Tokens per plain step's time: tau * steps / their summed costs: each step's verify (cost by width, a plain
    step = 1; a width past the curve costs as its widest) and, with the drafter's price `drafter`, its "every"
    on each step and its "step" on the `drafted` steps that verified the drafter's chain."""
    steps = sum(widths.values())
    if not steps:
        return 1.0
    most = max(cost)
    total = sum(n * cost[min(w, most)] for w, n in widths.items())
    if drafter:
        total += steps * drafter["every"] + drafted * drafter["step"]
    return tau * steps / total


def clearly_faster(
    new: list, old: list, cost: dict[int, float], se: float = SUFFIX_SE, drafter: dict | None = None
) -> bool:
    """Per-prompt [accepted, {width: steps}, drafter's steps] of two rules on the same prompts (priced by `cost`
    and `drafter`, as `predicted_speed`): whether `new` emits more tokens per plain step's time than `old` by more
    than `se` standard errors of the mean per-prompt difference."""

    def speed(accepted: int, widths: dict, drafted: int = 0) -> float:
        steps = {int(w): n for w, n in widths.items()}
        return predicted_speed(accepted / max(sum(steps.values()), 1), steps, cost, drafted, drafter)

    d = [speed(*a) - speed(*b) for a, b in zip(new, old, strict=True)]
    if len(d) < 2:
        return False
    mean = sum(d) / len(d)
    sd = (sum((x - mean) ** 2 for x in d) / (len(d) - 1)) ** 0.5
    return mean > se * sd / len(d) ** 0.5


def median(prompts: list[list[int]]) -> list[int]:
    """The context verify costs are timed after: the median-length tuning prompt."""
    return sorted(prompts, key=len)[len(prompts) // 2]


def widest(long_chain: int | None) -> int:
    """The widest verify a rule tuned with chains up to `long_chain` takes (the root and the chain)."""
    return (long_chain or DRAFT_TOKENS) + 1


def suffix_available() -> bool:
    """Whether Arctic Inference's suffix tree imports here (the suffix-decoding lookup can be tuned)."""
    from importlib.util import find_spec

    return find_spec("arctic_inference") is not None


def untried_suffix(record: dict) -> bool:
    """A record tuned without suffix decoding's paired test where it could run now (re-tuned: its decodes are
    reused, only what the test needs is decoded)."""
    tested = record.get("prompt_steps_by_rule", {})
    return suffix_available() and not any(name.startswith("suffix") for name in tested)


def untried_floor(record: dict) -> bool:
    """A record whose n-gram rule (m >= 2) was tuned before drafter floors were tried (re-tuned: its decodes
    are reused)."""
    tried = record.get("tau_by_rule", {})
    return (record.get("min_match") or 0) > 1 and not any(",floor=" in name for name in tried)


def verify_costs(backbone, context: list[int], widest: int, reps: int = COST_REPS) -> dict[int, float]:
    """This machine's verify cost by width 1..`widest` after `context` is cached (eval/timing/bounds.py's
    step_costs, eager, as the tuner times them), relative to width 1, made non-decreasing."""
    from headstart.eval.engine.tree import chain_tree
    from headstart.eval.timing.bounds import step_costs
    from headstart.eval.tuning.speed_model import non_decreasing

    shapes = {str(w): (w, None if w == 1 else chain_tree(w - 1)) for w in range(1, widest + 1)}
    timed = non_decreasing({int(w): s for w, s in step_costs(backbone, shapes, context, reps).items()})
    return {w: s / timed[1] for w, s in timed.items()}


class Trials:
    """The rules tried: each one's greedy decode of the tuning prompts (`decode(rule)` -> per prompt [accepted,
    {width: steps}, drafter's steps], forwards), or its recorded one from `known`, priced by `cost` and the
    drafter's price `drafter` (`predicted_speed`)."""

    def __init__(self, decode, cost: dict[int, float], known: dict | None, drafter: dict | None = None):
        self.decode, self.cost, self.drafter = decode, cost, drafter
        self.taus: dict = {}
        self.widths: dict = {}
        self.drafted: dict = {}
        self.per_prompt: dict = {}
        known = known or {}
        self.old = (
            known.get("tau_by_rule", {}),
            known.get("widths_by_rule", {}),
            known.get("prompt_steps_by_rule", {}),
            known.get("drafter_steps_by_rule", {}),
        )

    def speed(self, rule) -> float:
        return predicted_speed(
            self.taus[rule], self.widths[rule], self.cost, self.drafted.get(rule, 0), self.drafter
        )

    def recorded(self, name: str, paired: bool) -> bool:
        """Whether an older record holds what pricing rule `name` needs (the drafter's steps, where they are
        priced; per prompt for a paired test, with the drafter's steps where they are priced)."""
        taus, widths, prompts, drafted = self.old
        if name not in taus or name not in widths or (self.drafter and name not in drafted):
            return False
        rows = prompts.get(name)
        return not paired or (rows is not None and (not self.drafter or all(len(r) == 3 for r in rows)))

    def score(self, rule: tuple | None, step: str, paired: bool = False) -> float:
        """The rule's predicted speed, decoded unless recorded (`paired`: with its per-prompt steps)."""
        name = rule_name(rule)
        taus, widths, prompts, drafted = self.old
        if self.recorded(name, paired):
            self.taus[rule], self.widths[rule] = taus[name], {int(w): n for w, n in widths[name].items()}
            self.drafted[rule] = drafted.get(name, 0)
            if name in prompts:
                self.per_prompt[rule] = prompts[name]
            log.info("lookup rule %s, %s: greedy tau %.3f (recorded)", step, name, taus[name])
            return self.speed(rule)
        self.per_prompt[rule], forwards = self.decode(rule)
        steps: Counter = Counter()
        for row in self.per_prompt[rule]:
            steps += Counter({int(w): n for w, n in row[1].items()})
        accepted = sum(row[0] for row in self.per_prompt[rule])
        self.drafted[rule] = sum(row[2] for row in self.per_prompt[rule])
        self.taus[rule], self.widths[rule] = (accepted / forwards if forwards else 1.0), dict(steps)
        log.info(
            "lookup rule %s, %s: greedy tau %.3f, predicted %.3fx on %d prompts",
            step, name, self.taus[rule], self.speed(rule), len(self.per_prompt[rule]),
        )  # fmt: skip
        return self.speed(rule)

    def record(self) -> dict:
        """The LookupRule fields of every rule tried."""
        return {
            "tau_by_rule": {rule_name(r): tau for r, tau in self.taus.items()},
            "widths_by_rule": {
                rule_name(r): {str(w): n for w, n in sorted(ws.items())} for r, ws in self.widths.items()
            },
            "speed_by_rule": {rule_name(r): self.speed(r) for r in self.taus},
            "prompt_steps_by_rule": {rule_name(r): steps for r, steps in self.per_prompt.items()},
            "verify_cost": {str(w): c for w, c in self.cost.items()},
            "drafter_cost": self.drafter,
            "drafter_steps_by_rule": {rule_name(r): n for r, n in self.drafted.items()},
        }


def suffix_rule(trials: Trials, kept: tuple | None, chosen: float, most: int) -> tuple | None:
    """Suffix decoding's draft of up to `most` at each of SUFFIX_SCORES: the fastest when it beats the n-gram rule
    `kept` (predicted `chosen`) pooled and prompt by prompt (`clearly_faster`), else None."""
    tried = [("suffix", s, most) for s in SUFFIX_SCORES]
    for i, rule in enumerate(tried, 1):
        trials.score(rule, f"suffix decoding {i}/{len(tried)}", paired=True)
    fastest = max(tried, key=lambda rule: (trials.speed(rule), rule[1]))
    trials.score(kept, "the kept n-gram rule, per prompt", paired=True)
    pp = trials.per_prompt
    won = trials.speed(fastest) > chosen and clearly_faster(
        pp[fastest], pp[kept], trials.cost, drafter=trials.drafter
    )
    log.info(
        "lookup rule: suffix decoding (%s, %.3fx) %s the n-gram rule (%.3fx)",
        rule_name(fastest), trials.speed(fastest), "replaces" if won else "does not clearly beat", chosen,
    )  # fmt: skip
    return fastest if won else None


def choice(rule: tuple | None) -> replay.Choice:
    """The chain a rule tried here verifies at a recorded position (eval/tuning/replay.py), as headstart's decoder
    running `decoder_options(rule)` chooses it (eval/engine/proposers/lookup_choice.py)."""
    if rule is None:
        return lambda p, tokens, t: p.drafts
    if rule[0] == "suffix":
        return lambda p, tokens, t: p.suffix[1] if p.suffix[1] and p.suffix[0] >= rule[1] else p.drafts
    L, m, most, floor = ngram_parts(rule)
    limit, base, longest = (MAX_NGRAM, None, L) if most is None else (max(MAX_NGRAM, most), L, most)
    weak = None if floor is None else DrafterFloor(floor)  # per decode (its token list), as per request

    def choose(p: replay.Position, tokens: list[int], t: int) -> list[int]:
        n, chain = p.ngram[limit]
        chain = chain[: chain_length(n, base, longest)]
        least = m
        if weak is not None:
            weak.seen(id(tokens), t)
            least = weak.min_match(id(tokens), m)
        if n >= least and chain:
            return chain
        if weak is not None:
            weak.drafted(id(tokens), t, len(p.drafts))
        return p.drafts

    return choose


def replayed(decodes: list[replay.Decoded], rule: tuple | None) -> tuple[list, int]:
    """A rule's per-prompt [tokens emitted, {width: steps}, steps verifying the drafter's chain] and its forwards,
    replayed on recorded decodes: what decoding it gives (Trials keeps it so)."""
    rows, forwards = [], 0
    for d in decodes:
        emitted, widths, drafted = replay.replay(d, choice(rule))
        rows.append([emitted, {str(w): n for w, n in sorted(widths.items())}, drafted])
        forwards += sum(widths.values())
    return rows, forwards


def decoder_options(rule: tuple | None) -> dict:
    """headstart's decoder options that run a rule tried here (models/decoding.py `lookup_options`)."""
    if rule is None:
        return {}
    if rule[0] == "suffix":
        return lookup_options({"source": "suffix", "min_score": rule[1], "lookup_tokens": rule[2]})
    L, m, most, floor = ngram_parts(rule)
    return lookup_options({"lookup_tokens": L, "min_match": m, "max_tokens": most, "drafter_floor": floor})


def tune_lookup_rule(
    backbone, proposer: str, loaded, chain: dict, k: int, prompts: list[list[int]], max_new: int,
    lengths: list[int] | None = None, long_chain: int | None = LONG_CHAIN, known: dict | None = None,
    cost: dict[int, float] | None = None, suffix: bool | None = None, cost_source: str = "headstart",
    drafter_cost: dict | None = None,
) -> LookupRule:  # fmt: skip
    """Greedy tau and verify widths of the drafter's chain of k (decoder options `chain`) alone and with a lookup
    chain of each L in `lengths` (default: k) chosen at each m, priced by `cost` (whose steps it timed:
    `cost_source`; default: `verify_costs` measured here over the median tuning prompt) and the drafter's own price
    `drafter_cost` (eval/serving/vllm_costs.py `drafter_price`; None: drafting priced free) -> the rule `pick_rule`
    keeps, then that rule with chains growing to each of `growth(L, long_chain)`, kept when faster, then (at
    m >= 2) with each drafter floor of FLOORS, kept when within SLACK or faster, then suffix decoding's draft at
    each of SUFFIX_SCORES (`suffix`; default: where its suffix tree is installed), kept when faster still prompt
    by prompt (`suffix_rule`).
    `known`: an older record's {"tau_by_rule", "widths_by_rule", "prompt_steps_by_rule"} for these prompts, rules
    recorded not decoded again."""
    if cost is None:
        cost, cost_source = verify_costs(backbone, median(prompts), widest(long_chain)), "headstart"
        log.info("lookup rule: verify cost by width %s", ", ".join(f"w{w} {c:.2f}" for w, c in cost.items()))

    decodes: list = []  # the one recorded greedy decode every rule is replayed on, made when first needed

    def decode(rule: tuple | None) -> tuple[list, int]:
        if not decodes:
            decoder = build_decoder(proposer, backbone, loaded, **chain)
            most = long_chain or LONG_CHAIN
            limits = (MAX_NGRAM, *(max(MAX_NGRAM, g) for g in (*GROWTH, most)))
            with_suffix = suffix_available() if suffix is None else suffix
            recorder = replay.Recorder(decoder.proposer, limits, most, with_suffix)
            decodes.extend(replay.record(decoder, prompts, max_new, recorder))
        return replayed(decodes, rule)

    trials = Trials(decode, cost, known, drafter_cost)
    rules = [None, *((L, m) for L in lengths or [k] for m in range(1, MAX_NGRAM + 1))]
    for i, rule in enumerate(rules, 1):
        trials.score(rule, f"{i}/{len(rules)}")
    best = pick_rule({rule: trials.speed(rule) for rule in rules})
    max_tokens, floor, chosen = None, None, trials.speed(best)
    if best is not None:
        for most in growth(best[0], long_chain):
            faster = trials.score((*best, most), f"growing with its match to {most}")
            if faster > chosen:
                max_tokens, chosen = most, faster
    if best is not None and best[1] > 1:
        scored = {f: trials.score((*best, max_tokens, f), f"drafter floor {f:g}") for f in FLOORS}
        fastest = max(scored, key=scored.get)
        if scored[fastest] >= chosen * (1 - SLACK):
            floor, chosen = fastest, scored[fastest]
    # the rule kept: suffix decoding's, else the n-gram's (L, m[, max[, floor]]) or the drafter alone (min_match None)
    fields = {"source": "ngram", "min_match": None if best is None else best[1], "lookup_tokens": k if best is None else best[0], "max_tokens": max_tokens, "drafter_floor": floor}  # fmt: skip
    if suffix_available() if suffix is None else suffix:
        kept = best if (max_tokens, floor) == (None, None) else (*best, max_tokens, floor)
        won = suffix_rule(trials, kept, chosen, long_chain or LONG_CHAIN)
        if won is not None:
            fields = {"source": "suffix", "min_score": won[1], "min_match": None, "lookup_tokens": won[2], "max_tokens": None, "drafter_floor": None}  # fmt: skip
            chosen = trials.speed(won)
    else:
        log.info(
            "lookup rule: suffix decoding not tried (no Arctic Inference here; ./launch.sh suffix-setup)"
        )
    return LookupRule(
        k=k,
        prompts=len(prompts),
        max_new_tokens=max_new,
        cost_source=cost_source,
        predicted=chosen,
        **trials.record(),
        **fields,
    )
