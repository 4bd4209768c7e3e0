"""Benchmark our decoder against Hugging Face `generate` on the same prompts and model, interleaved per prompt.

    python eval/bench/decode.py --checkpoint DIR --prompts FILE --n 10 --max-new-tokens 128 --dtype bfloat16
    python eval/bench/decode.py --checkpoint MEDUSA EAGLE3 DISTILL --prompts dev spec_bench  # one table
    python eval/bench/decode.py --backbone tiny --n 4          # no drafter: vanilla + the training-free methods
    python eval/bench/decode.py --backbone tiny --verify-costs  # verify cost by width, eager / compiled / roofline

Rows: ours vanilla, ours <each checkpoint's proposer> without and with its prompt-lookup branch (with
--checkpoint, one or more drafters of the same backbone, the first one's backbone used; --lookup-tokens 0 drops the
second), ours prompt_lookup, ours lookahead, ours draft (with --draft);
HF greedy, HF prompt lookup (`prompt_lookup_num_tokens`), HF assisted (`assistant_model`, with --draft). All greedy.
Ours rows also get per-token latency p50/p99 (a step's time shared by the tokens it emitted, over every timed run)
and memory: peak GB of one decode and its overhead over ours vanilla (eval/scoring/memory.py).
tau = tokens per target forward after the prefill (the prefill's token and forward excluded, as in our
`DecodeStats.tau`; for HF, forwards are counted by a hook on the target model), so plain decoding has tau = 1.
Speedup is against our vanilla, `vs HF` against HF greedy: medians of per-prompt ratios, every method run on a
prompt back to back in rotating order and the prompts repeated in rounds until the 95% CIs are within --rel-ci
or --budget-s is spent (eval/timing/harness.py); bench.json records threads and load before and after.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from headstart.errors import exit_on_user_error
from headstart.eval.engine.compiled import COMPILE_MODES
from headstart.eval.engine.proposers.lookahead import LookaheadOptions
from headstart.eval.errors import EvalError
from headstart.eval.report.bench_plot import plot_bench
from headstart.eval.scoring.memory import GB, measure_memory
from headstart.eval.scoring.score import token_latencies
from headstart.eval.stage.config import DEFAULT_PROMPTS
from headstart.eval.stage.evaluate import resolve_device
from headstart.eval.stage.prompts import chat_ids, load_prompts
from headstart.eval.timing.harness import (
    Interleaved,
    Sample,
    TimingConfig,
    choose_threads,
    conditions,
    finish_conditions,
    summarize,
)
from headstart.eval.timing.openmp import spin_when_idle
from headstart.hardware import announce, machine_facts, machine_line, resolve_dtype
from headstart.models.backbone import (
    Backbone,
    BackboneConfig,
    backbone_config,
    eos_token_ids,
    load_backbone,
    named_backbone,
)
from headstart.models.checkpoint import read_meta
from headstart.models.int8 import MODES as INT8_MODES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint",
        nargs="+",
        default=[],
        help="drafter checkpoint folders of one backbone (the first one's is used): a row each, side by side",
    )
    p.add_argument(
        "--backbone",
        default="",
        help="backbone (a name backbone= takes, Hub id, folder, .gguf, tiny); default: the checkpoint's",
    )
    p.add_argument(
        "--draft",
        default="",
        help="draft model (same tokenizer; named as --backbone) for ours draft + HF assisted",
    )
    p.add_argument(
        "--prompts",
        nargs="+",
        default=[DEFAULT_PROMPTS],
        help="prompt files or shipped sets (dev, spec_bench), read as one set",
    )
    p.add_argument("--n", type=int, default=10, help="prompts, taken round-robin over categories")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-draft-tokens", type=int, default=4, help="prompt lookup / draft tokens per step")
    p.add_argument(
        "--tree-nodes",
        type=int,
        default=0,
        help="medusa / eagle candidate-tree size (0: the checkpoint's decoding.json, else the decoder default)",
    )
    p.add_argument(
        "--lookup-tokens",
        type=int,
        default=4,
        help="the drafter's prompt-lookup branch (eval's): a second drafter row with it; 0: no such row",
    )
    for knob, what in (("window", "W"), ("ngram", "N"), ("guesses", "G")):
        p.add_argument(
            f"--lookahead-{knob}", type=int, default=0, help=f"lookahead decoding's {what}; 0: default"
        )
    p.add_argument(
        "--draft-weights",
        default="auto",
        help="the drafter's layers: auto | int8 | native, or several (native,int8): one row each, side by side",
    )
    p.add_argument("--no-hf", action="store_true", help="skip the HF generate rows")
    p.add_argument("--dtype", default="auto", help="auto (native bf16 where the device has it, else float32 / fl"
                   "oat16 on CUDA) | float32 | bfloat16 | float16 | '' (the checkpoint's)")  # fmt: skip
    p.add_argument("--device", default="auto")
    p.add_argument("--warmup", type=int, default=1, help="prompts run untimed through every method first")
    p.add_argument("--out", default="", help="folder for bench.json, bench.md and bench.png")
    p.add_argument("--budget-s", type=float, default=60.0, help="seconds of repeated rounds (0: one round)")
    p.add_argument(
        "--rel-ci", type=float, default=0.05, help="stop once every ratio's 95%% CI is within this"
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads; 0: the cores free at the start")
    p.add_argument(
        "--compile",
        default=None,
        choices=COMPILE_MODES,
        help="our decoders' steps (eval/engine/compiled.py); default eager, with --verify-costs auto (the "
        "compiled column where inductor runs; eager: that column n/a)",
    )
    p.add_argument(
        "--verify-costs",
        action="store_true",
        help="only the verify cost by width, eager and compiled, beside the roofline (eval/timing/verify_cost.py)",
    )
    p.add_argument("--widths", default="1,2,4,8,16,32", help="--verify-costs: step widths")
    p.add_argument("--context", type=int, default=256, help="--verify-costs: tokens cached before each step")
    p.add_argument("--reps", type=int, default=7, help="--verify-costs: timed rounds (medians)")
    return check_args(p.parse_args(argv))


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Range checks and parsed lists; a bad value is one EvalError line naming the fix."""
    if not args.checkpoint and not args.backbone:
        raise EvalError(
            "give --checkpoint DIR (a drafter) or --backbone PATH (vanilla and prompt lookup only)"
        )
    if args.n < 1 or args.max_new_tokens < 1 or args.num_draft_tokens < 1 or args.lookup_tokens < 0:
        raise EvalError("--n, --max-new-tokens and --num-draft-tokens must be >= 1, --lookup-tokens >= 0")
    try:
        args.widths = sorted({int(w) for w in args.widths.split(",")})
    except ValueError:
        args.widths = [0]
    if args.widths[0] < 1 or args.context < 1 or args.reps < 1:
        raise EvalError(
            f"--widths {args.widths} / --context {args.context} / --reps {args.reps}: expected positive "
            "integers (widths comma-separated). Fix: --widths 1,2,4,8"
        )
    knobs = {k: getattr(args, f"lookahead_{k}") for k in ("window", "ngram", "guesses")}
    if any(v < 0 for v in knobs.values()):
        raise EvalError(f"--lookahead-* must be >= 0 (0: the default), got {knobs}")
    try:
        args.lookahead = LookaheadOptions(**{k: v or None for k, v in knobs.items()})
    except ValueError as e:  # e.g. --lookahead-ngram 1
        raise EvalError(str(e)) from e
    labels = [run_name(c) for c in args.checkpoint]
    if len(set(labels)) != len(labels):
        raise EvalError(
            f"--checkpoint: two drafters share a run folder name ({labels}); their rows would collide. "
            "Fix: give each drafter its own run folder"
        )
    args.draft_weights = args.draft_weights.split(",")
    bad = [w for w in args.draft_weights if w not in INT8_MODES]
    if bad or len(set(args.draft_weights)) != len(args.draft_weights):
        raise EvalError(
            f"--draft-weights {','.join(args.draft_weights)}: expected distinct modes from {list(INT8_MODES)}"
        )
    return args


