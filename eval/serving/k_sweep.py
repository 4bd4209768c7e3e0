"""vLLM's chain length K, measured in vLLM.

The tuner (eval/tuning/tuner.py) predicts vLLM's best `num_speculative_tokens` from headstart's decoder costs; vLLM's
own step is a different program (compiled on CPU, relatively cheaper at batch size 1), and the
prediction missed: main-s7's heads at K=3 were predicted 1.35x and measured 1.23x. Here vLLM serves the
drafter's vLLM layout at every K of a sweep beside its plain decoding, all engines alive and the prompts
interleaved (eval/serving/side_by_side.py), and the K with the most tokens/s wins. For each K the report has vLLM's tau,
acceptance by position, tokens/s, speedup and step time (seconds per target forward), and, from the
checkpoint's acceptance table (decoding.json), the speedup that table predicts at vLLM's measured step costs:
where the two differ, the table's acceptance is what missed, not the costs.

The choice goes into decoding.json's `vllm` entry (`"source": "vllm"`), where the exports and cards read K;
the tuner keeps it when it re-tunes the same weights on the same device (eval/tuning/tuner.py `load_or_tune`).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from headstart.eval.engine.tree import chain_tree
from headstart.eval.serving import counters as vc
from headstart.eval.serving.baselines import rate
from headstart.eval.serving.check import export_layouts, layout_spec
from headstart.eval.serving.side_by_side import VllmRunner, interleave, start_engines
from headstart.eval.tuning.speed_model import expected_tokens
from headstart.vllm_runner import VllmError, eager, served_model, serving_dtype

PLAIN = "plain"


def predicted_speedup(
    table: list[list[float]] | None, k: int, step_s: float, plain_step_s: float
) -> float | None:
    """The acceptance table's tokens per step for a chain of k, at vLLM's measured step costs."""
    if not table or not step_s:
        return None
    return expected_tokens(chain_tree(k), table) * plain_step_s / step_s


def summarize(timed: dict, counters: dict, ks: list[int], table: list[list[float]] | None) -> dict:
    """{K: figures} from the interleaved runs (`timed[name]["per_prompt"]`) and vLLM's counters per K."""
    every = lambda pp: list(range(len(pp)))  # noqa: E731
    plain = timed[PLAIN]["per_prompt"]
    plain_rate = rate(plain, every(plain))
    plain_step = 1 / plain_rate if plain_rate else 0.0
    out = {}
    for k in ks:
        pp, c = timed[f"k{k}"]["per_prompt"], counters[k]
        seconds = sum(s for _, s in pp)
        step = seconds / c["drafts"] if c["drafts"] else 0.0  # every step of a chain drafts
        tok_s = rate(pp, every(pp))
        out[k] = {
            "tau": vc.tau(c),
            "position_rates": vc.position_rates(c),
            "tokens_per_s": tok_s,
            "speedup": tok_s / plain_rate if plain_rate else 0.0,
            "step_ms": 1000 * step,
            "predicted_speedup": predicted_speedup(table, k, step, plain_step),
            "predicted_tau": expected_tokens(chain_tree(k), table) if table else None,
        }
    return {"plain_tokens_per_s": plain_rate, "plain_step_ms": 1000 * plain_step, "by_k": out}


def choose(summary: dict) -> int:
    """The K with the most measured tokens/s (the smaller K on a tie)."""
    by_k = summary["by_k"]
    return max(sorted(by_k), key=lambda k: (by_k[k]["tokens_per_s"], -k))


