"""Training-step benchmark: tokens/s and peak memory of one training step, ours vs the naive loss, measured side
by side in one run. Each variant runs in its own subprocess so peak RSS is its own; speed and memory ratios are
against the naive variant of the same method.

Medusa (the default `--variants chunked,chunked_shared,naive`): the chunked CE vs the naive loss that
materializes all K x B x T x V logits in fp32 (what the Medusa repo's trainer does).

DistillSpec (`--variants distill,distill_naive`, opt-in so the default run stays the Medusa comparison): one
step = the target's forward under no_grad, then the draft's forward + backward with the chunked divergence
(models/distill.py; no (B, T, V) fp32 tensor alive) vs the naive loss that materializes the teacher's and the
student's (B, T, V) fp32 logits and takes the divergence over them. The draft is the target pruned to
`--draft-layers` layers, the divergence `--divergence`.

Training options (`--variants eagle3,eagle3_skip,eagle3_lk,eagle3_griffin` or `chunked,chunked_soft_lk`): the
plain variant with one option on (EAGLE-3's prompt rows skipped after step 0, the LK hybrid, GRIFFIN's mask;
Medusa's soft targets with the LK hybrid), its speed against the plain one. `--prompt-frac` sets the share of
unlabelled (prompt) positions at the start of each row.

EAGLE (`--variants eagle3,eagle3_naive,eagle,eagle_naive`): one step = the backbone's forward (the aux layers and
the final feature, no grad), then the drafter's training-time-test unroll (`--ttt-steps`, 7 as in the EAGLE
repo and SpecForge) + backward. Ours takes the soft cross-entropy chunk by chunk (models/eagle.py); the naive
loss is the EAGLE repo's: the target's full-vocabulary logits and probabilities and every step's draft logits
in fp32, all alive until backward.

    python eval/bench/train.py                       # SmolLM2-135M, 4 heads, batch 4 x 512, bf16
    python eval/bench/train.py --backbone tiny --steps 2
    python eval/bench/train.py --variants distill,distill_naive --batch 2 --seq-len 256
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from headstart.eval.timing.harness import (
    Interleaved,
    Sample,
    TimingConfig,
    choose_threads,
    conditions,
    finish_conditions,
    summarize,
)
from headstart.hardware import machine_facts, machine_line, resolve_dtype

VARIANTS = ("chunked", "chunked_shared", "naive")  # the default run: Medusa
DISTILL_VARIANTS = ("distill", "distill_naive")
EAGLE_VARIANTS = ("eagle3", "eagle3_naive", "eagle", "eagle_naive")
# the training options (models/losses.py), each against its plain variant: what the option costs per step
OPTION_VARIANTS = {
    "eagle3_skip": ("eagle3", {"skip_prompt_rows": True}),
    "eagle3_lk": ("eagle3", {"lk_weight": 1.0}),
    "eagle3_griffin": ("eagle3", {"griffin_mask": True}),
    "chunked_soft_lk": ("chunked", {"soft_targets": True, "lk_weight": 1.0}),
}
ALL_VARIANTS = VARIANTS + DISTILL_VARIANTS + EAGLE_VARIANTS + tuple(OPTION_VARIANTS)


def naive_loss(heads, hidden, labels):
    """The reference trainer's loss: every head's full fp32 logits at once, then masked CE."""
    logits = heads(hidden).float()  # (K, B, T, V)
    loss = 0.0
    for k in range(logits.shape[0]):
        lg = logits[k, :, : -(k + 2)]
        tgt = labels[:, k + 2 :]
        loss = loss + heads.cfg.decay**k * F.cross_entropy(
            lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), ignore_index=-100
        )
    return loss


def naive_distill_loss(backbone, drafter, ids, loss_mask, teacher_hidden):
    """The divergence over full fp32 logits: the teacher's and the student's (B, T, V) both alive at once."""
    from headstart.models.distill import divergence

    with torch.no_grad():
        teacher = backbone.lm_head(teacher_hidden).float()  # (B, T, V)
    student = drafter.draft(input_ids=ids, use_cache=False).logits.float()  # (B, T, V)
    div = divergence(student[:, :-1][loss_mask], teacher[:, :-1][loss_mask], drafter.cfg)  # (N,)
    return div.sum() / loss_mask.sum()


def naive_eagle_loss(eagle, lm_head_weight, draft_ids):
    """Swap the EAGLE drafter's loss for the EAGLE repo's: the teacher's (N, V) fp32 logits over the full
    vocabulary, then probabilities over the draft ids, and each step's (N, Dv) fp32 student logits through
    autograd's log_softmax, every step's graph alive until backward."""

    def teacher(target, weight_draft_rows, chunk, dtype, cap=None):
        logits = (target @ lm_head_weight.to(target.dtype).T).float()  # (N, V)
        if cap is not None:  # the backbone's final soft cap (Gemma-2), as teacher_targets applies it
            logits = torch.tanh(logits / cap) * cap
        p = torch.softmax(logits[:, draft_ids], -1)  # (N, Dv)
        return p, p.argmax(-1)

    def soft_ce(
        x, weight, probs, top, chunk=None, index=None, segment=None, segments=1, row_weight=None, **_
    ):
        p = probs[index] if index is not None else probs  # (N, Dv) fp32
        log_q = torch.log_softmax((x @ weight.T).float(), -1)  # (N, Dv), every step's rows
        rows = -(p * log_q).sum(-1)  # (N,)
        seg = segment if segment is not None else torch.zeros_like(top)
        hist = torch.zeros(segments, 10, dtype=torch.long)
        hist[:, 0].index_add_(0, seg, (log_q.argmax(-1) == top).long())
        weighted = (rows * row_weight).sum() if row_weight is not None else rows.sum()
        return weighted, torch.zeros(segments).index_add_(0, seg, rows.detach()), hist

    eagle.teacher_targets, eagle.linear_soft_cross_entropy = teacher, soft_ce


def build(args, backbone):
    """The drafter of the variant's method (an option variant: its plain variant's, the option set)."""
    if args.variant in OPTION_VARIANTS:
        plain, options = OPTION_VARIANTS[args.variant]
        drafter = build(argparse.Namespace(**{**vars(args), "variant": plain}), backbone)
        for key, value in options.items():
            setattr(drafter.cfg, key, value)
        return drafter
    from headstart.models.checkpoint import build_drafter
    from headstart.models.distill import DistillConfig
    from headstart.models.medusa import MedusaConfig

    if args.variant in DISTILL_VARIANTS:
        layers = min(args.draft_layers, backbone.num_layers)
        return build_drafter(
            "distillspec", DistillConfig(num_layers=layers, divergence=args.divergence), backbone
        )
    if args.variant in EAGLE_VARIANTS:
        from headstart.models import eagle
        from headstart.models.draft_vocab import build_vocab_map

        if args.variant.startswith("eagle3"):
            cfg = eagle.Eagle3Config(ttt_steps=args.ttt_steps, draft_vocab_size=args.draft_vocab)
            drafter = build_drafter("eagle3", cfg, backbone)
            # any fixed draft vocabulary: the cost is its size
            counts = torch.arange(backbone.vocab_size, 0, -1)
            drafter.set_vocab_map(*build_vocab_map(counts, len(drafter.d2t)))
        else:
            drafter = build_drafter("eagle", eagle.EagleConfig(), backbone)
        if args.variant.endswith("_naive"):
            naive_eagle_loss(eagle, backbone.lm_head.weight, drafter.draft_ids())
        return drafter
    share = args.variant == "chunked_shared"
    return build_drafter("medusa", MedusaConfig(num_heads=args.heads, share_lm_head=share), backbone)


def step_loss(args, backbone, drafter, ids, labels) -> torch.Tensor:
    """One step's loss: the target's forward (no grad), then the drafter's (autocast bf16 as in training)."""
    if args.variant in OPTION_VARIANTS:  # the plain variant's step
        args = argparse.Namespace(**{**vars(args), "variant": OPTION_VARIANTS[args.variant][0]})
    if args.variant in EAGLE_VARIANTS:  # the method's own step runs the backbone
        hidden = None
    else:
        hidden, _ = backbone(ids)  # (B, T, H), no grad
    loss_mask = labels[:, 1:] != -100  # (B, T-1): position t predicts labelled token t+1
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
        if args.variant == "naive":
            return naive_loss(drafter, hidden, labels)
        if args.variant == "distill_naive":
            return naive_distill_loss(backbone, drafter, ids, loss_mask, hidden)
        if args.variant in EAGLE_VARIANTS:
            from headstart.train.steps import eagle_step

            batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
            loss_sum, count, _ = eagle_step(backbone, drafter, batch)
        elif args.variant == "distill":
            loss_sum, count, _ = drafter(ids, torch.ones_like(ids), loss_mask, hidden)
        else:
            loss_sum, count, _ = drafter(hidden, labels)
        return loss_sum / count


