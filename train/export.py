"""Export a trained drafter as Hub-ready folders in the layouts serving engines load, and push them.

    python train/export.py --checkpoint runs/medusa-smollm2-135m-sharegpt --layout all
    python train/export.py --checkpoint RUN_OR_DRAFTER_DIR --push you/smollm2-medusa   # token: HF_TOKEN or login

`--checkpoint` takes a run directory (uses its drafter/) or any drafter folder (config.json +
model.safetensors). `--layout all` writes every layout of the checkpoint's method: Medusa -> OUT/medusa
(FasterDecoding/Medusa) and OUT/vllm (vLLM); EAGLE-3 -> OUT/eagle3 (SGLang / EAGLE repo) and OUT/speculators
(vLLM); EAGLE-1 -> OUT/eagle; DistillSpec -> OUT itself, a standard HF causal-LM folder. Each folder has a model
card naming the base model, the data, the training config and, when an eval report exists, the measured
acceptance and speedup. vLLM's K and the cards' serving snippets come from the drafter's decoding.json record
for greedy decoding on `--serving-device` (the nearest record when none matches; the command says which).
The code lives in models/export/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from headstart.errors import exit_on_user_error
from headstart.models.checkpoint import resolve_checkpoint
from headstart.models.export import export, layouts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run dir or drafter folder")
    p.add_argument("--out", type=Path, help="output folder (default: <checkpoint>/export)")
    p.add_argument("--layout", default="all", choices=[*layouts(), "all"])
    p.add_argument(
        "--push", metavar="REPO_ID", help="push to this Hub repo (suffixed -<layout> with several)"
    )
    p.add_argument("--private", action="store_true")
    p.add_argument(
        "--license", help="the model cards' license, e.g. apache-2.0: the base model's (default: other)"
    )
    p.add_argument(
        "--serving-device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="where the exports will be served: picks decoding.json's greedy record for it (default: cuda)",
    )
    args = p.parse_args(argv)
    out = args.out or resolve_checkpoint(args.checkpoint).parent / "export"
    with exit_on_user_error():
        chosen = [] if args.layout == "all" else [args.layout]
        folders = export(
            args.checkpoint, out, chosen, args.push, args.private, args.license, args.serving_device
        )
        for folder in folders:
            print(f"wrote {folder}")


if __name__ == "__main__":
    main()
