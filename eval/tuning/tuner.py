"""Decoding settings chosen from measured cost: for a drafter checkpoint on the eval
device, measure the verify forward's cost by width, the drafter's cost per setting and the decoder's
bookkeeping; take acceptance by depth and rank (the checkpoint's held-out Medusa head accuracies, or measured by
decoding a few dev prompts with a wide probe tree); then pick, maximizing the predicted tokens/s
(eval/tuning/speed_model.py), the tree for headstart's decoder and the chain length K for vLLM's
`num_speculative_tokens`. The choice is written beside the checkpoint (`decoding.json`, models/checkpoint.py),
where the eval stage and the exports find it.

What a proposer offers the tuner (its settings, its probe tree, its drafter steps) lives in its own module
(`tuning()` in eval/engine/proposers/); proposers without one keep their hand-set defaults.
"""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import dataclass

import numpy as np
import torch

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.device import sync
from headstart.eval.engine.proposers import VANILLA, tuning
from headstart.eval.engine.proposers.lookup_branch import shared_prefix
from headstart.eval.engine.proposers.prompt_lookup import MAX_NGRAM, find_candidates
from headstart.eval.engine.tree import Tree, chain_tree
from headstart.eval.timing.bounds import step_costs
from headstart.eval.timing.harness import choose_threads
from headstart.eval.tuning.speed_model import Branch, Costs, LookupStep, non_decreasing, rank, speedup_at
from headstart.models.checkpoint import LoadedDrafter, read_decoding, weights_signature, write_decoding
from headstart.models.int8 import weights_of

log = logging.getLogger("headstart.eval")
VERSION = 3  # 2: records the lookup branch the tree was chosen for; 3: its step cost over the branch's widths
LOOKUP_KEY = "lookup search"  # the branch's cost, timed beside the drafter's settings
WIDTHS = (
    1,
    2,
    3,
    4,
    5,
    6,
    8,
    10,
    12,
    16,
    20,
    24,
    32,
    48,
    64,
    96,
    128,
)  # verify widths timed (up to max_width)
MODES = ("auto", "force", "off")


@dataclass
class TunerConfig:
    # auto: reuse <checkpoint>/decoding.json when it was measured on this device, dtype, thread count and
    # weights, else measure and save it; force: measure again; off: the proposers' hand-set defaults
    mode: str = "auto"
    reps: int = 7  # timed runs per verify width and per drafter setting (medians, order alternating)
    max_width: int = 0  # widest verify forward considered (root included); 0: 32 on CPU, 96 on CUDA
    # dev prompts decoded with the probe tree (acceptance by depth and rank, bookkeeping, the lookup branch's
    # gain). 6: on the main job's heads two prompts put the branch's gain anywhere from 0.11 to 0.52 tokens per
    # step depending on which two; six gave 0.37, the 22 dev prompts ~0.3
    probe_prompts: int = 6
    probe_tokens: int = 48  # new tokens per probe prompt
    # auto: the checkpoint's own table when it has one (Medusa's held-out head accuracies), else measured by
    # the probe; measured: always the probe's
    acceptance: str = "auto"
    min_trials: int = 8  # a depth whose parent was accepted fewer times in the probe is not modelled

    def __post_init__(self) -> None:
        if self.mode not in MODES or self.acceptance not in ("auto", "measured"):
            raise ValueError(
                f"tuner.mode={self.mode!r} / tuner.acceptance={self.acceptance!r}: expected mode in {MODES} "
                "and acceptance in (auto, measured)"
            )
        if self.reps < 3 or self.max_width < 0 or self.probe_prompts < 1 or self.probe_tokens < 4:
            raise ValueError(
                "tuner: reps >= 3, max_width >= 0, probe_prompts >= 1 and probe_tokens >= 4 expected"
            )


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


class _Recorder:
    """A proposer wrapper that keeps every (tree, accepted path) of a decode, grouped by prompt (`start`), and,
    for a lookup branch of `lookup_tokens`, each step's draft tokens, the lookup chain and the context length."""

    def __init__(self, proposer, lookup_tokens: int = 0) -> None:
        self.inner, self.width, self.k = proposer, proposer.width, lookup_tokens
        self.groups: list[list[tuple]] = []
        self._step = None

    @property
    def steps(self) -> list[tuple]:
        return [s for g in self.groups for s in g]

    def start(self, prompt, hidden) -> None:
        self.groups.append([])
        self.inner.start(prompt, hidden)

    def propose(self, context, sampling):
        draft = self.inner.propose(context, sampling)
        self._step = None
        if draft is not None:
            chain = find_candidates(torch.tensor(context), MAX_NGRAM, self.k) if self.k else []
            self._step = (draft.tree, draft.tokens.tolist(), chain, len(context))
        return draft

    def accepted(self, path, hidden) -> None:
        if self._step is not None:
            tree, tokens, chain, at = self._step
            self.groups[-1].append((tree, list(path), tokens, chain, at))
        self.inner.accepted(path, hidden)