def run_variant(args) -> dict:
    from headstart.models.backbone import BackboneConfig, load_backbone

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.backbone == "tiny":
        bb_cfg = BackboneConfig(name="tiny", path="tiny", dtype=args.dtype)
    else:
        bb_cfg = BackboneConfig(dtype=args.dtype)
    backbone = load_backbone(bb_cfg)
    drafter = build(args, backbone)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, backbone.vocab_size, (args.batch, args.seq_len))
    labels = ids.clone()
    labels[:, : int(args.seq_len * args.prompt_frac)] = -100  # a prompt, as in chat data
    times = []
    for i in range(args.steps + 1):
        t0 = time.perf_counter()
        loss = step_loss(args, backbone, drafter, ids, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i > 0:  # the first step warms up allocators and kernels
            times.append(time.perf_counter() - t0)
    step_s = sum(times) / len(times)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "variant": args.variant,
        "step_s": step_s,
        "step_times_s": times,
        "threads": torch.get_num_threads(),
        "tokens_per_s": args.batch * args.seq_len / step_s,
        "peak_rss_mb": peak_mb,
        "loss": float(loss),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    p.add_argument("--dtype", default="auto", help="auto (native bf16 where the device has it, else float32 / fl"
                   "oat16 on CUDA) | float32 | bfloat16 | float16")  # fmt: skip
    p.add_argument("--heads", type=int, default=4, help="medusa: heads")
    p.add_argument(
        "--draft-layers", type=int, default=6, help="distill: target layers the pruned draft keeps"
    )
    p.add_argument("--divergence", default="fkl", choices=["fkl", "rkl", "jsd", "tvd"], help="distill")
    p.add_argument("--ttt-steps", type=int, default=7, help="eagle3: training-time-test steps")
    p.add_argument("--draft-vocab", type=int, default=32000, help="eagle3: draft vocabulary size")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompt-frac", type=float, default=0.25, help="unlabelled share at the start of a row")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--variant", help=argparse.SUPPRESS)  # internal: run one variant in this process
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--repeats", type=int, default=3, help="rounds of every variant, order rotating")
    p.add_argument(
        "--budget-s", type=float, default=600.0, help="stop starting rounds after this many seconds"
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads; 0: the cores free at the start")
    args = p.parse_args()
    unknown = sorted(set(args.variants.split(",")) - set(ALL_VARIANTS))
    if unknown and not args.variant:
        p.error(f"--variants: unknown {unknown}; expected some of {list(ALL_VARIANTS)}")
    if not 0 <= args.prompt_frac < 1:
        p.error(f"--prompt-frac {args.prompt_frac}: must be in [0, 1) (the unlabelled share of each row)")
    return args


def main() -> None:
    args = parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    variants = args.variants.split(",")
    threads = choose_threads(args.threads)  # the children get the same count
    args.dtype = resolve_dtype(
        args.dtype, "cpu", setting="--dtype"
    ).dtype  # the children get the resolved one
    print(machine_line(machine_facts("cpu"), args.dtype), flush=True)  # the first line names the machine
    cond = conditions("cpu", args.dtype)
    shared = ["--backbone", args.backbone, "--dtype", args.dtype, "--heads", str(args.heads)]
    shared += ["--draft-layers", str(args.draft_layers), "--divergence", args.divergence]
    shared += ["--ttt-steps", str(args.ttt_steps), "--draft-vocab", str(args.draft_vocab)]
    shared += ["--batch", str(args.batch), "--seq-len", str(args.seq_len), "--steps", str(args.steps)]
    shared += ["--prompt-frac", str(args.prompt_frac)]
    shared += ["--threads", str(threads)]
    results: dict[str, list[dict]] = {v: [] for v in variants}

    def run(variant: str, _unit: int) -> Sample:
        cmd = [sys.executable, __file__, "--variant", variant, *shared]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"variant {variant} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        results[variant].append(row)
        print(json.dumps(row), flush=True)
        return Sample(
            args.batch * args.seq_len * len(row["step_times_s"]), sum(row["step_times_s"]), args.steps
        )

    # rounds of every variant in rotating order, so load that comes and goes hits all of them alike
    base = next((v for v in variants if v.endswith("naive")), variants[0])
    timer = Interleaved(variants, base, TimingConfig(budget_s=args.budget_s, max_rounds=args.repeats))
    timer.run(run, units=1)
    rows = summary_rows(variants, timer, results)
    cond = {**finish_conditions(cond), "threads_chosen": threads}
    print_rows(rows, timer, threads, cond)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"rows": rows, "conditions": cond, "timing": timer.report(), "runs": results}, f, indent=2
            )


