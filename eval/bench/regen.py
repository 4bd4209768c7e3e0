"""Self-distillation regeneration speed: the HF path vs vLLM, side by side on the same prompts.

    ./launch.sh bench-regen [--n 64] [--max-new-tokens 128] [--batch-size 16] [--engines hf,vllm,vllm-eager]
                            [--dtypes auto | float32,bfloat16]

Both engines run the real `regenerate()` (same rows, chat template, stop ids, greedy, results appended to a
JSON-lines file) into temporary files; tokens are counted the same way for both (the reply re-tokenized, plus
the end-of-turn token when the model stopped). vLLM's figure is given with and without its engine start-up
(measured by starting one more engine alone). `vllm-eager` is vLLM without torch.compile
(`HEADSTART_VLLM_EAGER=1`), beside the compiled default. Also prints how many replies are identical across
engines (bf16 kernels differ, so near-ties can flip). `--dtypes` runs every engine in each dtype in turn (auto:
what the machine computes natively, headstart/hardware.py); the first line names the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

from headstart.data.build import select_rows
from headstart.data.config import DataConfig, RegenConfig
from headstart.data.loading import open_source
from headstart.data.selfdistill import regenerate
from headstart.data.sources import Skips, read_rows
from headstart.hardware import machine_facts, machine_line
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.vllm_runner import VllmEngine, batch_env, engine_spec, served_model

ENGINES = {"hf": "hf", "vllm": "vllm", "vllm-eager": "vllm"}  # --engines name -> data.regen.engine


def reply_tokens(tokenizer, rows) -> int:
    n = 0
    for row in rows:
        reply = row.messages[-1]["content"]
        n += len(tokenizer(reply, add_special_tokens=False)["input_ids"]) + (not row.open_end)
    return n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=64, help="ShareGPT prompts (the selfdistill_cpu selection)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="HF generate batch (vLLM batches itself)")
    p.add_argument("--max-length", type=int, default=384)
    p.add_argument("--vllm-chunk", type=int, default=RegenConfig.vllm_chunk, help="prompts per vLLM call")
    p.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm, vllm-eager")
    p.add_argument("--dtypes", default="auto", help="comma-separated: auto, float32, bfloat16, float16")
    p.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = p.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINES):
        p.error(f"--engines={args.engines!r}: expected a comma-separated subset of {','.join(ENGINES)}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    try:
        resolved = [
            BackboneConfig(dtype=d).resolved() for d in dtypes
        ]  # named by what ran (auto twice: once)
        backbones = {b.dtype: b for b in resolved}
    except ValueError as e:
        p.error(str(e))
    print(machine_line(machine_facts(), ", ".join(b.dtype for b in backbones.values())), flush=True)
    results, texts = {}, {}
    for bcfg in backbones.values():
        backbone = load_backbone(bcfg)
        for name, res in run_engines(args, engines, backbone).items():
            key = name if len(backbones) == 1 else f"{name}/{bcfg.dtype}"
            results[key], texts[key] = res
            print(f"{key}: {json.dumps(res[0])}", flush=True)  # as each finishes: a long run keeps its rows
    print_table(args, results, texts)


def run_engines(args, engines: list[str], backbone) -> dict[str, tuple[dict, dict]]:
    """engine -> (figures, {row id: reply}) of each engine regenerating the same rows with `backbone`."""
    cfg = DataConfig(max_rows=args.n, eval_rows=0, max_length=args.max_length)
    with open_source(cfg) as src:
        rows, _ = read_rows(src, cfg.format, cfg)
    _, rows = select_rows(rows, cfg)
    regen = RegenConfig(
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, vllm_chunk=args.vllm_chunk
    )
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            # vllm-eager / vllm: HEADSTART_VLLM_EAGER=1 / 0 for that engine's run only (engine_spec reads it)
            with patch.dict(os.environ, {"HEADSTART_VLLM_EAGER": "1" if engine == "vllm-eager" else "0"}):
                t0 = time.perf_counter()
                done, _ = regenerate(
                    rows,
                    backbone,
                    replace(regen, engine=ENGINES[engine]),
                    args.max_length,
                    Path(tmp) / f"{engine}.jsonl",
                    Skips(),
                    show_progress=False,
                )
                wall = time.perf_counter() - t0
                if engine != "hf":  # one more engine started alone: its start-up, to subtract
                    dtype = str(backbone.dtype).removeprefix("torch.")
                    spec = engine_spec(served_model(backbone), dtype, args.max_length + args.max_new_tokens)
                    with VllmEngine(spec, env=batch_env()) as e:
                        startup = e.startup_s
            tokens = reply_tokens(backbone.tokenizer, done)
            res = {
                "rows": len(done),
                "tokens": tokens,
                "wall_s": wall,
                "tokens_per_s": tokens / wall,
                "rows_per_s": len(done) / wall,
            }
            if engine != "hf":
                res |= {"startup_s": startup, "tokens_per_s_after_startup": tokens / (wall - startup)}
            out[engine] = res, {r.row_id: r.messages[-1]["content"] for r in done}
    return out


def print_table(args, results: dict, texts: dict) -> None:
    print(
        f"{next(iter(results.values()))['rows']} prompts, up to {args.max_new_tokens} new tokens, greedy, SmolLM2-135M"
    )
    print("| engine | rows | tokens | wall s | tokens/s | rows/s |")
    print("|---|---|---|---|---|---|")
    for key, r in results.items():
        engine, _, dtype = key.partition("/")
        dtype = f", {dtype}" if dtype else ""
        if engine == "hf":
            name = f"HF generate (batch {args.batch_size}{dtype})"
            print(
                f"| {name} | {r['rows']} | {r['tokens']} | {r['wall_s']:.1f} | {r['tokens_per_s']:.1f} | "
                f"{r['rows_per_s']:.2f} |"
            )
            continue
        name = f"vLLM {'eager' if engine == 'vllm-eager' else 'compiled'} (chunk {args.vllm_chunk}{dtype})"
        print(
            f"| {name}, start-up included | {r['rows']} | {r['tokens']} | {r['wall_s']:.1f} | "
            f"{r['tokens_per_s']:.1f} | {r['rows_per_s']:.2f} |"
        )
        print(
            f"| {name}, after its {r['startup_s']:.0f} s start-up | {r['rows']} | {r['tokens']} | "
            f"{r['wall_s'] - r['startup_s']:.1f} | {r['tokens_per_s_after_startup']:.1f} | |"
        )
    keys = list(results)
    first, same = keys[0], {}
    for engine in keys[1:]:
        a, b = results[first], results[engine]
        same[engine] = sum(texts[first].get(k) == t for k, t in texts[engine].items())
        if "startup_s" not in b:  # HF beside HF (another dtype): no engine start-up on either side
            after = ""
        elif "startup_s" in a:
            after = (
                f", {b['tokens_per_s_after_startup'] / a['tokens_per_s_after_startup']:.2f}x after start-up"
            )
        else:
            after = f", {b['tokens_per_s_after_startup'] / a['tokens_per_s']:.2f}x after {engine}'s start-up"
        print(
            f"{engine} / {first}: {b['tokens_per_s'] / a['tokens_per_s']:.2f}x with start-up{after}; "
            f"identical replies: {same[engine]}/{len(texts[engine])}"
        )
    if args.out:
        args.out.write_text(json.dumps({"results": results, "identical_replies": same}, indent=1))


if __name__ == "__main__":  # vLLM runs in a subprocess; the guard keeps imports side-effect free
    main()