def pick_prompts(path: str | list[str], n: int) -> list[str]:
    """First turns of n prompts, round-robin over categories so a small n still covers them."""
    by_cat: dict[str, list[str]] = {}
    for p in load_prompts(path).prompts:
        by_cat.setdefault(p.category, []).append(p.turns[0])
    queues, out = list(by_cat.values()), []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


@dataclass
class Run:
    """One decode of a prompt by one method."""

    tokens: list[int]
    stepped: int  # tokens after the prefill's
    forwards: int  # target forwards after the prefill
    draft_s: float | None = None  # ours: the proposer's seconds (None: HF generate has no such timer)
    step_latency_s: list[float] = field(default_factory=list)  # ours: per step (HF: not seen)
    accepted_per_step: list[int] = field(default_factory=list)


class ForwardCounter:
    """Counts calls of a module's forward (a hook), e.g. the target's verify forwards inside HF generate."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls, self._handle = module, 0, None

    def __enter__(self) -> ForwardCounter:
        self.calls = 0
        self._handle = self.module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def hf_runner(backbone: Backbone, max_new_tokens: int, eos: list[int], assistant=None, **gen_kw):
    """HF `generate`, greedy (`gen_kw` go into its GenerationConfig); runs return a `Run`."""
    from transformers import GenerationConfig

    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=backbone.tokenizer.pad_token_id,
        **gen_kw,
    )
    kw = {"assistant_model": assistant.model} if assistant is not None else {}

    @torch.no_grad()
    def run(ids: list[int]) -> Run:
        x = torch.tensor([ids], device=backbone.device)
        with ForwardCounter(backbone.model) as counter:
            out = backbone.model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen, **kw)
        tokens = out[0, len(ids) :].tolist()
        return Run(tokens, len(tokens) - 1, counter.calls - 1)

    return run


def ours_runner(decoder, max_new_tokens: int, eos: list[int]):
    def run(ids: list[int]) -> Run:
        out = decoder.generate(ids, max_new_tokens, temperature=0.0, eos_token_ids=eos)
        st = out.stats
        return Run(list(out.tokens), sum(st.accepted_per_step), st.target_forwards, st.time_s["draft"],
                   list(st.step_latency_s), list(st.accepted_per_step))  # fmt: skip

    return run


def build_methods(args, backbone: Backbone, draft: Backbone | None, cache_len: int) -> tuple[dict, dict]:
    """-> (name -> run function, name -> our Decoder for the rows that have one: their memory is measured)."""
    from headstart.eval.engine.decoder import Decoder
    from headstart.eval.engine.proposers.draft_model import DraftOptions
    from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
    from headstart.models.decoding import pick, read_decodings

    eos, n, k = eos_token_ids(backbone), args.max_new_tokens, args.num_draft_tokens
    kw = {
        "max_cache_len": cache_len,
        "compile": args.compile or "eager",
    }  # every one of ours: the same kernels
    ours = {"ours vanilla": Decoder(backbone, "vanilla", **kw)}
    compiled = kw["compile"] != "eager"  # the records priced for these kernels
    for checkpoint in args.checkpoint:
        picked = pick(read_decodings(checkpoint), greedy=True, device=backbone.device.type, compiled=compiled)
        if picked:  # which record the tree comes from (a plain choice still benchmarks its declined tree)
            print(picked.note)
        ours |= drafter_decoders(args, checkpoint, backbone, kw, picked.record if picked else None)
    ours["ours prompt_lookup"] = Decoder(backbone, PromptLookupOptions(num_draft_tokens=k), **kw)
    ours["ours lookahead"] = Decoder(backbone, args.lookahead, **kw)
    if draft is not None:
        ours["ours draft"] = Decoder(backbone, DraftOptions(draft, num_draft_tokens=k), **kw)
    methods = {name: ours_runner(dec, n, eos) for name, dec in ours.items()}
    if args.no_hf:
        return methods, ours
    methods["HF greedy"] = hf_runner(backbone, n, eos)
    methods["HF prompt_lookup"] = hf_runner(backbone, n, eos, prompt_lookup_num_tokens=k)
    if draft is not None:
        methods["HF assisted"] = hf_runner(backbone, n, eos, assistant=draft)
    return methods, ours


def run_name(checkpoint: str) -> str:
    """A checkpoint's row label: its run folder (the one holding `drafter/`), else its own name."""
    path = Path(checkpoint).resolve()
    return path.parent.name if path.name == "drafter" else path.name


