"""Exports: a trained drafter as Hub-ready folders in the layouts serving engines load, with model cards,
pushed to the Hub on request. Each method's exporter and layouts are named in the registry
(models/registry.py): medusa.py (FasterDecoding/Medusa, vLLM), eagle.py (EAGLE-1, EAGLE-3/SGLang, vLLM
speculators), draft.py (a plain HF causal LM); card.py writes the cards, hub.py pushes."""

from __future__ import annotations

import logging
from pathlib import Path

from headstart.models import registry
from headstart.models.checkpoint import read_meta, resolve_checkpoint, weights_signature
from headstart.models.decoding import latest_rule, pick, read_decodings
from headstart.models.export.card import THIS_REPO, find_report
from headstart.models.export.hub import check_hub_access, push_folder
from headstart.models.export.publish import check_out, publish, staged
from headstart.models.export.serve_card import append_serve_check, find_serve_check

log = logging.getLogger("headstart.export")


def vllm_serving(method: registry.Method) -> dict[str, tuple[str, bool]]:
    """{layout: (vLLM speculative_config method, whether vLLM must serve it)} for a method's layouts."""
    import importlib

    return importlib.import_module(method.export.partition(":")[0]).VLLM


def layouts() -> list[str]:
    """Every layout any method exports."""
    return list(dict.fromkeys(layout for m in registry.METHODS.values() for layout in m.layouts))


def export(
    checkpoint: Path,
    out: Path,
    layouts: list[str] | None = None,
    push: str | None = None,
    private: bool = False,
    license: str | None = None,
    serving_device: str = "cuda",
) -> list[Path]:
    """Write `layouts` (empty: every layout of the checkpoint's method) under `out`; push each folder to the
    Hub repo `push` (suffixed with the folder name when there are several). `license`: the cards' license
    (the base model's; `other` when not given). `serving_device`: where the folders will be served (vLLM and
    SGLang: usually cuda), whose greedy decoding.json record sets vLLM's K."""
    drafter_dir = resolve_checkpoint(Path(checkpoint))
    # what the cards add: the license, and vLLM's figures when the serve check ran (eval/serve_check.py); the
    # tuner's record for greedy decoding on the serving device (decoding.json, models/decoding.py) sets vLLM's K
    # and the cards' serving snippets, and the card names that record
    checkpoint_meta = read_meta(drafter_dir)  # a folder that is no drafter: one line, before anything else
    records, weights = read_decodings(drafter_dir), weights_signature(drafter_dir)
    picked = pick(records, greedy=True, device=serving_device)
    if picked:
        log.info("export: %s", picked.note)
    meta = {
        **checkpoint_meta,
        "card": {"license": license, "serve_check": find_serve_check(drafter_dir)},
        "decoding": picked.record if picked else None,
        "decoding_note": picked.note if picked else None,
        # a lookup rule kept without a tuner record (the serve check's; as for records, the nearest device's
        # when none was tuned on the serving one): models/export/card.py `kept_rule`
        "lookup_rule": latest_rule(records, serving_device, weights) or latest_rule(records, None, weights),
    }
    method = registry.get(meta["method"])
    layouts = list(layouts or method.layouts)
    if wrong := [layout for layout in layouts if layout not in method.layouts]:
        raise ValueError(
            f"{drafter_dir} holds a {method.name} drafter, which exports as {list(method.layouts)}, not {wrong}. "
            "Fix: --layout all (every layout of the method) or one of those"
        )
    out = Path(out)
    check_out(out)  # never into a checkpoint, a drafter or a run's own state: before any work
    if push:
        check_hub_access(push)  # before writing anything: no token / no network is one line, not a traceback
    with staged(out) as tmp:  # each layout written whole, then renamed into place
        written = method.exporter()(drafter_dir, meta, tmp, layouts, find_report(drafter_dir))
        for folder in written:  # vLLM's figures, when the serve check ran (eval/serve_check.py)
            append_serve_check(folder / "README.md", drafter_dir)
            if push:  # the card's serving snippets name the repo it is pushed to
                card = folder / "README.md"
                card.write_text(card.read_text().replace(THIS_REPO, repo_id(push, folder, written)))
        folders = publish(tmp, out, written)
    for folder in folders if push else []:
        push_folder(folder, repo_id(push, folder, folders), private)
    return folders


def repo_id(push: str, folder: Path, folders: list[Path]) -> str:
    """The Hub repo of one exported folder: `push` itself, suffixed -<layout> when there are several."""
    return push if len(folders) == 1 else f"{push}-{folder.name}"
