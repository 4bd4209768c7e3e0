"""Export a trained drafter as Hub-ready folders in the layouts serving engines load, and push them.

    python train/export.py --checkpoint runs/medusa-smollm2-135m-sharegpt --layout all
    python train/export.py --checkpoint RUN_OR_DRAFTER_DIR --push you/smollm2-medusa   # token: HF_TOKEN or login

`--checkpoint` takes a run directory (uses its drafter/) or any drafter folder (config.json +
model.safetensors). Writes OUT/medusa (FasterDecoding/Medusa layout) and OUT/vllm (vLLM's Medusa layout), each
with a model card naming the base model, the data, the training config and, when an eval report exists, the
measured acceptance and speedup. A DistillSpec checkpoint is written as one standard HF causal-LM folder in OUT
(models/export/draft.py; `--layout` does not apply), pushed to REPO_ID as is.
EAGLE checkpoints go to OUT/eagle (EAGLE-1) or OUT/eagle3 (EAGLE-3/SGLang) + OUT/speculators (vLLM), whatever
`--layout` says (models/export/eagle.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headstart.models.backbone import BackboneConfig, BackboneError, load_backbone
from headstart.models.checkpoint import load_drafter, read_meta
from headstart.models.export.medusa import LAYOUTS, measured_lines, write_layout
from headstart.models.export.serve_card import append_serve_check


def resolve_checkpoint(path: Path) -> Path:
    return path / "drafter" if (path / "drafter" / "config.json").is_file() else path


def find_report(drafter_dir: Path) -> dict | None:
    for cand in (drafter_dir / "eval" / "report.json", drafter_dir.parent / "eval" / "report.json"):
        if cand.is_file():
            return json.loads(cand.read_text())
    return None


def model_card(meta: dict, base_model: str, layout: str, report: dict | None) -> str:
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


def export(
    checkpoint: Path, out: Path, layouts: list[str], push: str | None = None, private: bool = False
) -> list[Path]:
    drafter_dir = resolve_checkpoint(checkpoint)
    meta = read_meta(drafter_dir)
    if meta["method"] == "distillspec":  # one standard HF causal-LM folder, whatever `layouts` says
        from headstart.models.export.draft import export_distill

        folder = export_distill(drafter_dir, meta, out, find_report(drafter_dir))
        append_serve_check(folder / "README.md", drafter_dir)
        if push:
            push_folder(folder, push, private)
        return [folder]
    if meta["method"] in ("eagle", "eagle3"):  # every layout of its method (models/export/eagle.py)
        from headstart.models.export.eagle import export_checkpoint

        folders = export_checkpoint(drafter_dir, meta, out)
        for folder in folders:
            append_serve_check(folder / "README.md", drafter_dir)
        for folder in folders if push else []:
            push_folder(folder, f"{push}-{folder.name}", private)
        return folders
    if meta["method"] != "medusa":
        raise ValueError(
            f"{drafter_dir} holds a {meta['method']!r} drafter; this exporter writes Medusa heads"
        )
    bb_cfg = BackboneConfig(**{**meta["backbone"], "dtype": "float32"})
    backbone = load_backbone(bb_cfg)
    heads, _ = load_drafter(drafter_dir, backbone)
    base_model = bb_cfg.hub_id or bb_cfg.path
    report = find_report(drafter_dir)
    written = []
    for layout in layouts:
        folder = out / layout if len(layouts) > 1 else out
        write_layout(heads, layout, folder, base_model)
        (folder / "README.md").write_text(model_card(meta, base_model, layout, report))
        append_serve_check(folder / "README.md", drafter_dir)
        written.append(folder)
        if push:
            repo = push if len(layouts) == 1 else f"{push}-{layout}"
            push_folder(folder, repo, private)
    return written


def push_folder(folder: Path, repo_id: str, private: bool) -> None:
    """Upload with huggingface_hub; the token comes from HF_TOKEN or the cached login and is never printed."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="headstart export")
    print(f"pushed {folder} to https://huggingface.co/{repo_id}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run dir or drafter folder")
    p.add_argument("--out", type=Path, help="output folder (default: <checkpoint>/export)")
    p.add_argument("--layout", default="all", choices=[*LAYOUTS, "all"])
    p.add_argument(
        "--push", metavar="REPO_ID", help="push to this Hub repo (suffix -medusa/-vllm with --layout all)"
    )
    p.add_argument("--private", action="store_true")
    args = p.parse_args(argv)
    layouts = list(LAYOUTS) if args.layout == "all" else [args.layout]
    out = args.out or resolve_checkpoint(args.checkpoint).parent / "export"
    try:
        for folder in export(args.checkpoint, out, layouts, args.push, args.private):
            print(f"wrote {folder}")
    except (FileNotFoundError, ValueError, BackboneError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