def drafter_decoders(args, checkpoint: str, backbone: Backbone, kw: dict, record: dict | None) -> dict:
    """The checkpoint's drafter, one row per --draft-weights mode, each without and (--lookup-tokens > 0)
    with its prompt-lookup branch, on the checkpoint's tuned tree (`record`: its decoding record, whose branch
    length the row takes when its tuner chose one, at most --lookup-tokens) or --tree-nodes.
    With several checkpoints (or a --draft model beside one) each row names its run (the folder above
    `drafter/`)."""
    from headstart.eval.engine.decoder import build_decoder
    from headstart.eval.engine.proposers import DRAFT, TREE_METHODS
    from headstart.models import registry
    from headstart.models.checkpoint import LoadedDrafter, load_drafter
    from headstart.models.decoding import branch_tokens
    from headstart.models.int8 import for_decoding

    opts = {"tree_nodes": args.tree_nodes} if args.tree_nodes else (record or {}).get("decoder", {})
    if registry.proposer_of(read_meta(checkpoint)["method"]) == DRAFT:
        # a draft LM has no tree: the chain its record chose, else --num-draft-tokens like --draft's row
        opts = (record or {}).get("decoder") or {"num_draft_tokens": args.num_draft_tokens}
    branch = args.lookup_tokens if args.tree_nodes else branch_tokens(record, args.lookup_tokens)
    if branch < args.lookup_tokens:
        print(f"{run_name(checkpoint)}: a lookup branch of {branch} (its tuner's length, of --lookup-tokens "
              f"{args.lookup_tokens})")  # fmt: skip
    out = {}
    for mode in args.draft_weights:  # a drafter each: int8 replaces its layers in place
        loaded = LoadedDrafter(*load_drafter(checkpoint, backbone))
        proposer = registry.proposer_of(loaded.meta["method"])
        weights = for_decoding(loaded.drafter, backbone.device, mode)
        name = f"ours {proposer}" + (f" ({weights})" if len(args.draft_weights) > 1 else "")
        if len(args.checkpoint) > 1 or args.draft:  # told apart from each other and from --draft's row
            name += f" [{run_name(checkpoint)}]"
        out[name] = build_decoder(proposer, backbone, loaded, **kw, **opts)
        if branch and proposer in TREE_METHODS:  # a draft model has no tree to carry the branch
            out[f"{name} + lookup {branch}"] = build_decoder(
                proposer, backbone, loaded, **kw, **opts, lookup_tokens=branch
            )
    return out


