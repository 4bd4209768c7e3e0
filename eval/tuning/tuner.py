"""Decoding settings chosen from measured cost: for a drafter checkpoint on the eval device, measure the verify
forward's cost by width, the drafter's cost per setting and the decoder's bookkeeping; take acceptance by depth
and rank (the checkpoint's held-out Medusa head accuracies, or measured by decoding a few tuning prompts with a
wide probe tree at the eval's temperature); then pick, maximizing the predicted tokens/s
(eval/tuning/speed_model.py), the tree for headstart's decoder and the chain length K for vLLM's
`num_speculative_tokens`. When no setting is predicted faster than plain decoding, the choice is plain decoding.

The probe reads its own prompts (eval/tuning/prompts.py), never the ones an eval scores. The choice is kept
beside the checkpoint in `decoding.json` (models/decoding.py), one record per condition (eval/tuning/records.py
reuses or adds them), where the eval stage and the exports find it.

What a proposer offers the tuner (its settings, its probe tree, its drafter steps) lives in its own module
(`tuning()` in eval/engine/proposers/); proposers without one keep their hand-set defaults.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.device import sync
from headstart.eval.engine.proposers import VANILLA, tuning
from headstart.eval.engine.proposers.base import Setting
from headstart.eval.engine.proposers.lookup_branch import shared_prefix
from headstart.eval.engine.proposers.prompt_lookup import MAX_NGRAM, find_candidates
from headstart.eval.engine.tree import Tree, chain_tree
from headstart.eval.timing.bounds import step_costs
from headstart.eval.tuning import confirm
from headstart.eval.tuning.prompts import DEFAULT_TUNING_PROMPTS
from headstart.eval.tuning.speed_model import (
    Branch,
    Costs,
    LookupStep,
    non_decreasing,
    rank,
    rank_with_branch,
)
from headstart.eval.tuning.workload import Workload, contexts, weighted
from headstart.models.checkpoint import LoadedDrafter

log = logging.getLogger("headstart.eval")
# 2: the lookup branch the tree was chosen for; 3: its step cost over the branch's widths; 4: tuned on prompts
# apart from the scored ones, at the eval's temperature class, for a stated thread count, plain decoding a choice;
# 5: compiled steps priced over cache-length buckets (eval/engine/runner.py), not the whole preallocated cache;
# 6: steps priced at the probe's median sequence, not its first (a compiled step's cost depends on the bucket);
# 7: the lookup branch's length chosen too (`branch_tokens`, up to the eval's lookup_tokens); 8: compiled steps
# priced at the branch's whole width, as the decoder pads them; 9: the finalists priced by decoding them; 10: a
# compiled step the branch added nothing to verifies the tree alone (the decoder's two widths), the Medusa draft compiled;
# 11: steps priced at the eval's context lengths (eval/tuning/workload.py) and answer length, an untimed compiled
# width at the next timed one's cost
VERSION = 11
LOOKUP_KEY = "lookup search"  # the branch's cost, timed beside the drafter's settings
# verify widths timed (up to max_width); compiled, each width compiles once (minutes on a CPU): fewer of them,
# the costs between interpolated
WIDTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128)
COMPILED_WIDTHS = (1, 2, 4, 8, 16, 32, 64, 96)
MODES = ("auto", "force", "off")
WORKLOADS = ("eval", "probe")
DEFAULT_PROBE_TOKENS = 48  # tuner.probe_tokens=0 without an eval's max_new_tokens
PLAIN, SPECULATE = "plain", "speculate"  # a record's `choice`


@dataclass
class TunerConfig:
    # auto: reuse the checkpoint's decoding.json record for this condition (temperature class, device, dtype,
    # threads, drafter weights, lookup branch), else measure and add one; force: measure again; off: the
    # proposers' hand-set defaults
    mode: str = "auto"
    # the probe's prompts: never the eval's scored prompts (an overlap is refused); the default shares none
    # with the dev prompts
    prompts: str = DEFAULT_TUNING_PROMPTS
    # CPU threads the settings are chosen for; 0: torch's count (OMP_NUM_THREADS, else the machine's cores),
    # whatever the load at start: load is the timing harness's business (it interleaves), not the tree's
    threads: int = 0
    reps: int = 7  # timed runs per verify width and per drafter setting (medians, order alternating)
    # widest verify forward considered (root included); 0: 32 on CPU (8 compiled: each width compiles for
    # minutes, and under AVX2 kernels a compiled 16 cost 1.3x an 8), 96 on CUDA
    max_width: int = 0
    # prompts decoded with the probe tree (acceptance by depth and rank, bookkeeping, the lookup branch's
    # gain). 6: on the main job's heads two prompts put the branch's gain anywhere from 0.11 to 0.52 tokens per
    # step depending on which two; six gave 0.37, the 22 dev prompts ~0.3
    probe_prompts: int = 6
    # new tokens per probe prompt, and per finalist decode; 0: as many as the eval's answers (max_new_tokens;
    # 48 where no eval is named): the lookup branch's chain is searched over the context the answer so far
    # makes, and the confirm's step costs over the cache it fills, so both are priced at the eval's length
    probe_tokens: int = 0
    # auto: the checkpoint's own table when it has one (Medusa's held-out head accuracies) and the eval is
    # greedy, else measured by the probe; measured: always the probe's
    acceptance: str = "auto"
    min_trials: int = 8  # a depth whose parent was accepted fewer times in the probe is not modelled
    # speculate only when the best setting is predicted at least this much faster than plain decoding: near 1x
    # the prediction ran 12-18% high on the CPUs measured (docs/results.md), and a speculation that loses costs
    # more than a plain decode that could have won a few percent. Decided on every use, a reused record too
    min_gain: float = 0.10
    # the model's best settings re-priced by decoding each beside plain decoding (eval/tuning/confirm.py): the
    # parts timed apart missed ~5 ms of a 44 ms compiled step under AVX2 kernels; 0: the model's price stands
    confirm: int = 3
    # the context lengths steps are priced at: eval: the scored prompts' lengths (never their text), grouped by
    # cache bucket and weighted by their share of the decode steps (eval/tuning/workload.py); probe: the probe's
    # median sequence alone (on the main job's heads that priced a 7-wide verify over short prompts, and it lost
    # to a 4-wide one over the eval's long ones)
    workload: str = "eval"

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"tuner.workload={self.workload!r}: expected one of {WORKLOADS}")
        if self.mode not in MODES or self.acceptance not in ("auto", "measured"):
            raise ValueError(
                f"tuner.mode={self.mode!r} / tuner.acceptance={self.acceptance!r}: expected mode in {MODES} "
                "and acceptance in (auto, measured)"
            )
        if self.reps < 3 or self.max_width < 0 or self.probe_prompts < 1 or 0 < self.probe_tokens < 4:
            raise ValueError(
                "tuner: reps >= 3, max_width >= 0, probe_prompts >= 1 and probe_tokens >= 4 (or 0: the eval's "
                "max_new_tokens) expected"
            )
        if self.threads < 0 or self.confirm < 0:
            raise ValueError(
                f"tuner.threads={self.threads} / tuner.confirm={self.confirm}: expected >= 0 (threads 0: the "
                "machine's cores; confirm 0: no finalist decoded)"
            )
        if not 0 <= self.min_gain < 1:
            raise ValueError(
                f"tuner.min_gain={self.min_gain}: expected in [0, 1) (0.10: 10% faster at least)"
            )


@dataclass(frozen=True)
class Use:
    """What the settings are chosen for: the eval's sampling (the probe decodes with it; temperature 0 and
    above 0 are separate records), the prompt-lookup branch carried on the tree (0: none), and whether the
    verify forwards run compiled (eval/engine/compiled.py) over a KV cache of `compile_cache` positions (0:
    eager). Compiled steps are priced compiled, at that cache length, so the eval reuses the graphs. `workload`:
    the context lengths the eval's steps run at, with their shares (eval/tuning/workload.py); steps are priced
    at each and weighted ((): at the probe's median sequence)."""

    temperature: float = 0.0
    top_p: float = 1.0
    lookup_tokens: int = 0
    compile_cache: int = 0
    workload: Workload = ()
    new_tokens: int = 0  # the eval's max_new_tokens (0: not known; tuner.probe_tokens=0 then probes 48)

    @property
    def compiled(self) -> bool:
        return self.compile_cache > 0

    def __post_init__(self) -> None:
        if self.lookup_tokens < 0 or self.temperature < 0:
            raise ValueError(
                f"lookup_tokens={self.lookup_tokens}, temperature={self.temperature}: must be >= 0 "
                "(lookup_tokens 0 = no lookup branch)"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Use()  # greedy, no lookup branch


# ---------------------------------------------------------------- acceptance by depth and rank


def node_ranks(tree: Tree) -> list[int]:
    """Each node's rank: its top-k rank when the tree has them (Medusa), else its order among its siblings
    (EAGLE lists candidates best first under each parent)."""
    if len(tree.ranks) == tree.size:
        return list(tree.ranks)
    ranks, seen = [0] * tree.size, {}
    for i in range(1, tree.size):
        ranks[i] = seen.get(tree.parents[i], 0)
        seen[tree.parents[i]] = ranks[i] + 1
    return ranks


def count_path(tree: Tree, path: list[int], hits: list[list[int]], trials: list[int]) -> None:
    """Add one verified step to the counts: at depth d (1-based) the step is a trial when the accepted node at
    depth d-1 has children in the tree, and a hit at rank r when its rank-r child was accepted (`node_ranks`)."""
    children: dict[int, list[int]] = {}
    for i in range(1, tree.size):
        children.setdefault(tree.parents[i], []).append(i)
    rank_of = node_ranks(tree)
    for d in range(1, tree.max_depth + 1):
        kids = children.get(path[d - 1]) if d - 1 < len(path) else None
        if not kids:
            return
        while len(trials) < d:
            trials.append(0)
            hits.append([])
        trials[d - 1] += 1
        ranks = [rank_of[k] for k in kids]
        hits[d - 1].extend([0] * (max(ranks) + 1 - len(hits[d - 1])))  # every rank offered is a column
        if d >= len(path):
            return
        hits[d - 1][ranks[kids.index(path[d])]] += 1


def acceptance_table(
    hits: list[list[int]], trials: list[int], min_trials: int, ranks: int
) -> list[list[float]]:
    """acc[d][r] = P(rank-r child accepted | parent accepted), for the depths with at least `min_trials`
    trials (stopping at the first that has fewer), `ranks` ranks each."""
    table = []
    for h, n in zip(hits, trials):
        if n < min_trials:
            break
        table.append([(h[r] if r < len(h) else 0) / n for r in range(ranks)])
    return table


@dataclass(frozen=True)
class ProbeStep:
    """One verified step of the probe: the draft tree, the accepted path (node indices, root first), the draft
    tokens, the lookup chain the n-gram search found there and the context length it was searched in."""

    tree: Tree
    path: list[int]
    tokens: list[int]
    chain: list[int]
    at: int


class _Recorder:
    """A proposer wrapper that keeps every step of a decode (`ProbeStep`), grouped by prompt (`start`); the
    lookup chain is searched for a branch of `lookup_tokens` (none when 0)."""

    def __init__(self, proposer, lookup_tokens: int = 0) -> None:
        self.inner, self.width, self.k = proposer, proposer.width, lookup_tokens
        self.groups: list[list[ProbeStep]] = []
        self._step: ProbeStep | None = None

    def start(self, prompt, hidden) -> None:
        self.groups.append([])
        self.inner.start(prompt, hidden)

    def propose(self, context, sampling):
        draft = self.inner.propose(context, sampling)
        self._step = None
        if draft is not None:
            chain = find_candidates(torch.tensor(context), MAX_NGRAM, self.k) if self.k else []
            self._step = ProbeStep(draft.tree, [], draft.tokens.tolist(), list(chain), len(context))
        return draft

    def accepted(self, path, hidden) -> None:
        if self._step is not None:
            s = self._step
            self.groups[-1].append(ProbeStep(s.tree, list(path), s.tokens, s.chain, s.at))
        self.inner.accepted(path, hidden)


def lookup_steps(groups: list[list[ProbeStep]], sequences: list[list[int]]) -> list[LookupStep]:
    """The probe's steps as a lookup branch would have seen them, given each prompt's prompt + answer (what the
    target accepts: a chain token is accepted when it equals the answer's token at its position; exact when
    greedy, the sampled answer's tokens otherwise)."""
    out = []
    for group, seq in zip(groups, sequences, strict=True):
        for s in group:
            ranks = node_ranks(s.tree)
            answer = seq[s.at :]
            n = 0
            while n < len(s.chain) and n < len(answer) and s.chain[n] == answer[n]:
                n += 1
            shared = tuple(ranks[i] for i in shared_prefix(s.tokens, s.tree.parents, s.chain))
            out.append(LookupStep(tuple(ranks[i] for i in s.path[1:]), n, shared, len(s.chain)))
    return out


# ---------------------------------------------------------------- measuring


@torch.no_grad()
def time_calls(calls: dict, reps: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each callable, run `reps` times in a rotating order after one untimed round."""
    names, times = list(calls), {n: [] for n in calls}
    for rep in range(reps + 1):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            sync(device)
            t0 = time.perf_counter()
            calls[name]()
            sync(device)
            if rep:
                times[name].append(time.perf_counter() - t0)
    return {n: float(np.median(t)) for n, t in times.items()}


@dataclass
class Decoded:
    """A probe decode: bookkeeping seconds per step, the first prompt's prefill seconds, each prompt + answer."""

    bookkeeping_s: float
    prefill_s: float
    sequences: list[list[int]]


def _decode(decoder: Decoder, prompts: list[list[int]], new_tokens: int, use: Use) -> Decoded:
    """Decodes at the eval's sampling without EOS stops (prompt i sampled with seed i), after one warm-up
    decode of the first prompt."""
    book, steps, prefill, sequences = 0.0, 0, 0.0, []
    decoder.generate(prompts[0], 8, eos_token_ids=[])  # warm-up
    for i, ids in enumerate(prompts):
        out = decoder.generate(ids, new_tokens, use.temperature, use.top_p, seed=i, eos_token_ids=[])
        book, steps = book + out.stats.time_s["bookkeeping"], steps + out.stats.target_forwards
        if i == 0:
            prefill = out.stats.time_s["prefill"]
        sequences.append(ids + out.tokens)
    return Decoded(book / max(steps, 1), prefill, sequences)


@dataclass
class Measured:
    """What `measure` found: the costs (the drafter's still empty), the acceptance table the probe measured, the
    probe's description, a prompt + answer to time steps after, the widest verify width considered, and the
    probe's steps as a lookup branch would have seen them (empty without one)."""

    costs: Costs
    acceptance: list[list[float]]
    probe: dict
    context: list[int]
    max_width: int
    branch_steps: list[LookupStep] = field(default_factory=list)
    # the contexts steps were priced after, one a workload length (none: the probe's median sequence alone)
    priced: list[list[int]] = field(default_factory=list)


@dataclass
class ProbeRun:
    """The probe's decodes: bookkeeping seconds per step by width (plain, the default setting, the probe tree),
    the first prompt's prefill, each prompt + answer, the recorded steps by prompt (the warm-up first), and the
    probe's options and width."""

    bookkeeping: dict[int, float]
    prefill_s: float
    sequences: list[list[int]]
    groups: list[list[ProbeStep]]
    options: dict
    width: int


def _probe(method, backbone, loaded, prompts, cfg: TunerConfig, hooks, use: Use, cache: int) -> ProbeRun:
    """Decode the prompts with the proposer's wide probe tree, recording every step. The decoders go when it
    returns (EAGLE proposers' feature hooks with them), before any forward is timed."""
    vanilla = Decoder(backbone, VANILLA, max_cache_len=cache)
    plain = _decode(vanilla, prompts[:1], cfg.probe_tokens, use)
    default = build_decoder(method, backbone, loaded, max_cache_len=cache)
    b_default = _decode(default, prompts[:1], cfg.probe_tokens, use).bookkeeping_s
    options = hooks.probe(backbone.device.type == "cuda")
    probe = build_decoder(method, backbone, loaded, max_cache_len=cache, **options)
    probe.proposer = recorder = _Recorder(probe.proposer, use.lookup_tokens)
    decoded = _decode(probe, prompts, cfg.probe_tokens, use)
    width = probe.proposer.width
    book = {1: plain.bookkeeping_s, default.proposer.width: b_default, width: decoded.bookkeeping_s}
    return ProbeRun(book, plain.prefill_s, decoded.sequences, recorder.groups, options, width)


def measure(method, backbone, loaded: LoadedDrafter, prompts: list[list[int]], cfg: TunerConfig, hooks,
            use: Use = GREEDY) -> Measured:  # fmt: skip
    """Costs without the drafter's, and acceptance by depth and rank from the probe (see `Measured`)."""
    cache = max(len(p) for p in prompts) + cfg.probe_tokens + 512
    run = _probe(method, backbone, loaded, prompts, cfg, hooks, use, cache)
    # without a workload, steps priced at a typical cache length, the probe's median sequence (a compiled step's
    # cost grows with the cache bucket it attends over, so the first or longest sequence misprices every other)
    by_length = sorted(run.sequences, key=len)
    context = by_length.pop(len(by_length) // 2)
    priced = contexts([context, *by_length], use.workload) if use.workload else [context]
    branch = lookup_steps(run.groups[1:], run.sequences) if use.lookup_tokens else []  # [0]: the warm-up
    hits, trials = [], []
    for step in (s for g in run.groups for s in g):
        count_path(step.tree, step.path, hits, trials)
    ranks = max((len(h) for h in hits), default=1)
    measured = acceptance_table(hits, trials, cfg.min_trials, ranks)
    probe = {"options": run.options, "width": run.width, "steps": sum(map(len, run.groups)),
             "trials_by_depth": trials, "prompts": len(prompts), "tokens": cfg.probe_tokens,
             "compiled": use.compiled}  # fmt: skip
    max_width = cfg.max_width or (96 if backbone.device.type == "cuda" else 8 if use.compiled else 32)
    widths = [w for w in (COMPILED_WIDTHS if use.compiled else WIDTHS) if w <= max_width]
    shapes = {str(w): (w, None if w == 1 else chain_tree(w - 1)) for w in widths}
    compiled = dict.fromkeys(shapes, True) if use.compiled else None
    timed = [
        step_costs(backbone, shapes, c, cfg.reps, compiled, max_cache_len=use.compile_cache) for c in priced
    ]
    raw = {int(w): s for w, s in weighted(timed, use.workload).items()}
    costs = Costs(verify=non_decreasing(raw), draft={}, bookkeeping=run.bookkeeping, prefill=run.prefill_s,
                  between="next" if use.compiled else "linear")  # fmt: skip
    probe["verify_s_as_timed"] = {str(w): t for w, t in raw.items()}  # before the non-decreasing fit
    if use.workload:
        probe["verify_s_by_context"] = {str(len(c)): t for c, t in zip(priced, timed)}
    return Measured(costs, measured, probe, context, max_width, branch, priced)


# ---------------------------------------------------------------- choosing


def _acceptance(cfg: TunerConfig, hooks, m: Measured, use: Use) -> tuple[list[list[float]], str]:
    """(table, source): the checkpoint's own table (Medusa's held-out top-k accuracies: a greedy figure) when
    the eval is greedy and tuner.acceptance=auto, else the probe's, measured at the eval's sampling."""
    table = hooks.table() if cfg.acceptance == "auto" and use.greedy else None
    acc, source = (table, "checkpoint") if table else (m.acceptance, "measured")
    if not acc:
        raise ValueError(
            f"the tuner's probe accepted too few drafts to measure acceptance ({m.probe['trials_by_depth']} trials "
            f"by depth, < tuner.min_trials={cfg.min_trials}). Fix: more tuner.probe_prompts / probe_tokens, "
            "or tuner.mode=off"
        )
    return acc, source


def _summary(setting: Setting, pred: dict) -> dict:
    tree = setting.tree
    branch = {"branch_tokens": pred["branch_tokens"]} if "branch_tokens" in pred else {}
    return (
        {"verify_width": tree.size, "depth": tree.max_depth, "nodes": tree.size - 1}
        | branch
        | {k: v for k, v in setting.options.items() if k != "tree"}
    )


def _listed(ranked: list[tuple[Setting, dict]]) -> list[dict]:
    """Ranked settings as a record lists them: each one's summary and width beside its prediction."""
    return [{"summary": _summary(s, p) | {"width": s.tree.size}, **p} for s, p in ranked]


def decide(ranked: list[tuple[Setting, dict]], min_gain: float = 0.0) -> tuple[str, str]:
    """(choice, reason): speculate with the fastest setting when it is predicted more than `min_gain` faster than
    plain decoding, else plain decoding (no setting at or below 1x is ever chosen: plain is as fast and has
    nothing to lose)."""
    best, pred = ranked[0]
    return decide_speedup(pred["speedup"], f"the best of {len(ranked)} ({_summary(best, pred)})", min_gain)


def decide_speedup(speedup: float, what: str, min_gain: float) -> tuple[str, str]:
    """`decide` on the best setting's predicted speedup (`what` names it)."""
    if speedup > 1.0 + min_gain:
        return SPECULATE, f"predicted {speedup:.3f}x over plain decoding"
    if speedup > 1.0:
        return PLAIN, (
            f"no setting is predicted {min_gain:.0%} faster than plain decoding (tuner.min_gain): {what} at "
            f"{speedup:.3f}x, within the prediction's error"
        )
    return PLAIN, f"no setting is predicted faster than plain decoding: {what} at {speedup:.3f}x"


def _largest(m: Measured, use: Use) -> list[int]:
    """The context the finalists are decoded after: the workload's largest group's, else the probe's median."""
    shares = [s for _, s in use.workload] or [1.0]
    return m.priced[shares.index(max(shares))]


def tune(
    method: str,
    backbone,
    loaded: LoadedDrafter,
    prompts: list[list[int]],
    cfg: TunerConfig,
    use: Use = GREEDY,
) -> dict | None:
    """Measure and choose -> the decoding record (what decoding.json holds, without `conditions`: the caller
    adds them, eval/tuning/records.py), None when the proposer has no tuning hooks. With `use.lookup_tokens`,
    the tree is chosen for the decoder that carries a prompt-lookup branch of that many tokens
    (eval/tuning/speed_model.py models it); vLLM's chain never has one. Runs under the caller's thread count."""
    cfg = replace(cfg, probe_tokens=cfg.probe_tokens or use.new_tokens or DEFAULT_PROBE_TOKENS)
    served = {k: v for k, v in loaded.drafter.serving(backbone, loaded.meta).items() if v is not None}
    hooks = tuning(method, backbone, **served)
    if hooks is None:
        return None
    t0 = time.perf_counter()
    m = measure(method, backbone, loaded, prompts, cfg, hooks, use)
    acc, source = _acceptance(cfg, hooks, m, use)
    settings = hooks.settings(acc, m.max_width)
    chains = [hooks.chain(k) for k in range(1, min(hooks.max_chain, len(acc)) + 1)]
    keys = {s.draft_key for s in settings + chains}
    calls = hooks.draft_steps(backbone, keys, m.context[: len(prompts[0])], use.compiled)
    if use.lookup_tokens:  # the branch's n-gram search, once per step, after each priced context
        for i, c in enumerate(m.priced):
            ids = torch.tensor(c)
            calls[f"{LOOKUP_KEY} {i}"] = lambda ids=ids: find_candidates(ids, MAX_NGRAM, use.lookup_tokens)
    costs = m.costs
    costs.draft = time_calls(calls, cfg.reps, backbone.device)
    if use.lookup_tokens:
        search = [{LOOKUP_KEY: costs.draft.pop(f"{LOOKUP_KEY} {i}")} for i in range(len(m.priced))]
        costs.draft |= weighted(search, use.workload)
    # compiled steps run at fixed shapes: a step the chain added to pays the branch's whole width (padded)
    padded = use.lookup_tokens if use.compiled else 0
    branch = Branch(m.branch_steps, costs.draft.pop(LOOKUP_KEY), padded) if use.lookup_tokens else None
    ranked = (
        rank_with_branch(settings, acc, costs, branch, use.lookup_tokens)
        if branch
        else rank(settings, acc, costs)
    )
    ranked_k = rank(chains, acc, costs)
    top = _listed(ranked[:5])
    plain_s, confirmed = costs.vanilla_step(), {}
    # the model's finalists decoded beside plain decoding: their prices become the decoded ones
    if cfg.confirm:
        ranked, plain_s = confirm.confirm(method, backbone, loaded, ranked, _largest(m, use),
                                          n=cfg.confirm, new_tokens=cfg.probe_tokens, reps=cfg.reps, use=use,
                                          prompts=prompts)  # fmt: skip
        confirmed = {"confirmed": _listed(ranked), "plain_step_ms": 1000 * plain_s}
    (best, pred), (chain, chain_pred) = ranked[0], ranked_k[0]
    choice, reason = decide(ranked, cfg.min_gain)
    if confirmed:
        reason += (
            f"; its step decoded at {pred['step_ms']:.1f} ms (modelled {pred['step_ms_modelled']:.1f}), "
            f"plain's at {1000 * plain_s:.1f}"
        )
    vanilla = {"vanilla_tokens_per_s": 1 / plain_s, "prefill_vanilla_steps": costs.prefill / plain_s}
    return {
        "version": VERSION,
        "method": method,
        "lookup_tokens": use.lookup_tokens,  # the condition: the longest branch the eval allows
        "branch_tokens": pred.get("branch_tokens", 0),  # the branch length chosen with the tree (0: none)
        "choice": choice,  # plain: the eval decodes plainly; `decoder` is then the best setting it turned down
        "choice_reason": reason,
        "min_gain": cfg.min_gain,
        "decoder": best.options,
        "decoder_summary": _summary(best, pred),
        "predicted": pred | vanilla,
        "vllm": {"num_speculative_tokens": chain.tree.size - 1, **chain_pred},
        "top": top,  # the model's ranking; `confirmed`: its finalists as decoded, fastest first
        **confirmed,
        "acceptance": {"source": source, "table": acc, "measured": m.acceptance, "probe": m.probe}
        | ({"lookup_steps": len(m.branch_steps)} if use.lookup_tokens else {}),
        "costs_s": costs.to_json() | ({"lookup_search": branch.search_s} if branch else {}),
        "sampling": {"temperature": use.temperature, "top_p": use.top_p},
        "seconds": time.perf_counter() - t0,
    }
