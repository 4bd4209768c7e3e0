"""Export a DistillSpec draft as a standard Hugging Face causal-LM folder: `config.json` (with `architectures` and
`model_type`), `model.safetensors`, `generation_config.json`, the target's tokenizer files and a model card.

That one layout is what every consumer of a separate draft model loads: transformers' assisted generation
(`target.generate(..., assistant_model=AutoModelForCausalLM.from_pretrained(folder))`), vLLM's draft-model
speculative decoding (`--speculative-config '{"model": folder, "num_speculative_tokens": 4}'`) and headstart's
own decoder (`eval/run.py method=draft draft=folder`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from headstart.models.backbone import DTYPES, BackboneConfig
from headstart.models.checkpoint import load_for_export
from headstart.models.distill import DistillDrafter
from headstart.models.export.card import save_card

VLLM = {"hf": ("draft_model", True)}  # layout -> (vLLM speculative_config method, must serve)


def write_hf_draft(drafter: DistillDrafter, target, folder: Path, dtype: torch.dtype) -> Path:
    """The draft LM in `dtype`, with the target's tokenizer and generation config (EOS ids, pad)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    draft = copy.deepcopy(drafter.draft).to(dtype)
    draft.generation_config = copy.deepcopy(target.model.generation_config)
    draft.config.architectures = [type(draft).__name__]
    draft.save_pretrained(folder)  # safetensors, tied weights stored once
    target.tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    if not (
        config.get("architectures") and config.get("model_type") and (folder / "model.safetensors").is_file()
    ):
        raise RuntimeError(
            f"{folder}: save_pretrained wrote no architectures / model_type / model.safetensors"
        )
    return folder


def draft_model_card(meta: dict, draft_config: dict, report: dict | None):
    """The draft's model card: what was distilled how, and how transformers, vLLM and SGLang use it."""
    from headstart.models.export.card import THIS_REPO, base_model_id, model_card

    base, m = base_model_id(meta["backbone"]), meta["method_config"]
    loss = m["divergence"] + (f" (beta {m['beta']})" if m["divergence"] == "jsd" else "")
    about = [
        f"A {draft_config.get('num_hidden_layers', '?')}-layer `{draft_config.get('model_type', '?')}` draft "
        f"distilled with headstart (DistillSpec) toward the frozen `{base}` (same tokenizer), for speculative "
        "decoding.",
        "",
        f"- init: {m['init']}" + (f" (target layers {m['keep_layers']})" if m["keep_layers"] else ""),
        f"- divergence: {loss}, temperature {m['temperature']}; data: {m['data_mode']}"
        + (f" (lambda {m['lambda_']})" if m["data_mode"] == "mixture" else ""),
    ]
    ev = meta.get("eval") or {}
    if "eval/accept_sim" in ev:
        about += [
            "",
            f"Held-out, teacher-forced: simulated acceptance 1 - TVD = {ev['eval/accept_sim']:.3f}, greedy top-1 "
            f"agreement with the target {ev.get('eval/top1_match', float('nan')):.3f}.",
        ]
    spec = f'{{"model": "{THIS_REPO}", "num_speculative_tokens": 4}}'
    serve = [
        "With transformers (assisted generation):", "", "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        f'tokenizer = AutoTokenizer.from_pretrained("{base}")',
        f'target = AutoModelForCausalLM.from_pretrained("{base}")',
        f'draft = AutoModelForCausalLM.from_pretrained("{THIS_REPO}")',
        'inputs = tokenizer("Hello", return_tensors="pt")',
        "out = target.generate(**inputs, assistant_model=draft, max_new_tokens=64)", "```", "",
        f"With vLLM: `LLM(model=\"{base}\", speculative_config={spec})` or "
        f"`vllm serve {base} --speculative-config '{spec}'`.",
    ]  # fmt: skip
    return model_card(meta, layout="hf", title=f"DistillSpec draft model for {base}", about=about,
                      serve=serve, library="transformers", report=report, tags=("draft-model", "distillspec"))  # fmt: skip


def export(drafter_dir: Path, meta: dict, out: Path, layouts: list[str], report: dict | None) -> list[Path]:
    """A distillspec checkpoint folder -> one standard HF folder (OUT) in the dtype the target was trained in."""
    drafter, target = load_for_export(drafter_dir, meta)
    write_hf_draft(drafter, target, out, DTYPES[BackboneConfig(**meta["backbone"]).dtype])
    save_card(draft_model_card(meta, meta["draft_config"], report), Path(out))
    return [Path(out)]
