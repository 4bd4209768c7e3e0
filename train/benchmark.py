"""Training-step benchmark: tokens/s and peak memory of one Medusa training step, ours vs the naive loss
that materializes all K x B x T x V logits in fp32 (what the Medusa repo's trainer does), measured side by
side in one run. Each variant runs in its own subprocess so peak RSS is its own.

    python train/benchmark.py                       # SmolLM2-135M, 4 heads, batch 4 x 512, bf16
    python train/benchmark.py --backbone tiny --steps 2
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

VARIANTS = ("chunked", "chunked_shared", "naive")


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


def run_variant(args) -> dict:
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import build_drafter
    from headstart.models.medusa import MedusaConfig

    torch.manual_seed(0)
    if args.backbone == "tiny":
        bb_cfg = BackboneConfig(name="tiny", path="tiny", dtype=args.dtype)
    else:
        bb_cfg = BackboneConfig(dtype=args.dtype)
    backbone = load_backbone(bb_cfg)
    share = args.variant == "chunked_shared"
    heads = build_drafter("medusa", MedusaConfig(num_heads=args.heads, share_lm_head=share), backbone)
    opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, backbone.vocab_size, (args.batch, args.seq_len))
    labels = ids.clone()
    labels[:, : args.seq_len // 4] = -100  # a prompt, as in chat data
    times = []
    for i in range(args.steps + 1):
        t0 = time.perf_counter()
        hidden, _ = backbone(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            if args.variant == "naive":
                loss = naive_loss(heads, hidden, labels)
            else:
                loss_sum, count, _ = heads(hidden, labels)
                loss = loss_sum / count
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
        "tokens_per_s": args.batch * args.seq_len / step_s,
        "peak_rss_mb": peak_mb,
        "loss": float(loss),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--variant", help=argparse.SUPPRESS)  # internal: run one variant in this process
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    rows = []
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--variant", variant] + [
            a for a in sys.argv[1:] if a != "--variants"
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["variant"] == "naive"), rows[-1])
    print(f"\n{'variant':<16}{'tok/s':>10}{'peak MB':>10}{'speed x':>9}{'mem x':>8}")
    for r in rows:
        print(
            f"{r['variant']:<16}{r['tokens_per_s']:>10.1f}{r['peak_rss_mb']:>10.0f}"
            f"{r['tokens_per_s'] / base['tokens_per_s']:>9.2f}{r['peak_rss_mb'] / base['peak_rss_mb']:>8.2f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