def measure(
    methods: dict, prompts: list[list[int]], device: torch.device, warmup: int, timing: TimingConfig
) -> tuple[dict[str, dict], Interleaved]:
    """Every method on every prompt, the order rotating per prompt and round (eval/timing/harness.py), in rounds until
    each method's median ratio to ours vanilla is pinned down or the budget is spent. Tokens, tau and matches
    come from each method's first run of a prompt; seconds and latencies from all runs."""

    def timed(fn, ids) -> tuple[Run, float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run = fn(ids)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return run, time.perf_counter() - start

    for ids in tqdm(prompts[:warmup], desc="bench-decode: warm-up (untimed)", unit="prompt"):
        for fn in methods.values():
            fn(ids)
    first: dict[tuple[str, int], Run] = {}
    # round 0 is every method on every prompt; later rounds (until the ratios converge) count on past the total
    bar = tqdm(total=len(prompts) * len(methods), desc="bench-decode: timed decodes", unit="decode")
    drafting = {name: [0.0, 0] for name in methods}  # over every timed run: draft seconds, steps
    latency: dict[str, list[float]] = {name: [] for name in methods}  # per token, every timed run

    def run(name: str, unit: int) -> Sample:
        r, seconds = timed(methods[name], prompts[unit])
        first.setdefault((name, unit), r)
        if r.draft_s is not None:
            drafting[name][0] += r.draft_s
            drafting[name][1] += r.forwards
        latency[name] += token_latencies(r.step_latency_s, r.accepted_per_step)
        bar.set_postfix_str(f"{name}, {len(r.tokens) / seconds:.1f} tok/s" if seconds > 0 else name)
        bar.update(1)
        return Sample(len(r.tokens), seconds, r.forwards + 1)

    timer = Interleaved(list(methods), "ours vanilla", timing)
    timer.run(run, len(prompts))
    bar.close()
    totals = {}
    for name in methods:
        runs = [first[name, u] for u in range(len(prompts))]
        samples = [s[name] for s in timer.samples.values()]
        totals[name] = {
            "tokens": sum(len(r.tokens) for r in runs),
            "stepped": sum(r.stepped for r in runs),
            "forwards": sum(r.forwards for r in runs),
            "timed_tokens": sum(x.tokens for x in samples),
            "seconds": sum(x.seconds for x in samples),
            "matches": sum(r.tokens == first["ours vanilla", u].tokens for u, r in enumerate(runs)),
            "draft_ms_per_step": 1000 * drafting[name][0] / drafting[name][1] if drafting[name][1] else None,
            "token_latency_ms": _percentiles_ms(latency[name]),
        }
    return totals, timer


def _percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None}
    return {q: float(np.percentile(values, int(q[1:])) * 1000) for q in ("p50", "p99")}