def lookup_steps(groups: list[list[tuple]], sequences: list[list[int]]) -> list[LookupStep]:
    """The probe's steps as a lookup branch would have seen them, given each prompt's greedy prompt + answer
    (what the target accepts: a chain token is accepted when it equals the answer's token at its position)."""
    out = []
    for group, seq in zip(groups, sequences, strict=True):
        for tree, path, tokens, chain, at in group:
            ranks = node_ranks(tree)
            answer = seq[at:]
            n = 0
            while n < len(chain) and n < len(answer) and chain[n] == answer[n]:
                n += 1
            shared = tuple(ranks[i] for i in shared_prefix(tokens, tree.parents, chain))
            out.append(LookupStep(tuple(ranks[i] for i in path[1:]), n, shared, len(chain)))
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


def _decode(
    decoder: Decoder, prompts: list[list[int]], new_tokens: int
) -> tuple[float, float, list[list[int]]]:
    """Greedy decodes without EOS stops, after one warm-up decode of the first prompt -> (bookkeeping s per
    step, prefill s of the first, each prompt + its answer)."""
    book, steps, prefill, sequences = 0.0, 0, 0.0, []
    decoder.generate(prompts[0], 8, eos_token_ids=[])  # warm-up
    for i, ids in enumerate(prompts):
        out = decoder.generate(ids, new_tokens, eos_token_ids=[])
        book, steps = book + out.stats.time_s["bookkeeping"], steps + out.stats.target_forwards
        if i == 0:
            prefill = out.stats.time_s["prefill"]
        sequences.append(ids + out.tokens)
    return book / max(steps, 1), prefill, sequences


def measure(
    method: str,
    backbone,
    loaded: LoadedDrafter,
    prompts: list[list[int]],
    cfg: TunerConfig,
    hooks,
    lookup: int = 0,
):
    """-> (costs without the drafter's, measured acceptance table, the probe's description, a prompt + answer
    to time steps after, the widest verify forward considered, the probe's steps as a lookup branch of `lookup`
    tokens would have seen them (empty when 0))."""
    cache = max(len(p) for p in prompts) + cfg.probe_tokens + 512
    cuda = backbone.device.type == "cuda"
    vanilla = Decoder(backbone, VANILLA, max_cache_len=cache)
    b1, prefill, _ = _decode(vanilla, prompts[:1], cfg.probe_tokens)
    default = build_decoder(method, backbone, loaded, max_cache_len=cache)
    b_default, _, _ = _decode(default, prompts[:1], cfg.probe_tokens)
    probe_opts = hooks.probe(cuda)
    probe = build_decoder(method, backbone, loaded, max_cache_len=cache, **probe_opts)
    probe.proposer = recorder = _Recorder(probe.proposer, lookup)
    b_probe, _, sequences = _decode(probe, prompts, cfg.probe_tokens)
    context = sequences[0]
    branch = lookup_steps(recorder.groups[1:], sequences) if lookup else []  # groups[0]: the warm-up
    hits, trials = [], []
    for tree, path, *_ in recorder.steps:
        count_path(tree, path, hits, trials)
    ranks = max((len(h) for h in hits), default=1)
    measured = acceptance_table(hits, trials, cfg.min_trials, ranks)
    book = {1: b1, default.proposer.width: b_default, probe.proposer.width: b_probe}
    probe_info = {"options": probe_opts, "width": probe.proposer.width, "steps": len(recorder.steps),
                  "trials_by_depth": trials, "prompts": len(prompts), "tokens": cfg.probe_tokens}  # fmt: skip
    del default, probe, recorder  # EAGLE proposers' feature hooks go with them, before the forwards are timed
    max_width = cfg.max_width or (96 if cuda else 32)
    widths = [w for w in WIDTHS if w <= max_width]
    shapes = {str(w): (w, None if w == 1 else chain_tree(w - 1)) for w in widths}
    raw = {int(w): s for w, s in step_costs(backbone, shapes, context, cfg.reps).items()}
    verify = non_decreasing(raw)
    costs = Costs(verify=verify, draft={}, bookkeeping=book, prefill=prefill)
    probe_info["verify_s_as_timed"] = {str(w): t for w, t in raw.items()}  # before the non-decreasing fit
    return costs, measured, probe_info, context, max_width, branch


