"""How well does the simulated tau logged while training predict the tau the decoder measures?

For every drafter checkpoint under the given run folders (EAGLE or Medusa), three numbers:
  - `sim`: the training-time proxy stored in the checkpoint (EAGLE: `eval/sim_tau`, the drafter's own greedy
    chain of `sim_steps` tokens against the backbone's greedy token on held-out training rows);
  - `chain`: tau measured in the built-in decoder, greedy, on dev prompts, with a chain of the same length
    (top-1 draft per level): what the proxy approximates, on other text;
  - `tree`: tau measured with the decoder's default draft tree (what serving sees).
Writes sim_vs_measured.json, a markdown table and a scatter plot (sim vs measured) into --out.

    python eval/bench/sim_vs_measured.py runs/<eagle run> runs/<eagle3 run> --out runs/sim-vs-measured
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from headstart.eval.engine.quick import quick_eval
from headstart.eval.stage.config import DEFAULT_PROMPTS
from headstart.eval.stage.prompts import chat_ids, load_prompts
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import find_checkpoints, load_drafter, step_of


def pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Correlation, or None when it is undefined (fewer than 3 points, or a constant series)."""
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for key, marker in (("chain", "o"), ("tree", "^")):
        ax.scatter([r["sim"] for r in rows], [r[key] for r in rows], marker=marker, label=f"measured, {key}")
    for r in rows:
        ax.annotate(f"{r['method']}@{r['step']}", (r["sim"], r["chain"]), fontsize=7)
    lo = min(min(r["sim"], r["chain"]) for r in rows)
    hi = max(max(r["sim"], r["tree"]) for r in rows)
    ax.plot([lo, hi], [lo, hi], "k:", lw=1, label="y = x")
    ax.set(xlabel="simulated tau (training, held-out rows)", ylabel="measured tau (decoder, dev prompts)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(runs: list[str], prompt_file: str, per_category: int, tokens: int, out: Path) -> dict:
    """-> {"rows": [...], "chain_over_sim", "tree_over_sim", "pearson_sim_chain", "pearson_sim_tree"}; also
    written to `out` (json, md, png)."""
    rows, backbones = [], {}
    for run in runs:
        for ckpt, meta in find_checkpoints(run).items():
            sim = (meta.get("eval") or {}).get("eval/sim_tau")
            if any(r["run"] == run and r["step"] == step_of(ckpt, meta) for r in rows):
                continue  # the run's final drafter/ is its last checkpoint again
            if sim is None:
                print(f"skip {ckpt}: no eval/sim_tau in its metadata")
                continue
            key = json.dumps(meta["backbone"], sort_keys=True)
            if key not in backbones:  # the backbone and its tokenized prompts, once per distinct backbone
                target = load_backbone(BackboneConfig(**meta["backbone"]))
                msgs = [
                    [{"role": "user", "content": r.turns[0]}]
                    for r in load_prompts(prompt_file, per_category).prompts
                ]
                backbones[key] = target, [chat_ids(target.tokenizer, m) for m in msgs]
            target, prompts = backbones[key]
            drafter = load_drafter(ckpt, target, meta)[0].to_serving_dtype(target.dtype)
            depth = meta["method_config"].get("sim_steps", 4)
            chain = {"num_draft_tokens": depth, "tree_nodes": depth, "topk": 1}
            row = {
                "run": run,
                "checkpoint": str(ckpt),
                "method": meta["method"],
                "step": step_of(ckpt, meta),
                "sim": sim,
                "chain": quick_eval(target, drafter, meta["method"], prompts, tokens, **chain)["tau"],
                "tree": quick_eval(target, drafter, meta["method"], prompts, tokens)["tau"],
                "prompts": len(prompts),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    if not rows:
        raise SystemExit("no checkpoint with a simulated tau (eval/sim_tau) found: EAGLE runs log it")
    out.mkdir(parents=True, exist_ok=True)
    sim, chain, tree = (np.array([r[k] for r in rows]) for k in ("sim", "chain", "tree"))
    summary = {
        "rows": rows,
        "chain_over_sim": float(np.mean(chain / sim)),
        "tree_over_sim": float(np.mean(tree / sim)),
        "pearson_sim_chain": pearson(sim, chain),
        "pearson_sim_tree": pearson(sim, tree),
    }
    (out / "sim_vs_measured.json").write_text(json.dumps(summary, indent=2))
    lines = [
        "| checkpoint | method | step | simulated | measured chain | measured tree |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['checkpoint']} | {r['method']} | {r['step']} | {r['sim']:.3f} | {r['chain']:.3f} "
        f"| {r['tree']:.3f} |"
        for r in rows
    ]
    lines.append(
        f"\nmean measured/simulated: chain {summary['chain_over_sim']:.3f}, tree {summary['tree_over_sim']:.3f}; "
        f"Pearson r: chain {summary['pearson_sim_chain']}, tree {summary['pearson_sim_tree']}"
    )
    (out / "sim_vs_measured.md").write_text("\n".join(lines) + "\n")
    plot(rows, out / "sim_vs_measured.png")
    print("\n".join(lines))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run folders (every checkpoint under them) or checkpoint folders")
    p.add_argument("--prompts", default=DEFAULT_PROMPTS)
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("runs/sim-vs-measured"))
    args = p.parse_args()
    compare(args.runs, args.prompts, args.per_category, args.tokens, args.out)


if __name__ == "__main__":
    main()
