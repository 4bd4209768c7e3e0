"""Choose a checkpoint's decoding settings from measured cost, alone (the eval stage does it on first use):

    python eval/tune.py --checkpoint runs/<run>/drafter [--device cpu] [--dtype bfloat16] [--force]
        [--lookup-tokens N]   # choose the tree and a prompt-lookup branch of up to N tokens together
        [--temperature T]     # the record for sampled decoding (T > 0); greedy by default
        [--eval-prompts dev spec_bench --limit-per-category 2 --max-new-tokens 128]  # priced at their lengths
    ./launch.sh tune --checkpoint runs/<run>          # a run folder: its drafter/

Prints the measured costs, the chosen tree (or plain decoding, when no setting is predicted faster) and vLLM's K
with their predicted speedups, and adds the record for this condition to <checkpoint>/decoding.json
(eval/tuning/records.py, models/decoding.py), which later evals and exports reuse. `--out DIR` writes it there
instead (a read-only checkpoint).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path

from headstart.cli_checks import dir_problem
from headstart.errors import exit_on_user_error
from headstart.eval.engine.compiled import COMPILE_MODES
from headstart.eval.engine.compiled import resolve as resolve_compile
from headstart.eval.stage.config import EvalConfig
from headstart.eval.stage.evaluate import resolve_device
from headstart.eval.stage.prompts import load_prompts
from headstart.eval.timing.openmp import spin_when_idle
from headstart.eval.tuning.prompts import DEFAULT_TUNING_PROMPTS, probe_prompts
from headstart.eval.tuning.records import Tuned, load_or_tune
from headstart.eval.tuning.tuner import PLAIN, TunerConfig, Use
from headstart.eval.tuning.workload import of_prompts
from headstart.models import registry
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import LoadedDrafter, load_drafter, read_meta, resolve_checkpoint
from headstart.models.decoding import write_decoding
from headstart.models.int8 import MODES as INT8_MODES
from headstart.models.int8 import for_decoding


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run dir or drafter folder")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (native bf16 where the device has it, else float32 / fl"
                   "oat16 on CUDA) | float32 | bfloat16 | float16 | '' (the checkpoint's)")  # fmt: skip
    p.add_argument("--prompts", default=DEFAULT_TUNING_PROMPTS, help="jsonl whose prompts the probe decodes")
    p.add_argument(
        "--threads", type=int, default=0, help="CPU threads to choose for (0: the machine's cores)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="the eval's temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--force", action="store_true", help="measure again even if decoding.json matches")
    p.add_argument("--out", type=Path, help="write decoding.json here instead of beside the checkpoint")
    p.add_argument("--probe-prompts", type=int, default=TunerConfig.probe_prompts)
    p.add_argument("--reps", type=int, default=TunerConfig.reps)
    p.add_argument("--confirm", type=int, default=TunerConfig.confirm,
                   help="the model's best settings decoded to price them (0: the model's prices)")  # fmt: skip
    p.add_argument(
        "--lookup-tokens",
        type=int,
        default=0,
        help="the eval's lookup_tokens: the longest branch (0: no branch)",
    )
    p.add_argument("--compile", default="eager", choices=COMPILE_MODES, help="the eval's compile setting")
    p.add_argument("--max-cache-len", type=int, default=EvalConfig.max_cache_len,
                   help="the eval's max_cache_len (compiled steps are timed at that cache length)")  # fmt: skip
    p.add_argument("--eval-prompts", nargs="+", default=[],
                   help="the eval's prompts (files or dev / spec_bench): steps are priced at their context lengths, "
                   "as the eval's tuner.workload=eval does; none: at the probe's own (tuner.workload=probe)")  # fmt: skip
    p.add_argument("--limit-per-category", type=int, default=EvalConfig.limit_per_category,
                   help="the eval's limit_per_category")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=EvalConfig.max_new_tokens,
                   help="the eval's max_new_tokens")  # fmt: skip
    p.add_argument(
        "--draft-weights",
        default="auto",
        choices=INT8_MODES,
        help="the eval's draft_weights (auto: int8 on CPU where it times faster)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with exit_on_user_error():
        if args.out and (problem := dir_problem(args.out, "--out")):
            raise ValueError(problem)  # before minutes of measuring, not after
        device = resolve_device(args.device)
        if argv is None:  # a command, not a call
            spin_when_idle(device)  # the wait the eval's steps will run with (eval/timing/openmp.py)
        ckpt = resolve_checkpoint(args.checkpoint)
        meta = read_meta(ckpt)
        bcfg = BackboneConfig(**meta["backbone"])
        backbone = load_backbone(replace(bcfg, dtype=args.dtype or bcfg.dtype), device)
        loaded = LoadedDrafter(*load_drafter(ckpt, backbone, meta), ckpt)
        for_decoding(loaded.drafter, backbone.device, args.draft_weights)
        cfg = TunerConfig(mode="force" if args.force else "auto", prompts=args.prompts, threads=args.threads,
                          probe_prompts=args.probe_prompts, reps=args.reps, confirm=args.confirm)  # fmt: skip
        probe = probe_prompts(cfg.prompts, backbone, cfg.probe_prompts)
        method = registry.get(meta["method"]).proposer
        cache = args.max_cache_len if resolve_compile(args.compile, backbone.device) else 0
        workload = ()
        if args.eval_prompts:  # their lengths, never their text
            scored = load_prompts(args.eval_prompts, args.limit_per_category).prompts
            workload = of_prompts(backbone.tokenizer, scored, args.max_new_tokens, args.max_cache_len)
        use = Use(args.temperature, args.top_p, args.lookup_tokens, cache, workload, args.max_new_tokens)
        tuned = load_or_tune(method, backbone, loaded, probe, cfg, use, keep=not args.out)
        if tuned is None:
            raise ValueError(
                f"{ckpt} holds a {meta['method']} drafter, whose decoder ({method}) the tuner has no model of"
            )
        if args.out:
            print(f"wrote {write_decoding(args.out, tuned.record)}")
        print(summary(tuned))


def summary(tuned: Tuned) -> str:
    """The measured costs and the choice, for a terminal."""
    record = tuned.record
    c = record["costs_s"]
    ms = lambda t: ", ".join(f"{k}: {1000 * v:.2f}" for k, v in t.items())  # noqa: E731
    pred, v = record["predicted"], record["vllm"]
    branch = (
        f" (lookup branch of {record['branch_tokens']} of {record['lookup_tokens']} allowed: "
        f"+{pred['lookup_gain']:.3f} tokens, +{pred['lookup_nodes']:.2f} nodes per step)"
        if record.get("branch_tokens")
        else " (no lookup branch: none pays)"
        if record.get("lookup_tokens")
        else ""
    )
    how = "reused" if tuned.reused else f"tuned now in {record['seconds']:.1f} s"
    return "\n".join([
        f"verify ms by width: {ms(c['verify'])}",
        f"drafter ms by setting: {ms(c['draft'])}",
        f"bookkeeping ms by width: {ms(c['bookkeeping'])}; prefill {1000 * c['prefill']:.1f} ms",
        *([f"finalists decoded (plain {record['plain_step_ms']:.1f} ms a step): " + "; ".join(
            f"{f['summary']['verify_width']} wide + {f.get('branch_tokens', 0)} lookup: {f['step_ms']:.1f} ms "
            f"(modelled {f['step_ms_modelled']:.1f}), {f['speedup']:.3f}x" for f in record["confirmed"])]
          if record.get("confirmed") else []),
        f"acceptance ({record['acceptance']['source']}): "
        + json.dumps([[round(a, 3) for a in row[:4]] for row in record["acceptance"]["table"]]),
        *([f"plain decoding chosen: {record['choice_reason']}"] if record["choice"] == PLAIN else []),
        f"{'declined' if record['choice'] == PLAIN else 'decoder'}: {record['decoder_summary']}: tau {pred['tokens_per_step']:.3f}, {pred['tokens_per_s']:.1f} "
        f"tokens/s vs vanilla {pred['vanilla_tokens_per_s']:.1f}, predicted speedup {pred['speedup']:.3f}x{branch}",
        f"vLLM: num_speculative_tokens {v['num_speculative_tokens']} (tau {v['tokens_per_step']:.3f}, "
        + (f"measured {v['speedup']:.3f}x in vLLM, ./launch.sh vllm-k)" if v.get("source") == "vllm"
           else f"predicted speedup {v['speedup']:.3f}x with this device's costs)"),
        f"record: {tuned.name} ({how})",
    ])  # fmt: skip


if __name__ == "__main__":
    main()