def tune(
    method: str,
    backbone,
    loaded: LoadedDrafter,
    prompts: list[list[int]],
    cfg: TunerConfig,
    lookup_tokens: int = 0,
) -> dict | None:
    """Measure and choose -> the decoding record (what decoding.json holds), None when the proposer has no
    tuning hooks. With `lookup_tokens`, the tree is chosen for the decoder that carries a prompt-lookup branch
    of that many tokens (eval/tuning/speed_model.py models it); vLLM's chain never has one. Runs under the caller's
    thread count."""
    if lookup_tokens < 0:
        raise ValueError(f"lookup_tokens={lookup_tokens}: must be >= 0 (0 = no lookup branch)")
    served = {k: v for k, v in loaded.drafter.serving(backbone, loaded.meta).items() if v is not None}
    hooks = tuning(method, backbone, **served)
    if hooks is None:
        return None
    t0 = time.perf_counter()
    costs, measured, probe, context, max_width, steps = measure(
        method, backbone, loaded, prompts, cfg, hooks, lookup_tokens
    )
    table = hooks.table() if cfg.acceptance == "auto" else None
    acc, source = (table, "checkpoint") if table else (measured, "measured")
    if not acc:
        raise ValueError(
            f"the tuner's probe accepted too few drafts to measure acceptance ({probe['trials_by_depth']} trials "
            f"by depth, < tuner.min_trials={cfg.min_trials}). Fix: more tuner.probe_prompts / probe_tokens, "
            "or tuner.mode=off"
        )
    settings = hooks.settings(acc, max_width)
    chains = [hooks.chain(k) for k in range(1, min(hooks.max_chain, len(acc)) + 1)]
    keys = {s.draft_key for s in settings + chains}
    calls = hooks.draft_steps(backbone, keys, context[: len(prompts[0])])
    if lookup_tokens:  # the branch's n-gram search, once per step
        ids = torch.tensor(context)
        calls[LOOKUP_KEY] = lambda: find_candidates(ids, MAX_NGRAM, lookup_tokens)
    costs.draft = time_calls(calls, cfg.reps, backbone.device)
    branch = Branch(steps, costs.draft.pop(LOOKUP_KEY)) if lookup_tokens else None
    ranked, ranked_k = rank(settings, acc, costs, branch), rank(chains, acc, costs)
    best, pred = ranked[0]
    chain, chain_pred = ranked_k[0]
    summary = {"verify_width": best.tree.size, "depth": best.tree.max_depth, "nodes": best.tree.size - 1}
    return {
        "version": VERSION,
        "method": method,
        "lookup_tokens": lookup_tokens,
        "decoder": best.options,
        "decoder_summary": summary | {k: v for k, v in best.options.items() if k != "tree"},
        "predicted": {
            **pred,
            "vanilla_tokens_per_s": 1 / costs.vanilla_step(),
            "prefill_vanilla_steps": costs.prefill / costs.vanilla_step(),
        },  # fmt: skip
        "vllm": {"num_speculative_tokens": chain.tree.size - 1, **chain_pred},
        "top": [
            {"summary": {k: v for k, v in s.options.items() if k != "tree"} | {"width": s.tree.size}, **p}
            for s, p in ranked[:5]
        ],  # fmt: skip
        "acceptance": {"source": source, "table": acc, "measured": measured, "probe": probe}
        | ({"lookup_steps": len(steps)} if lookup_tokens else {}),
        "costs_s": costs.to_json() | ({"lookup_search": branch.search_s} if branch else {}),
        "conditions": conditions(backbone, loaded),
        "seconds": time.perf_counter() - t0,
    }


def device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"


def conditions(backbone, loaded: LoadedDrafter) -> dict:
    """What a decoding.json is valid for: the device, dtype, CPU threads, the weights it was measured on and
    how the drafter's layers were stored (int8 / native: models/int8.py; the draft costs differ)."""
    dev = backbone.device
    return {
        "device": dev.type,
        "device_name": device_name(dev),
        "dtype": str(backbone.dtype).removeprefix("torch."),
        "draft_weights": weights_of(loaded.drafter),
        "threads": torch.get_num_threads() if dev.type == "cpu" else None,
        "torch": torch.__version__,
        "weights": weights_signature(loaded.path) if loaded.path else None,
    }


def matches(record: dict, backbone, loaded: LoadedDrafter, lookup_tokens: int = 0) -> bool:
    now = conditions(backbone, loaded)
    then = {"draft_weights": "native", **record.get("conditions", {})}  # records older than int8 drafting
    keys = ("device", "device_name", "dtype", "draft_weights", "threads", "weights")
    same = record.get("version") == VERSION and record.get("lookup_tokens", 0) == lookup_tokens
    return same and all(then.get(k) == now[k] for k in keys)