def memory_of(decoders: dict, ids: list[int], max_new_tokens: int, eos: list[int]) -> dict[str, dict]:
    """Peak GB of one untimed decode of `ids` per decoder, and its overhead over ours vanilla's (after the
    timing, so the allocation tracking cannot touch it)."""
    used = {name: measure_memory(dec, ids, max_new_tokens, eos) for name, dec in decoders.items()}
    base = used["ours vanilla"].peak_bytes
    return {
        name: {**u.as_report(), "overhead_gb": (u.peak_bytes - base) / GB, "drafter_gb": u.drafter_bytes / GB}
        for name, u in used.items()
    }


def table(totals: dict[str, dict], n_prompts: int, timer: Interleaved, memory: dict[str, dict]) -> list[dict]:
    pairs = list(timer.samples.values())
    rows = []
    for m, t in totals.items():
        vs = timer.summary(m) if m != "ours vanilla" else summarize([1.0])
        hf = {"median": None}  # --no-hf
        if "HF greedy" in totals:
            hf = summarize([s[m].rate / s["HF greedy"].rate for s in pairs if s["HF greedy"].rate > 0])
        rows.append(
            {
                "method": m,
                "tokens_per_s": t["timed_tokens"] / t["seconds"] if t["seconds"] else 0.0,
                "tau": t["stepped"] / t["forwards"] if t["forwards"] else None,
                "speedup_vs_ours_vanilla": vs["median"],  # median of per-prompt, per-round ratios
                "speedup_ci": vs["ci"],
                "ratio_vs_hf_greedy": hf["median"],
                "matches_ours_vanilla": t["matches"] / n_prompts,
                "draft_ms_per_step": t["draft_ms_per_step"],  # ours: the proposer's time a step
                "new_tokens": t["tokens"],
                "token_latency_ms": t["token_latency_ms"],  # ours: p50 / p99 per emitted token
                "memory": memory.get(m),  # ours: peak of one decode, overhead over ours vanilla (GB)
            }
        )
    return rows


TRACKED = "CUDA: max_memory_allocated; CPU: the torch profiler's allocation events"


