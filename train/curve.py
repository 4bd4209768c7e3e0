"""Held-out accuracy and measured tau against the number of training conversations (or any run setting), read
from finished runs -- e.g. the main job's recipe at several data sizes (a Hydra multirun writes one run folder
per value):

    ./launch.sh medusa -m experiment=medusa_smollm2_selfdistill_cpu data.max_rows=384,960,1920,3840 \\
        run_dir=runs/data-curve
    python train/curve.py runs/data-curve/* --out docs/figures/data_curve.png

Per run: x = the training conversations actually used (data_stats.train.samples: rows left after skips),
held-out accuracy = final_eval.json's eval/head{k}/top1 (Medusa heads; EAGLE: eval/step{k}/top1), tau = its
measured/tau (the built-in decoder on held-out prompts), and, when the run's eval stage ran (run/eval/report.json),
the dev prompts' tau.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headstart.models.checkpoint import CONFIG_NAME, DRAFTER_DIR, read_final_eval


def read_run(run: Path) -> dict | None:
    meta_file = run / DRAFTER_DIR / CONFIG_NAME
    if not meta_file.is_file():
        return None
    meta, final = json.loads(meta_file.read_text()), read_final_eval(run)
    acc, k = [], 0
    while key := next((f"eval/{u}{k}/top1" for u in ("head", "step") if f"eval/{u}{k}/top1" in final), None):
        acc.append(final[key])
        k += 1
    dev = run / "eval" / "report.json"
    return {
        "run": str(run),
        "conversations": meta["data_stats"]["train"]["samples"],
        "steps": meta.get("step"),
        "accuracy": acc,
        "tau": final.get("measured/tau"),
        "dev_tau": json.loads(dev.read_text())["tau"] if dev.is_file() else None,
    }


def plot(rows: list[dict], out: Path) -> None:
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ax_acc, ax_tau = fig.subplots(1, 2)
    xs = [r["conversations"] for r in rows]
    for k in range(max(len(r["accuracy"]) for r in rows)):
        ax_acc.plot(xs, [r["accuracy"][k] if k < len(r["accuracy"]) else None for r in rows], "o-",
                    label=f"head {k}")  # fmt: skip
    ax_acc.set(xscale="log", xlabel="training conversations", ylabel="held-out top-1 accuracy")
    ax_acc.legend()
    ax_tau.plot(xs, [r["tau"] for r in rows], "o-", label="held-out prompts (in training)")
    if any(r["dev_tau"] is not None for r in rows):
        ax_tau.plot(xs, [r["dev_tau"] for r in rows], "s--", label="dev prompts (eval stage)")
    ax_tau.set(xscale="log", xlabel="training conversations", ylabel="measured tau (greedy)")
    ax_tau.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    p.add_argument("--out", type=Path, default=Path("data_curve.png"))
    args = p.parse_args(argv)
    rows = sorted(filter(None, map(read_run, args.runs)), key=lambda r: r["conversations"])
    if not rows:
        p.error("no finished run (a drafter/ folder) among the given folders")
    print("| conversations | steps | held-out top-1 by head | measured tau (held-out) | tau (dev prompts) |")
    print("|---|---|---|---|---|")
    for r in rows:
        acc = " / ".join(f"{a:.3f}" for a in r["accuracy"])
        dev = "-" if r["dev_tau"] is None else f"{r['dev_tau']:.3f}"
        print(f"| {r['conversations']} | {r['steps']} | {acc} | {r['tau']:.3f} | {dev} |")
    plot(rows, args.out)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
