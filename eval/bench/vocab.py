"""Cheaper drafting: the time split of a truncated draft vocabulary against the full one.

Per decode step on the backbone: the target's verify forward (a chain of `--width` tokens after a cached
context, as the decoder runs it) next to Medusa's drafting (K shared heads -> top-k over the full vocabulary or
over the Dv most frequent labelled tokens, mapped back to target ids). Per training step: the heads' loss
forward + backward (chunked CE, bf16 autocast as in training) over the same hidden states, full vs truncated.
All sides run in one process, alternating in rotating order; each figure is a median, each ratio against the
full vocabulary. Then the label coverage of the vocabulary chosen on the training rows, on held-out rows.

    python eval/bench/vocab.py                                  # SmolLM2-135M, bf16, Dv 4096, 8192, 16384
    python eval/bench/vocab.py --data selfdistill --max-rows 128 --eval-rows 32   # the cached CPU job's rows
    python eval/bench/vocab.py --backbone tiny --sizes 32,64 --reps 3 --max-rows 20 --eval-rows 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from headstart.data.build import build_datasets
from headstart.data.config import DataConfig
from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import tree_from_paths
from headstart.eval.timing.harness import choose_threads
from headstart.hardware import machine_facts, machine_line, resolve_dtype
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.draft_vocab import label_counts, most_frequent, vocab_coverage
from headstart.models.medusa import MedusaConfig

TOPK = 4  # candidates per head, as the CPU Medusa tree takes them


def alternate(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds of each zero-argument function, called in rotating order `reps` times (+ one warm-up)."""
    names, times = list(fns), {n: [] for n in fns}
    for rep in range(reps + 1):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            if rep:
                times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def data(args, backbone):
    if (
        args.data == "selfdistill"
    ):  # conf/data/selfdistill_cpu.yaml's rows (the regenerated answers are cached)
        cfg = DataConfig(name="sharegpt-selfdistill", responses="regenerated", max_length=384,
                         regen={"max_new_tokens": 128, "batch_size": 16})  # fmt: skip
    else:
        cfg = DataConfig(max_length=512)
    cfg.max_rows, cfg.eval_rows = args.max_rows, args.eval_rows
    cache = Path(os.environ.get("HEADSTART_CACHE", Path.home() / ".cache/headstart")) / "data"
    train, held_out, _ = build_datasets(
        cfg, backbone.tokenizer, cache, backbone=backbone, show_progress=False
    )
    return train, held_out


def heads_for(backbone, num_heads: int, counts: torch.Tensor, dv: int = 0):
    """K shared-lm_head heads over the full vocabulary (dv=0) or the dv most frequent ids of `counts`."""
    cfg = MedusaConfig(num_heads=num_heads, share_lm_head=True, draft_vocab_size=dv)
    heads = build_drafter("medusa", cfg, backbone)
    if heads.truncated:
        heads.token_map.copy_(most_frequent(counts, dv))
    return heads