def markdown(rows: list[dict], settings: dict) -> str:
    def f(x, d=2):
        return "n/a" if x is None else f"{x:.{d}f}"

    head = ", ".join(f"{k}={v}" for k, v in settings.items())
    lines = [
        f"# Benchmark ({head})",
        "",
        "| method | tokens/s | tau | speedup vs ours vanilla [95% CI] | per-token ms p50 / p99 "
        "| peak GB (overhead) | draft ms / step | vs HF greedy | == ours vanilla | new tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci, lat, mem = r["speedup_ci"], r["token_latency_ms"], r["memory"]
        peak = "n/a" if mem is None else f"{mem['peak_gb']:.4g} ({mem['overhead_gb']:+.3g})"
        lines.append(
            f"| {r['method']} | {f(r['tokens_per_s'], 1)} | {f(r['tau'])} "
            f"| {f(r['speedup_vs_ours_vanilla'])} [{f(ci[0])}, {f(ci[1])}] | {f(lat['p50'])} / {f(lat['p99'])} "
            f"| {peak} | {f(r['draft_ms_per_step'])} | {f(r['ratio_vs_hf_greedy'])} "
            f"| {f(r['matches_ours_vanilla'])} | {r['new_tokens']} |"
        )
    lines += [
        "",
        "tau: tokens per target forward after the prefill. Per-token latency: each step's time shared by the "
        "tokens it emitted. Peak: held tensors (target, its KV cache, drafter, kept state) + the tracked "
        f"transient peak of one decode of the first prompt ({TRACKED}); overhead against ours vanilla.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    if argv is None:  # a command, not a call
        spin_when_idle(device, say=print)
    first = args.checkpoint[0] if args.checkpoint else None
    bcfg = BackboneConfig(**read_meta(first)["backbone"]) if first else BackboneConfig()
    if args.backbone:  # with a checkpoint too: load_drafter still checks that the heads fit it
        bcfg = named_backbone(args.backbone) or replace(
            bcfg, name=Path(args.backbone).name, path=args.backbone
        )
    choice = resolve_dtype(args.dtype or bcfg.dtype, device, setting="--dtype")
    announce("--dtype", choice)
    bcfg = replace(bcfg, dtype=choice.dtype)
    print(machine_line(machine_facts(device), bcfg.dtype), flush=True)  # the first line names the machine
    backbone = load_backbone(bcfg, device)
    if args.verify_costs:
        from headstart.eval.timing.verify_cost import report

        if device.type == "cpu":
            choose_threads(args.threads)
        mode = args.compile or "auto"  # the compiled column: where inductor runs, unless eager is asked for
        print(report(backbone, bcfg.dtype, args.widths, args.context, args.reps, mode))
        return []
    draft = (
        load_backbone(backbone_config(args.draft, "draft", dtype=bcfg.dtype), device) if args.draft else None
    )
    prompts = [
        chat_ids(backbone.tokenizer, [{"role": "user", "content": t}])
        for t in pick_prompts(args.prompts, args.n)
    ]
    cache_len = max(len(p) for p in prompts) + args.max_new_tokens + 256  # room for one step's verify tree
    timing = TimingConfig(budget_s=args.budget_s, rel_ci=args.rel_ci, threads=args.threads)
    threads = choose_threads(timing.threads) if device.type == "cpu" else None
    cond = conditions(device, bcfg.dtype)
    methods, decoders = build_methods(args, backbone, draft, cache_len)
    totals, timer = measure(methods, prompts, device, args.warmup, timing)
    memory = memory_of(decoders, prompts[0], args.max_new_tokens, eos_token_ids(backbone))
    rows = table(totals, len(prompts), timer, memory)
    settings = {
        "backbone": bcfg.name,
        "dtype": bcfg.dtype,
        "device": str(device),
        "prompts": len(prompts),
        "prompt_sets": [Path(p).stem if Path(p).suffix else p for p in args.prompts],
        "max_new_tokens": args.max_new_tokens,
        "num_draft_tokens": args.num_draft_tokens,
        "lookup_tokens": args.lookup_tokens,
        "lookahead": "W={}, N={}, G={}".format(*args.lookahead.resolved()),
        "threads": torch.get_num_threads(),
        "rounds": timer.rounds,
    }
    extra = {"conditions": {**finish_conditions(cond), "threads_chosen": threads}, "timing": timer.report()}
    text = markdown(rows, settings)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps({"settings": settings, "rows": rows, **extra}, indent=2))
        (out / "bench.md").write_text(text)
        facts = machine_facts(device)
        where = facts["device_name"] if device.type == "cuda" else f"{facts['cpu']} ({facts['isa']})"
        title = f"{bcfg.name}, {bcfg.dtype}, {where}, {torch.get_num_threads()} threads"
        plot_bench(rows, title, out / "bench.png")
    return rows


if __name__ == "__main__":
    with exit_on_user_error():
        main()
