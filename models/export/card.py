"""Model cards for exported drafters: what was trained on what, and what the eval stage measured."""

from __future__ import annotations

import json
from pathlib import Path


def find_report(drafter_dir: Path) -> dict | None:
    for cand in (drafter_dir / "eval" / "report.json", drafter_dir.parent / "eval" / "report.json"):
        if cand.is_file():
            return json.loads(cand.read_text())
    return None


def medusa_card(meta: dict, base_model: str, layout: str, report: dict | None) -> str:
    job = meta.get("job", {})
    data = job.get("data", {})
    m = meta["method_config"]
    lines = [
        "---",
        f"base_model: {base_model}",
        "library_name: headstart",
        "tags: [speculative-decoding, medusa, headstart]",
        "---",
        f"# Medusa heads for {base_model}",
        "",
        f"{m['num_heads']} Medusa-1 heads ({m['num_layers']} residual block(s) each) trained with headstart on the "
        f"frozen `{base_model}`, exported in the **{layout}** layout.",
        "",
        f"- data: `{data.get('source', '?')}` (max_length {data.get('max_length', '?')}, responses "
        f"{data.get('responses', '?')}); {meta.get('data_stats', {}).get('train_rows', '?')} training conversations",
        f"- steps: {meta.get('step', '?')}; optimizer: `{json.dumps(job.get('optim', {}))}`",
        f"- method config: `{json.dumps(m)}`",
    ]
    acc = meta.get("head_topk_accuracy") or []
    if acc:
        lines += [
            "",
            "Held-out per-head top-1 accuracy: "
            + ", ".join(f"head {k}: {a[0]:.3f}" for k, a in enumerate(acc)),
        ]
    lines += measured_lines(report)
    if layout == "medusa":
        lines += [
            "",
            "Load with the FasterDecoding/Medusa repo (`MedusaModel.from_pretrained(this_folder)`).",
        ]
    else:
        lines += [
            "",
            'Serve with vLLM: `--speculative-config \'{"model": "<this repo>", "method": "medusa", '
            '"num_speculative_tokens": ' + str(m["num_heads"]) + "}'`.",
        ]
    return "\n".join(lines) + "\n"


def measured_lines(report: dict | None) -> list[str]:
    """The model-card section with what the eval stage measured (empty when no report exists)."""
    if not report:
        return []
    return [
        "",
        "## Measured in headstart's speculative decoder",
        "",
        f"method {report.get('method')}, temperature {report.get('temperature')}, "
        f"{report.get('prompts')} prompts: tau {report.get('tau', float('nan')):.2f} accepted tokens per "
        f"target forward, speedup {report.get('speedup', float('nan')):.2f}x over plain decoding.",
    ]
