"""bench-decode's table as a picture: speedup over ours vanilla with its 95% interval and tau, and the memory
overhead of each method that runs in our decoder (matplotlib's object API, no display needed)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure


def plot_bench(rows: list[dict], title: str, path: Path) -> Path:
    """Two panels over the same methods (top to bottom in the table's order): speedup [95% CI] annotated with
    tau, and peak-memory overhead over vanilla in MB (rows without a measured decode, HF's, left empty)."""
    names = [r["method"] for r in rows][::-1]
    fig = Figure(figsize=(10, 0.45 * len(rows) + 1.6))
    speed, memory = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    for y, r in enumerate(rows[::-1]):
        name, s = r["method"], r["speedup_vs_ours_vanilla"] or 0.0
        lo, hi = r["speedup_ci"] if r["speedup_ci"] else (s, s)
        speed.barh(y, s, color="C0" if name.startswith("ours") else "C7")
        speed.errorbar(s, y, xerr=[[s - lo], [hi - s]], color="black", capsize=3, lw=1)
        tau = f"tau {r['tau']:.2f}" if r["tau"] is not None else ""
        speed.text(max(hi, s) + 0.02, y, f"{s:.2f}x  {tau}", va="center", fontsize=8)
        if r["memory"] is not None:
            memory.barh(y, 1024 * r["memory"]["overhead_gb"], color="C1")
    speed.axvline(1.0, color="grey", lw=1, ls="--")
    speed.set_yticks(range(len(names)), names, fontsize=8)
    speed.set(xlabel="speedup vs ours vanilla [95% CI]", title=title)
    speed.set_xlim(0, max(1.2, *(max(r["speedup_ci"] or [0]) for r in rows)) * 1.25)
    memory.set(xlabel="memory overhead (MB)", title="vs vanilla")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