def load_or_tune(
    method: str,
    backbone,
    loaded: LoadedDrafter,
    prompts: list[list[int]],
    cfg: TunerConfig,
    threads: int = 0,
    lookup_tokens: int = 0,
) -> dict | None:
    """The checkpoint's decoding.json when it was measured under these conditions and for this lookup branch
    (mode auto), else a fresh tuning written there (a read-only folder: kept in memory, with a warning). CPU:
    under `threads` threads (0: the cores free now), the count the eval runs with."""
    if cfg.mode == "off":
        return None
    before = torch.get_num_threads()
    try:
        if backbone.device.type == "cpu":
            torch.set_num_threads(choose_threads(threads))
        ckpt = loaded.path
        old = read_decoding(ckpt) if ckpt else None
        if old and cfg.mode == "auto" and matches(old, backbone, loaded, lookup_tokens):
            log.info("decoding settings from %s/decoding.json: %s", ckpt, old["decoder_summary"])
            return {**old, "reused": True}
        log.info("tuning decoding settings for %s on %s (%s)", ckpt, backbone.device, method)
        record = tune(method, backbone, loaded, prompts, cfg, lookup_tokens)
        if record is None:
            return None
        record["vllm"] = measured_k(old, record) or record["vllm"]
        if ckpt:
            try:
                write_decoding(ckpt, record)
            except OSError as e:
                log.warning(
                    "could not write %s/decoding.json (%s): the choice is used but not saved", ckpt, e
                )
        log.info("tuned: %s, vLLM K=%d, predicted speedup %.3fx (%.1fs)", record["decoder_summary"],
                 record["vllm"]["num_speculative_tokens"], record["predicted"]["speedup"], record["seconds"])  # fmt: skip
        return {**record, "reused": False}
    finally:
        torch.set_num_threads(before)


def measured_k(old: dict | None, record: dict) -> dict | None:
    """The K vLLM itself chose (eval/serving/k_sweep.py) in the previous decoding.json, when it was measured for the
    same weights on the same device, with the new tuner prediction under `tuner`; None otherwise."""
    v = (old or {}).get("vllm", {})
    now = record["conditions"]
    if v.get("source") != "vllm" or (v.get("weights"), v.get("device_name")) != (
        now["weights"],
        now["device_name"],
    ):
        return None
    return {**v, "tuner": record["vllm"]}


def probe_ids(prompts, backbone, n: int) -> list[list[int]]:
    """The first turns of `n` prompts of a PromptSet, spread over it (categories are listed together)."""
    from headstart.eval.stage.prompts import chat_ids

    rows = prompts.prompts[:: max(1, len(prompts.prompts) // n)][:n]
    return [chat_ids(backbone.tokenizer, [{"role": "user", "content": p.turns[0]}]) for p in rows]


def decoding_report(settings: dict, report: dict, new_tokens: float, tol: float = 0.10) -> dict:
    """The report's `decoding` entry: the settings used and their source (tuner / user / default), the
    prompt-lookup branch when on (its size, how often it was used); with the tuner's, its predicted speedup
    (steady state, and at this run's mean answer length with the measured prefill) beside the measured one,
    their ratio, and a flag when they differ by more than `tol`."""
    out = {"source": settings["source"], "options": settings["options"]}
    if settings.get("draft_weights"):  # int8 / native (models/int8.py)
        out["draft_weights"] = settings["draft_weights"]
    if settings.get(
        "lookup_branch"
    ):  # the user's, on top of the tree (eval/engine/proposers/lookup_branch.py)
        out["lookup_branch"] = settings["lookup_branch"]
    if settings.get("lookahead"):  # its W, N, G and how its branches did (eval/engine/proposers/lookahead.py)
        out["lookahead"] = settings["lookahead"]
    rec = settings["tuner"]
    if rec is None:
        return out
    pred = rec["predicted"]
    at_run = speedup_at(pred["speedup"], pred["prefill_vanilla_steps"], new_tokens)
    measured = report.get("speedup")
    ratio = measured / at_run if measured and at_run else None
    return out | {
        "options": rec["decoder_summary"],
        "reused": rec.get("reused"),
        "predicted_tau": pred["tokens_per_step"],
        "measured_tau": report.get("tau"),
        "predicted_speedup_steady": pred["speedup"],
        "predicted_speedup": at_run,
        "measured_speedup": measured,
        "ratio": ratio,
        "flag": None
        if ratio is None or abs(ratio - 1) <= tol
        else f"measured/predicted = {ratio:.3f} (off by > {tol:.0%})",
        "vllm_num_speculative_tokens": rec["vllm"]["num_speculative_tokens"],
        "vllm_k_source": rec["vllm"].get(
            "source", "tuner"
        ),  # "vllm": measured in vLLM (eval/serving/k_sweep.py)
        "acceptance_source": rec["acceptance"]["source"],
        "tuned_for_lookup": rec.get("lookup_tokens", 0),
    }
