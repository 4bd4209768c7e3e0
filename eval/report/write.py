"""Write an eval's results: report.json, report.md, answers.jsonl and PNG plots for one checkpoint; runs.json,
runs.md and a tau-vs-step plot for a run folder of checkpoints; the same figures to W&B when a logger is on.

Plots use matplotlib's object API (`Figure`, Agg canvas): no pyplot global state and no display needed.
"""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from headstart.eval.scoring.score import first_pass_dropped
from headstart.hardware import machine_line
from headstart.models.export.serve_card import serve_check_lines


def _fmt(x, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def plot_acceptance(report: dict, path: Path) -> Path:
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    acc = report["acceptance_by_position"]
    ax.bar(range(1, len(acc) + 1), acc, label="share of steps")
    rate = report.get("acceptance_rate_by_position") or []
    if rate:
        ax.plot(range(1, len(rate) + 1), rate, "o-", color="C1", label="rate given proposed")
    ax.set(
        xlabel="draft position",
        ylabel="accepted",
        ylim=(0, 1.05),
        title=f"Acceptance (tau={_fmt(report['tau'])})",
    )
    ax.set_xticks(range(1, len(acc) + 1))
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_speedup(report: dict, path: Path) -> Path:
    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    cats = report["categories"]
    names = list(cats)
    ax.bar(names, [cats[n]["speedup"] or 0 for n in names])
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set(ylabel="speedup vs vanilla", title=f"Speedup by category (all: {_fmt(report['speedup'])}x)")
    for label in ax.get_xticklabels():
        label.set(rotation=40, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _span(xs) -> str:
    return f"[{xs[0]:.3f}, {xs[1]:.3f}]" if xs else "n/a"


def _first_pass_note(r: dict) -> str:
    """Latencies are per step of the first pass; a compiled eval compiled its graphs inside it."""
    return ", first pass: compiles included" if first_pass_dropped(r.get("timing")) else ""


def latency_memory_rows(r: dict) -> list[str]:
    """report.md's rows for per-token latency and memory (older reports without them: none)."""
    rows = []
    if tok := r.get("token_latency_ms"):
        van = r.get("vanilla_token_latency_ms") or {}
        rows.append(
            f"| per-token latency p50 / p99 (ms){_first_pass_note(r)}, spec vs vanilla | {_fmt(tok['p50'], 1)} / "
            f"{_fmt(tok['p99'], 1)} "
            f"vs {_fmt(van.get('p50'), 1)} / {_fmt(van.get('p99'), 1)} |"
        )
    if m := r.get("memory"):
        rows += [
            f"| peak memory (GB) spec / vanilla, overhead | {m['spec']['peak_gb']:.4g} / {m['vanilla']['peak_gb']:.4g}, "
            f"{m['overhead_gb']:+.3g} |",
            f"| drafter weights / kept state (GB) | {m['drafter_gb']:.3g} / {m['state_gb']:.3g} |",
            f"| decode's transient peak tracked by | {m['spec']['tracked_by']} |",
        ]
    return rows


def timing_lines(t: dict | None) -> list[str]:
    """report.md's section on how the speedup was measured: flags, the bound, step costs, conditions."""
    if not t:
        return []
    c = t["conditions"]
    lines = ["", "## Timing", ""]
    lines += [f"- **FLAGGED** (not used to rank): {f}" for f in t["flags"]]
    lines += [
        f"- {t['pairs']} vanilla/spec pairs over {t['rounds']} rounds (order alternating), {t['retimed']} "
        f"re-timed, {t['outliers']} still out of line; converged: {t['converged']}",
        f"- bound max(1, tau * c_1 / c_W): {_fmt(t['bound'], 3)}x; expected from step costs: "
        f"{_span(t['expected_range'])}",
        f"- step costs (ms): width 1 {_fmt(t['step_ms']['vanilla'], 2)}, width {t['verify_width']} "
        f"{_fmt(t['step_ms']['spec'], 2)}; drafter per step {_fmt(t['draft_ms_per_step'], 2)}",
        f"- {c['device']} ({c['device_name']}), {c['dtype']}, {c['threads']} threads "
        f"(chosen: {c['threads_chosen']}), OMP env {c['omp_env'] or '{}'}, {c['usable_cores']} cores",
        f"- busy cores before / after: {c['busy_cores_before']} / {c['busy_cores_after']}; "
        f"load average before / after: {c['load_avg_before']} / {c['load_avg_after']}",
    ]
    return lines


def decoding_lines(d: dict | None) -> list[str]:
    """report.md's section on the decoding settings: where they came from and, when the tuner chose them,
    its predicted speedup beside the measured one."""
    if not d:
        return []
    opts = ", ".join(f"{k}={v}" for k, v in d["options"].items()) or "the decoder's defaults"
    if d.get("choice") == "plain":
        opts = "plain decoding, the drafter unused"
    lines = ["", "## Decoding settings", "", f"- {opts} (chosen by: {d['source']})"]
    if w := d.get("draft_weights"):
        lines.append(f"- drafter layers: {w} (draft_weights; int8: weight-only, CPU)")
    if la := d.get("lookahead"):
        steps = max(la["steps"], 1)
        lines.append(
            f"- lookahead: window {la['window']}, n-gram {la['ngram']}, guesses {la['guesses']}: pool guesses "
            f"verified in {la['guessed'] / steps:.0%} of steps; the accepted path ended on a guess in "
            f"{la['won_guess'] / steps:.0%}, on the Jacobi window in {la['won_window'] / steps:.0%}"
        )
    if b := d.get("lookup_branch"):
        steps = max(b["steps"], 1)
        lines.append(
            f"- prompt-lookup branch: up to {b['tokens']} tokens merged into the tree ("
            + (
                f"the tuner's length, of lookup_tokens={b['allowed']}"
                if b.get("allowed", b["tokens"]) != b["tokens"]
                else f"lookup_tokens; {'in' if d.get('tuned_for_lookup') else 'not in'} the tuner's prediction"
            )
            + f"): added nodes in "
            f"{b['added'] / steps:.0%} of steps, gave the accepted path in {b['won'] / steps:.0%}"
        )
    if "predicted_speedup" not in d:
        return lines
    tp = d["tuning_prompts"]
    lines += [
        f"- tuner record: {d['record']} ({'reused from' if d['reused'] else 'tuned now, added to'} "
        f"decoding.json; probe on {tp['n']} prompts of `{tp['file']}`, none of them scored here)",
        f"- choice: {d['choice']} ({d['choice_reason']})",
        f"- tuner prediction (acceptance from the {d['acceptance_source']}): "
        f"predicted tau {_fmt(d['predicted_tau'], 3)} vs measured {_fmt(d['measured_tau'], 3)}; predicted "
        f"speedup {_fmt(d['predicted_speedup'], 3)}x at this run's answer length (steady state "
        f"{_fmt(d['predicted_speedup_steady'], 3)}x) vs measured {_fmt(d['measured_speedup'], 3)}x: ratio "
        f"{_fmt(d['ratio'], 3)}" + (f" **FLAGGED** ({d['flag']})" if d["flag"] else ""),
        f"- vLLM: num_speculative_tokens {d['vllm_num_speculative_tokens']} (the tuner's chain length)",
    ]
    return lines


def markdown(report: dict) -> str:
    r = report
    lines = [
        f"# Eval: {r['method']} on {r['backbone'].get('name')}",
        "",
        *([f"**{r['headline']}**", ""] if r.get("headline") else []),
        f"- checkpoint: `{r['checkpoint']}`",
        f"- prompts: `{r['prompts']['file']}` ({r['prompts']['n']} used, {r['prompts']['bad_rows']} bad rows)",
        f"- device {r['device']}, dtype {r['dtype']}, temperature {r['temperature']}, "
        f"max_new_tokens {r['max_new_tokens']}",
        *([f"- {machine_line(r['machine'], r['dtype'])}"] if r.get("machine") else []),
        *([f"- dtype: {r['dtype_choice']['reason']}"] if r.get("dtype_choice") else []),
        "",
        "| metric | value |",
        "|---|---|",
        f"| tau (tokens / target forward) | {_fmt(r['tau'], 3)} |",
        f"| speedup vs vanilla (median of {r.get('speedup_pairs', 'n/a')} interleaved pairs) | "
        f"{_fmt(r['speedup'], 3)}{' **FLAGGED**' if r.get('speedup_flags') else ''} |",
        f"| 95% CI / IQR of the speedup | {_span(r.get('speedup_ci'))} / {_span(r.get('speedup_iqr'))} |",
        f"| speedup predicted from tau and step costs | {_fmt(r.get('predicted_speedup'), 3)} |",
        f"| efficiency (speedup / tau) | {_fmt(r['efficiency'], 3)} |",
        f"| tokens/s vanilla / spec | {_fmt(r['tokens_per_s']['vanilla'], 1)} / {_fmt(r['tokens_per_s']['spec'], 1)} |",
        f"| greedy output == vanilla | {_fmt(r['greedy_matches_vanilla'], 3)} |",
        f"| step latency p50 / p99 (ms){_first_pass_note(r)} | {_fmt(r['step_latency_ms']['p50'], 1)} / "
        f"{_fmt(r['step_latency_ms']['p99'], 1)} |",
        *latency_memory_rows(r),
        "| time split | " + ", ".join(f"{k} {v:.0%}" for k, v in r["time_split"].items()) + " |",
        "",
        "## By category",
        "",
        "| category | n | tau | speedup | vanilla tok/s | spec tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in r["categories"].items():
        tps = c["tokens_per_s"]
        lines.append(
            f"| {name} | {c['n']} | {_fmt(c['tau'], 3)} | {_fmt(c['speedup'], 3)} | {_fmt(tps['vanilla'], 1)} "
            f"| {_fmt(tps['spec'], 1)} |"
        )
    lines += [
        "",
        "## Acceptance by draft position",
        "",
        "| position | share of steps | rate given proposed |",
    ]
    lines.append("|---|---|---|")
    rates = r.get("acceptance_rate_by_position", [])
    for i, a in enumerate(r["acceptance_by_position"]):
        lines.append(f"| {i + 1} | {a:.3f} | {_fmt(rates[i] if i < len(rates) else None, 3)} |")
    lines += decoding_lines(r.get("decoding"))
    lines += timing_lines(r.get("timing"))
    lines += serve_check_lines(r.get("vllm_serve_check"))
    if r["prompts"]["bad_examples"]:
        lines += ["", "## Skipped prompt rows", ""] + [f"- {e}" for e in r["prompts"]["bad_examples"]]
    lines += ["", "![acceptance](acceptance_by_position.png)", "![speedup](speedup_by_category.png)", ""]
    return "\n".join(lines)


def write_report(out_dir: str | Path, report: dict, records: list[dict]) -> dict[str, Path]:
    """Write report.json/.md, answers.jsonl and the plots; returns the figures by name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(markdown(report))
    with open(out / "answers.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            row = {k: r[k] for k in ("question_id", "category", "match", "answers")}
            row["tau"] = (
                r["spec"]["step_tokens"] / r["spec"]["target_forwards"]
                if r["spec"]["target_forwards"]
                else None
            )
            f.write(json.dumps(row) + "\n")
    return {
        "acceptance_by_position": plot_acceptance(report, out / "acceptance_by_position.png"),
        "speedup_by_category": plot_speedup(report, out / "speedup_by_category.png"),
    }


def best_index(entries: list[dict]) -> int:
    """Best checkpoint by a figure the machine's load cannot move: the highest tau (the checkpoints of a run
    share method, tree and backbone, so their step costs are the same and tau orders their speedups too);
    ties broken by the measured speedup, a flagged one counting as none."""

    def key(i: int) -> tuple[float, float]:
        e = entries[i]
        measured = 0.0 if e.get("flags") else e.get("speedup") or 0.0
        return e["tau"] or 0.0, measured

    return max(range(len(entries)), key=key)


def write_runs_summary(out_dir: str | Path, entries: list[dict]) -> dict:
    """entries: {checkpoint, step (int|None), tau, speedup, ...}. Sorts them by step (unknown last), marks the
    best, writes runs.json/.md and tau_vs_step.png; returns what runs.json holds."""
    out = Path(out_dir)
    entries = sorted(entries, key=lambda e: (e["step"] is None, e["step"] or 0, e["checkpoint"]))
    best = best_index(entries)
    for i, e in enumerate(entries):
        e["best"] = i == best
    summary = {"best": entries[best]["checkpoint"], "checkpoints": entries}
    (out / "runs.json").write_text(json.dumps(summary, indent=2))
    lines = [
        "# Checkpoints",
        "",
        "Best = highest tau (load-independent); measured speedup = median of interleaved pairs [95% CI].",
        "",
        "| checkpoint | step | tau | predicted speedup | measured speedup [95% CI] | best |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries:
        flag = " **FLAGGED**" if e.get("flags") else ""
        lines.append(
            f"| `{e['checkpoint']}` | {_fmt(e['step'])} | {_fmt(e['tau'], 3)} | {_fmt(e.get('predicted_speedup'), 3)} "
            f"| {_fmt(e['speedup'], 3)} {_span(e.get('speedup_ci'))}{flag} | {'**best**' if e['best'] else ''} |"
        )
    lines += ["", "![tau vs step](tau_vs_step.png)", ""]
    (out / "runs.md").write_text("\n".join(lines))
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    pts = sorted((e["step"], e["tau"]) for e in entries if e["step"] is not None and e["tau"] is not None)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-")
    ax.set(xlabel="training step", ylabel="tau", title="tau vs step")
    fig.tight_layout()
    fig.savefig(out / "tau_vs_step.png", dpi=100)
    return summary


def log_wandb(
    logger_cfg,
    out_dir: str | Path,
    name: str,
    config: dict,
    history: list[dict],
    table: tuple[list[str], list[list]],
    figures: dict[str, Path],
) -> None:
    """Scalars (one `log` per history row), a table and the PNG figures to W&B. WANDB_MODE from the
    environment is honored unless logger.mode sets it. A checkpoint whose training run was tracked joins that
    run's group, with its id in the config (`train_run_id`)."""
    import wandb

    from headstart.tracking import training_run_of

    kw = {"mode": logger_cfg.mode} if logger_cfg.mode else {}
    trained_by = training_run_of(config["checkpoint"]) if config.get("checkpoint") else None
    if trained_by:
        kw["group"] = trained_by["group"]
        config = {**config, "train_run_id": trained_by["id"], "train_run_name": trained_by["name"]}
    run = wandb.init(
        project=logger_cfg.project,
        entity=logger_cfg.entity,
        name=logger_cfg.run_name or name,
        tags=list(logger_cfg.tags) or None,
        dir=str(out_dir),
        job_type="eval",
        config=config,
        **kw,
    )
    for row in history:
        run.log(row)
    columns, rows = table
    run.log({"eval/table": wandb.Table(columns=columns, data=rows)})
    run.log({f"eval/{k}": wandb.Image(str(p)) for k, p in figures.items()})
    run.finish()
