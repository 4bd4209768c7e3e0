"""Model cards for exported drafters: what was trained on what, and what the eval stage measured."""

from __future__ import annotations

import json
from pathlib import Path


def public_name(path: str | None) -> str:
    """What a card may say about a file or model path: a Hub id or a package name as it is, a local path only
    by its base name (a card is published; /home/you/... is not for the world)."""
    if not path:
        return "?"
    path = str(path)
    if path.startswith("pkg://"):
        return Path(path).name
    from headstart.models.backbone import looks_local

    return Path(path).name if looks_local(path) or Path(path).expanduser().exists() else path


def base_model_id(backbone: dict) -> str:
    """The base model a card and an exported config name: backbone.hub_id, else the Hub id / base name."""
    return backbone.get("hub_id") or public_name(backbone.get("path"))


def training_conversations(meta: dict) -> str:
    train = (meta.get("data_stats") or {}).get("train") or {}
    return str(train.get("samples", "?"))


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
        f"- data: `{public_name(data.get('source', 'sharegpt-package'))}` (max_length "
        f"{data.get('max_length', '?')}, responses {data.get('responses', '?')}); "
        f"{training_conversations(meta)} training conversations",
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
    prompts = report.get("prompts")
    if isinstance(prompts, dict):  # the eval stage's {"file", "n", ...}
        prompts = f"{prompts.get('n', '?')} prompts from `{public_name(prompts.get('file'))}`"
    else:
        prompts = f"{prompts} prompts"
    return [
        "",
        "## Measured in headstart's speculative decoder",
        "",
        f"method {report.get('method')}, temperature {report.get('temperature')}, "
        f"{prompts}: tau {report.get('tau', float('nan')):.2f} accepted tokens per "
        f"target forward, speedup {report.get('speedup', float('nan')):.2f}x over plain decoding.",
    ]