def naive_of(v: str) -> str:
    """The baseline a variant is compared with in the same round (an option variant: the plain method)."""
    if v in OPTION_VARIANTS:
        return OPTION_VARIANTS[v][0]
    return {"distill": "distill_naive", "eagle3": "eagle3_naive", "eagle": "eagle_naive"}.get(
        v.removesuffix("_naive"), "naive"
    )


def summary_rows(variants: list[str], timer: Interleaved, results: dict[str, list[dict]]) -> list[dict]:
    """Per variant: median tokens/s, peak memory, speed and memory over its naive baseline (same rounds)."""
    rows = []
    for v in variants:
        rates = [s[v].rate for s in timer.samples.values()]
        nv = naive_of(v) if naive_of(v) in variants else v
        speed = summarize([s[v].rate / s[nv].rate for s in timer.samples.values()])  # same round: adjacent
        peak = max(r["peak_rss_mb"] for r in results[v])
        base_peak = max(r["peak_rss_mb"] for r in results[nv])
        rows.append({"variant": v, "tokens_per_s": float(sorted(rates)[len(rates) // 2]), "peak_rss_mb": peak,
                     "speed_x": speed["median"], "speed_x_ci": speed["ci"], "mem_x": peak / base_peak,
                     "rounds": len(rates), "loss": results[v][0]["loss"]})  # fmt: skip
    return rows


def print_rows(rows: list[dict], timer: Interleaved, threads: int, cond: dict) -> None:
    print(f"\n{'variant':<16}{'tok/s':>10}{'peak MB':>10}{'speed x [95% CI]':>24}{'mem x':>8}")
    for r in rows:
        ci = f"[{r['speed_x_ci'][0]:.2f}, {r['speed_x_ci'][1]:.2f}]"
        print(
            f"{r['variant']:<16}{r['tokens_per_s']:>10.1f}{r['peak_rss_mb']:>10.0f}{r['speed_x']:>10.2f} {ci:>13}"
            f"{r['mem_x']:>8.2f}"
        )
    print(f"({timer.rounds} rounds; {threads} threads; load before / after {cond['load_avg_before']} / "
          f"{cond['load_avg_after']}; OMP env {cond['omp_env']})")  # fmt: skip


if __name__ == "__main__":
    main()
