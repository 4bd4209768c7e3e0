"""The drafter beside training-free baselines (prompt lookup) scored on the same prompts by the same stage:
tau and measured speedup overall and per category, and in how many categories the drafter is faster (beyond the
2% tie band of eval/report/wins.py, the rule the serve check uses too). Each speedup is the stage's own (vanilla
and speculative decoding interleaved, eval/timing/harness.py), so the figures compare like with like; a flagged
figure is shown and counts as no win."""

from __future__ import annotations

import json
from pathlib import Path

from headstart.eval.report.wins import TIE, beats, category_wins


def _fast(report: dict) -> float:
    return (report.get("speedup") or 0.0) if not report.get("speedup_flags") else 0.0


def _overall(report: dict) -> dict:
    keys = ("method", "tau", "speedup", "speedup_ci", "token_latency_ms")
    memory = report.get("memory") or {}
    return {
        **{k: report.get(k) for k in keys},
        "tokens_per_s": (report.get("tokens_per_s") or {}).get("spec"),
        "peak_gb": (memory.get("spec") or {}).get("peak_gb"),
        "memory_overhead_gb": memory.get("overhead_gb"),
        "flags": report.get("speedup_flags", []),
    }


def compare(drafter: dict, baselines: dict[str, dict]) -> dict:
    """drafter / baselines: eval reports (report.json) on the same prompt set -> the side-by-side table."""
    reports = {"drafter": drafter, **baselines}
    cats = sorted(drafter["categories"])
    rows = {
        cat: {
            n: {k: rep["categories"].get(cat, {}).get(k) for k in ("tau", "speedup")}
            for n, rep in reports.items()
        }
        for cat in cats
    }
    wins = {}
    for b in baselines:
        w = category_wins(
            {n: rows[n]["drafter"]["speedup"] for n in cats}, {n: rows[n][b]["speedup"] for n in cats}
        )
        wins[b] = {
            "categories": w.won,
            "tied": w.tied,
            "of": w.of,
            "overall": beats(_fast(drafter), _fast(baselines[b])),
        }
    overall = {name: _overall(rep) for name, rep in reports.items()}
    # the drafter and every baseline timed in the same interleaved rounds, against one vanilla run
    same_rounds = all(b in (drafter.get("timing") or {}).get("sides", []) for b in baselines)
    return {
        "overall": overall,
        "categories": rows,
        "wins": wins,
        "temperature": drafter.get("temperature"),
        "same_rounds": same_rounds,
    }


def _f(x, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _latency(lat: dict | None) -> str:
    return "-" if not lat else f"{_f(lat.get('p50'), 1)} / {_f(lat.get('p99'), 1)}"


def _memory(o: dict) -> str:
    if o.get("peak_gb") is None:
        return "-"
    return f"{o['peak_gb']:.4g} ({o['memory_overhead_gb']:+.3g})"


def compare_lines(cmp: dict) -> list[str]:
    names = list(cmp["overall"])
    lines = [f"# Drafter vs training-free baselines (temperature {cmp['temperature']})", ""]
    if cmp.get("same_rounds"):
        lines += ["Every method was timed in the same interleaved rounds against one vanilla run.", ""]
    else:
        lines += [
            "The drafter's figure comes from its own rounds; the baselines were timed in rounds of theirs.",
            "",
        ]
    lines += ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines.append("| method | " + " | ".join(cmp["overall"][n]["method"] for n in names) + " |")
    lines.append("| tau | " + " | ".join(_f(cmp["overall"][n]["tau"], 3) for n in names) + " |")
    lines.append(
        "| speedup [95% CI] | "
        + " | ".join(
            f"{_f(o['speedup'], 3)}x [{_f((o['speedup_ci'] or [None])[0])}, {_f((o['speedup_ci'] or [None, None])[-1])}]"
            + (" FLAGGED" if o["flags"] else "")
            for o in (cmp["overall"][n] for n in names)
        )
        + " |"
    )
    lines += [
        "| tokens/s | " + " | ".join(_f(cmp["overall"][n].get("tokens_per_s"), 1) for n in names) + " |",
        "| per-token latency p50 / p99 (ms) | "
        + " | ".join(_latency(cmp["overall"][n].get("token_latency_ms")) for n in names)
        + " |",
        "| peak memory GB (overhead vs vanilla) | "
        + " | ".join(_memory(cmp["overall"][n]) for n in names)
        + " |",
    ]
    for b, w in cmp["wins"].items():
        lines.append(
            f"\nThe drafter is faster than {b} (by more than {TIE:.0%}) overall: {'yes' if w['overall'] else 'no'}; "
            f"in {w['categories']} of {w['of']} categories ({w.get('tied', 0)} within {TIE:.0%}: tied)."
        )
    lines += ["", "| category | " + " | ".join(f"{n} tau / speedup" for n in names) + " |"]
    lines.append("|---|" + "---|" * len(names))
    for cat, row in cmp["categories"].items():
        cells = [f"{_f(row[n]['tau'])} / {_f(row[n]['speedup'])}x" for n in names]
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_compare(out_dir: Path, cmp: dict) -> Path:
    out_dir = Path(out_dir)
    (out_dir / "compare.json").write_text(json.dumps(cmp, indent=1))
    (out_dir / "compare.md").write_text("\n".join(compare_lines(cmp)))
    return out_dir / "compare.md"