def to_markdown(report: dict) -> str:
    s = report["summary"]
    lines = [
        f"# vLLM K sweep: {report['checkpoint']}",
        "",
        f"{report['layout']} served by vLLM ({report['vllm_engine']} engine) beside its plain decoding, "
        f"{report['prompts']} prompts interleaved, greedy, batch size 1, up to {report['max_new_tokens']} new "
        f"tokens. Plain: {s['plain_tokens_per_s']:.1f} tok/s, {s['plain_step_ms']:.1f} ms a step.",
        "",
        "| K | tau vLLM | tau (table) | acceptance by position | tok/s | speedup | ms a step | predicted (table) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    f2 = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
    for k, r in s["by_k"].items():
        lines.append(
            f"| {k} | {r['tau']:.2f} | {f2(r['predicted_tau'])} | "
            f"{' / '.join(f'{a:.2f}' for a in r['position_rates'])} | {r['tokens_per_s']:.1f} | "
            f"{r['speedup']:.2f}x | {r['step_ms']:.1f} | "
            f"{'' if r['predicted_speedup'] is None else f2(r['predicted_speedup']) + 'x'} |"
        )
    lines += [
        "",
        f"Chosen: K = {report['chosen']}" + (" (written to decoding.json)" if report["written"] else ""),
    ]
    if report.get("tuner_k") is not None:
        lines[-1] += f"; the tuner had predicted K = {report['tuner_k']} from headstart's decoder costs."
    if report.get("decoding_record"):
        lines += ["", f"The drafter's {report['decoding_record']}."]
    return "\n".join(lines) + "\n"


def measured_entry(summary: dict, chosen: int, mode: str, device, drafter_dir: Path, tuner: dict) -> dict:
    """decoding.json's `vllm` entry for the K vLLM chose, keeping the tuner's own prediction under `tuner`."""
    from headstart.eval.tuning.records import device_name
    from headstart.models.checkpoint import weights_signature

    best = summary["by_k"][chosen]
    return {
        "num_speculative_tokens": chosen,
        "source": "vllm",
        "tokens_per_step": best["tau"],
        "speedup": best["speedup"],
        "vllm_engine": mode,
        "device_name": device_name(device),  # what the tuner keeps it for, with the weights
        "weights": weights_signature(drafter_dir),
        "sweep": {str(k): v for k, v in summary["by_k"].items()},
        "tuner": tuner.get("tuner", tuner),  # the tuner's own prediction, kept
    }


def sweep(
    drafter_dir: Path,
    questions: list[str],
    out: Path,
    ks: list[int],
    max_new: int = 96,
    write: bool = True,
    dtype: str = "auto",
) -> dict:
    """Serve the drafter's vLLM layout at each K in `ks` beside plain vLLM on the first turns `questions`;
    the report dict (also OUT/vllm_k.{json,md}). `write`: store the chosen K in the drafter's decoding.json."""
    from headstart.eval.stage.prompts import chat_ids
    from headstart.models.backbone import BackboneConfig, eos_token_ids, load_backbone
    from headstart.models.checkpoint import read_meta
    from headstart.models.decoding import pick, read_decodings, write_decodings
    from headstart.vllm_runner import on_gpu

    if not ks or min(ks) < 1:
        raise ValueError(f"K sweep {ks}: give one or more chain lengths >= 1, e.g. --ks 1,2,3")
    meta = read_meta(drafter_dir)
    heads = meta.get("method_config", {}).get("num_heads")  # Medusa drafts one token per head
    if heads and max(ks) > heads:
        raise ValueError(
            f"K sweep {ks}: these Medusa heads draft at most {heads} tokens. Fix: --ks 1..{heads}"
        )
    # the greedy record for the device vLLM serves from here: the one whose K this sweep measures and replaces
    records = read_decodings(drafter_dir)
    picked = pick(records, greedy=True, device="cuda" if on_gpu() else "cpu")
    record = picked.record if picked else None
    layouts = [lay for lay in export_layouts(drafter_dir, meta, out / "export") if lay.required]
    if not layouts:
        raise VllmError(f"{drafter_dir}: its method ({meta['method']}) has no layout vLLM serves")
    lay = layouts[0]
    compute = serving_dtype(dtype)
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": compute.dtype}))
    model = served_model(backbone)
    if model is None:
        raise VllmError("the backbone is an in-memory model vLLM cannot load (backbone=tiny)")
    prompts = [chat_ids(backbone.tokenizer, [{"role": "user", "content": q}]) for q in questions]
    eos = eos_token_ids(backbone)
    max_len = max(len(p) for p in prompts) + max_new + 16
    specs = {PLAIN: {}} | {f"k{k}": layout_spec(meta["method"], lay, k) for k in ks}
    mode = "eager" if eager() else "compiled"
    with ExitStack() as stack:
        engines, _ = start_engines(stack, model, specs, max_len, out / "logs", dtype=compute.dtype)
        runners = {name: VllmRunner(engine, eos) for name, engine in engines.items()}
        bar = tqdm(total=len(prompts), desc="vLLM K sweep, prompts")
        timed = interleave(runners, prompts, max_new, lambda i, total: bar.update(1))
        bar.close()
        counters = {k: runners[f"k{k}"].counters() for k in ks}
        # the report is written before the engines close (closing four takes over a minute): a kill then loses nothing
        table = (record or {}).get("acceptance", {}).get("table")
        summary = summarize(timed, counters, ks, table)
        chosen = choose(summary)
        v = (record or {}).get("vllm", {})
        tuner_k = v.get("tuner", v).get("num_speculative_tokens")
        written = write and record is not None
        if written:  # `record` is one of `records`, updated in place
            record["vllm"] = measured_entry(
                summary, chosen, mode, backbone.device, drafter_dir, record["vllm"]
            )
            write_decodings(drafter_dir, records)
        report = {
            "checkpoint": str(drafter_dir),
            "layout": lay.name,
            "vllm_engine": mode,
            "prompts": len(prompts),
            "max_new_tokens": max_new,
            "summary": summary,
            "chosen": chosen,
            "tuner_k": tuner_k,
            "written": written,
            "decoding_record": picked.note if picked else None,
        }
        out.mkdir(parents=True, exist_ok=True)
        (out / "vllm_k.json").write_text(json.dumps(report, indent=1))
        (out / "vllm_k.md").write_text(to_markdown(report))
    return report


def main(argv: list[str] | None = None) -> None:
    """./launch.sh vllm-k --checkpoint RUN [--ks 1,2,3,4] [--per-category 1 | --n 8] [--no-write]"""
    import argparse
    import sys

    from headstart.eval.errors import EvalError
    from headstart.eval.stage.config import DEFAULT_PROMPTS
    from headstart.eval.stage.prompts import load_prompts, spread
    from headstart.models.backbone import BackboneError

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run dir or drafter folder")
    p.add_argument("--ks", default="1,2,3,4", help="chain lengths to serve, comma-separated")
    p.add_argument("--prompts", default=DEFAULT_PROMPTS, help="Spec-Bench style .jsonl (first turns)")
    p.add_argument("--n", type=int, default=8, help="prompts, spread over the file")
    p.add_argument("--per-category", type=int, default=0, help="instead of --n: the first N of each category")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--no-write", action="store_true", help="report only; leave decoding.json as it is")
    p.add_argument("--out", type=Path, help="default: <run>/vllm_k")
    p.add_argument("--dtype", default="auto", help="auto (native bf16 where the device has it, else float32 / "
                   "float16 on CUDA) | float32 | bfloat16 | float16")  # fmt: skip
    args = p.parse_args(argv)
    drafter = (
        args.checkpoint / "drafter"
        if (args.checkpoint / "drafter" / "config.json").is_file()
        else args.checkpoint
    )
    try:
        try:
            ks = sorted({int(x) for x in args.ks.split(",") if x.strip()})
        except ValueError:
            raise EvalError(f"--ks {args.ks!r}: expected comma-separated integers, e.g. 1,2,3") from None
        if args.n < 1 or args.per_category < 0:
            raise EvalError("--n must be >= 1 and --per-category >= 0")
        if args.per_category:
            chosen = load_prompts(args.prompts, args.per_category).prompts
        else:
            chosen = spread(load_prompts(args.prompts).prompts, args.n)
        out = args.out or drafter.parent / "vllm_k"
        report = sweep(
            drafter, [q.turns[0] for q in chosen], out, ks, args.max_new_tokens, not args.no_write, args.dtype
        )
    except (FileNotFoundError, ValueError, BackboneError, VllmError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(to_markdown(report))


if __name__ == "__main__":  # vLLM runs in subprocesses; the guard keeps imports side-effect free
    main()