def training_batch(train, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """(batch, seq_len) ids of the first long-enough training rows (random ids when there are none)."""
    long = [r["input_ids"][:seq_len] for r in train if len(r["input_ids"]) >= seq_len][:batch]
    return torch.stack(long) if len(long) == batch else torch.randint(3, vocab, (batch, seq_len))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    p.add_argument("--dtype", default="auto", help="auto (native bf16 where the device has it, else float32 / fl"
                   "oat16 on CUDA) | float32 | bfloat16 | float16")  # fmt: skip
    p.add_argument(
        "--sizes", default="4096,8192,16384", help="draft vocabulary sizes (the full one is added)"
    )
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=5, help="verify width: root + drafts (CPU Medusa: 4 nodes)")
    p.add_argument("--context", type=int, default=256, help="tokens cached before the verify step")
    p.add_argument("--batch", type=int, default=1, help="training rows per loss step")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--reps", type=int, default=20, help="decode-step repetitions (training: reps // 4)")
    p.add_argument("--data", default="sharegpt", choices=["sharegpt", "selfdistill"])
    p.add_argument("--max-rows", type=int, default=2000, help="training rows the vocabulary is chosen from")
    p.add_argument("--eval-rows", type=int, default=200, help="held-out rows its coverage is measured on")
    p.add_argument("--threads", type=int, default=0, help="CPU threads; 0: the cores free at the start")
    p.add_argument("--out", help="write the results as JSON here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(choose_threads(args.threads))
    torch.manual_seed(0)
    args.dtype = resolve_dtype(args.dtype, "cpu", setting="--dtype").dtype  # the autocast below reads it
    print(machine_line(machine_facts("cpu"), args.dtype), flush=True)  # the first line names the machine
    tiny = {"name": "tiny", "path": "tiny"} if args.backbone == "tiny" else {}
    backbone = load_backbone(BackboneConfig(dtype=args.dtype, **tiny))
    v = backbone.vocab_size
    sizes = [s for s in map(int, args.sizes.split(",")) if 0 < s < v]

    train, held_out = data(args, backbone)
    counts, held = label_counts(train, v), label_counts(held_out, v)
    coverage = {}
    for dv in sizes:  # chosen on the training rows, measured on both
        token_map = most_frequent(counts, dv)
        coverage[dv] = (vocab_coverage(counts, token_map), vocab_coverage(held, token_map))
    variants = {"full": heads_for(backbone, args.heads, counts)}
    variants |= {f"Dv={dv}": heads_for(backbone, args.heads, counts, dv) for dv in sizes}
    verify_s, draft_s = decode_step_times(args, backbone, held_out, variants)
    train_s = train_step_times(args, backbone, train, variants)
    rows_out = print_times(args, variants, verify_s, draft_s, train_s)
    print(f"\nlabel coverage of the Dv most frequent training labels ({args.data}: {len(train)} training rows, "
          f"{len(held_out)} held out, {int(held.sum())} held-out labels)")  # fmt: skip
    for dv, (tr, ho) in coverage.items():
        print(f"Dv={dv:<8} train {tr:.4f}   held-out {ho:.4f}")
    if args.out:
        cov = {str(dv): {"train": tr, "held_out": ho} for dv, (tr, ho) in coverage.items()}
        Path(args.out).write_text(
            json.dumps({"rows": rows_out, "coverage": cov, "args": vars(args)}, indent=2)
        )


def decode_step_times(args, backbone, held_out, variants: dict) -> tuple[float, dict[str, float]]:
    """The target's verify forward and each variant's drafting, alternating -> (verify s, {variant: draft s})."""
    rows = [r["input_ids"] for r in held_out if len(r["input_ids"]) >= args.context]
    v = backbone.vocab_size
    context = (rows[0][: args.context] if rows else torch.randint(3, v, (args.context,))).tolist()
    chain = tree_from_paths([[0] * d for d in range(1, args.width)])  # root + width-1 drafts
    runner = ModelRunner(backbone, len(context) + args.width + 1)
    candidates = torch.tensor(context[-args.width :])  # any ids: the cost does not depend on them
    with torch.no_grad():
        hidden = runner.prefill(context)[0]  # (H,) the last position's hidden state

    def verify():
        with torch.no_grad():
            runner.step(candidates, chain)  # not committed: every call verifies after the same context

    def drafting(heads):
        def run():
            with torch.no_grad():
                heads.to_target(heads(hidden, depth=args.heads).topk(TOPK, dim=-1).indices)

        return run

    step_s = alternate({"verify": verify} | {n: drafting(h) for n, h in variants.items()}, args.reps)
    return step_s.pop("verify"), step_s


def train_step_times(args, backbone, train, variants: dict) -> dict[str, float]:
    """Each variant's loss forward + backward on real labels (OOV targets included) -> {variant: s}."""
    ids = training_batch(train, args.batch, args.seq_len, backbone.vocab_size)
    labels = ids.clone()
    with torch.no_grad():
        h_train = backbone(ids)[0]  # (B, T, H)

    def training(heads):
        heads.train()

        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
                loss, count, _ = heads(h_train, labels)
            (loss / count).backward()
            heads.zero_grad(set_to_none=True)

        return run

    return alternate({n: training(h) for n, h in variants.items()}, max(3, args.reps // 4))


def print_times(args, variants: dict, verify_s: float, draft_s: dict, train_s: dict) -> list[dict]:
    print(f"\nper decode step ({args.backbone}, {args.dtype}, {torch.get_num_threads()} threads; "
          f"verify width {args.width} after {args.context} cached tokens; {args.heads} shared heads, top-{TOPK})")  # fmt: skip
    print(
        f"{'':<14}{'draft ms':>10}{'x full':>8}{'verify ms':>11}{'draft/verify':>14}{'train loss ms':>15}{'x full':>8}"
    )
    rows_out = []
    for n in variants:
        r = {"variant": n, "draft_ms": 1e3 * draft_s[n], "draft_x": draft_s[n] / draft_s["full"],
             "verify_ms": 1e3 * verify_s, "draft_over_verify": draft_s[n] / verify_s,
             "train_ms": 1e3 * train_s[n], "train_x": train_s[n] / train_s["full"]}  # fmt: skip
        rows_out.append(r)
        print(f"{n:<14}{r['draft_ms']:>10.2f}{r['draft_x']:>8.2f}{r['verify_ms']:>11.2f}{r['draft_over_verify']:>14.3f}"
              f"{r['train_ms']:>15.1f}{r['train_x']:>8.2f}")  # fmt: skip
    return rows_out


if __name__ == "__main__":
    main()
