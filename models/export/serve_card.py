"""The model-card section with what the serve check measured in vLLM (eval/serve_check.py), when it ran.

The serve check writes `<run>/serve_check/serve_check.json`; an export made after it carries vLLM's tau and
acceptance beside headstart's for every layout, and the server's own speedup, in each folder's README.md.
"""

from __future__ import annotations

from pathlib import Path

from headstart.models.export.card import quoted_report


def find_serve_check(drafter_dir: Path) -> dict | None:
    return quoted_report(drafter_dir, "serve_check/serve_check.json", "the serve check")


def serve_check_lines(report: dict | None) -> list[str]:
    """Markdown lines (empty when the serve check has not run)."""
    if not report:
        return []
    base = report["vanilla"]["vllm_tokens_per_s"]
    lines = [
        "",
        "## Measured in vLLM (headstart serve check)",
        "",
        f"{report['vllm_package']} ({report.get('vllm_engine', 'eager')} engine), {report['prompts']} prompts, greedy, batch size 1, chain of {report['k']} "
        f"drafts, {report.get('dtype', 'bfloat16')}; headstart's decoder on the same chain and prompts. Result: "
        f"{'pass' if report['passed'] else 'FAIL'}.",
        "",
        "| layout | loads in vLLM | tau vLLM | tau headstart | position-1 acceptance vLLM / headstart | vLLM speedup |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["layouts"]:
        v, o = r["vllm"], r["ours"]
        if not v["loaded"]:
            lines.append(f"| {r['layout']} | no | | {o['tau']:.2f} | | |")
            continue
        p1 = lambda rates: f"{rates[0]:.2f}" if rates else "-"  # noqa: E731
        lines.append(
            f"| {r['layout']} | yes | {v['tau']:.2f} | {o['tau']:.2f} | {p1(v['position_rates'])} / "
            f"{p1(o['position_rates'])} | {v['tokens_per_s'] / base:.2f}x |"
        )
    return lines


def append_serve_check(readme: Path, drafter_dir: Path) -> None:
    """Add the section to an export's README.md when a serve check report exists for the drafter."""
    lines = serve_check_lines(find_serve_check(Path(drafter_dir)))
    if lines and readme.is_file():
        readme.write_text(readme.read_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n")
