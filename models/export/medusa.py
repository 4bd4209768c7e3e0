"""Serving layouts for trained Medusa heads, and their inverse (for round-trip tests).

- `medusa`: the FasterDecoding/Medusa repo layout. `config.json` has `medusa_num_heads`, `medusa_num_layers`,
  `base_model_name_or_path`; `medusa_lm_head.safetensors` holds each head as an `nn.Sequential` of L ResBlocks
  then the vocabulary Linear: `{h}.{i}.linear.weight`, `{h}.{i}.linear.bias`, `{h}.{L}.weight`.
- `vllm`: vLLM's `Medusa` model (`model_type: medusa`): `blocks.{h}.layers.{i}.weight/bias` (with
  `medusa_fc_bias: true`), `lm_heads.{h}.weight`; with a shared lm_head, `original_lm_head: true` and one
  `lm_heads.0.weight`. vLLM's MedusaProposer drafts one token per head it loads, so `num_speculative_tokens`
  must equal the heads served: when the tuner chose a chain of K < num_heads (decoding.json), the folder ships
  only the first K heads (head k drafts position k+1 either way).

A truncated draft vocabulary (method.draft_vocab_size, Dv rows of the shared lm_head) is written for vLLM as
`truncated_vocab_size: Dv`, the (Dv, H) rows as `lm_heads.0.weight` (`original_lm_head: true`) and `token_map`
(Dv,) int64 (draft id -> target id); vLLM then drafts the argmax over those ids, as our proposer does. vLLM
builds per-head lm_heads over the full vocabulary, so heads with their own truncated lm_heads cannot be served
there: refused. The FasterDecoding layout has no truncation: shared heads are written over the full lm_head
(the kept ids' logits are exact, but the other ids become draftable too: drafts may differ, decoding stays
lossless; the card says so); own truncated heads are refused (their other rows were never trained).

Heads that read the root token (`method.root_token`) are written for vLLM as `architectures:
["HeadstartRootMedusaModel"]` with the root's projection as `root_proj.weight`: headstart's vLLM plugin
(eval/serving/vllm_plugin.py) registers that architecture, vLLM's Medusa plus the projection of the step's sampled
token, and a vLLM without the plugin refuses the unknown architecture at load instead of dropping the weight
(vLLM's Medusa.load_weights skips names it does not know). The Medusa repo's layout has no place for it: refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from headstart.models.medusa import MedusaConfig, MedusaHeads

log = logging.getLogger("headstart.export")
LAYOUTS = ("medusa", "vllm")
# vLLM's Medusa reading the root token too (root_token heads): headstart's vLLM plugin registers it
ROOT_ARCH = "HeadstartRootMedusaModel"
ROOT_WEIGHT = "root_proj.weight"  # the root's projection in that layout
VLLM = {
    "vllm": ("medusa", True)
}  # layout -> (vLLM speculative_config method, must serve); the repo layout is not vLLM's


def _lm_weight(heads: MedusaHeads, h: int) -> torch.Tensor:
    return heads.head_weight(h).detach()


def _check_truncation(heads: MedusaHeads, layout: str) -> None:
    if heads.truncated and heads.lm_heads is not None:
        raise ValueError(
            f"these heads have their own lm_heads over a truncated draft vocabulary "
            f"({heads.draft_vocab_size} of {heads.vocab_size} ids), which the {layout!r} layout cannot hold "
            "(vLLM truncates only one shared lm_head; the Medusa repo never truncates). Fix: train with "
            "method.share_lm_head=true, or method.draft_vocab_size=0"
        )


def to_medusa_repo(heads: MedusaHeads, base_model: str) -> tuple[dict, dict[str, torch.Tensor]]:
    _check_truncation(heads, "medusa")
    cfg = heads.cfg
    # no truncation in this layout: the shared lm_head's full rows (exact for the kept ids)
    full = heads._shared_lm_head[0].weight.detach() if heads.truncated else None
    tensors = {}
    for h, block in enumerate(heads.blocks):
        for i, res in enumerate(block):
            tensors[f"{h}.{i}.linear.weight"] = res.linear.weight.detach()
            tensors[f"{h}.{i}.linear.bias"] = res.linear.bias.detach()
        # The repo stores one lm_head per head; a shared one is copied per head, since safetensors refuses
        # tensors that share memory.
        tensors[f"{h}.{cfg.num_layers}.weight"] = (full if full is not None else _lm_weight(heads, h)).clone()
    config = {
        "medusa_num_heads": cfg.num_heads,
        "medusa_num_layers": cfg.num_layers,
        "base_model_name_or_path": base_model,
        "hidden_size": heads.hidden_size,
        "vocab_size": heads.vocab_size,
    }
    return config, tensors


def to_vllm(heads: MedusaHeads, base_model: str, num_heads: int = 0) -> tuple[dict, dict[str, torch.Tensor]]:
    """`num_heads`: the first heads to ship (0: all)."""
    _check_truncation(heads, "vllm")
    cfg = heads.cfg
    k = min(num_heads or cfg.num_heads, cfg.num_heads)
    tensors = {}
    for h, block in enumerate(heads.blocks[:k]):
        for i, res in enumerate(block):
            tensors[f"blocks.{h}.layers.{i}.weight"] = res.linear.weight.detach()
            tensors[f"blocks.{h}.layers.{i}.bias"] = res.linear.bias.detach()
    shared = heads.lm_heads is None
    for h in range(1 if shared else k):
        tensors[f"lm_heads.{h}.weight"] = _lm_weight(heads, h)  # (Dv, H)
    if heads.truncated:
        tensors["token_map"] = heads.token_map.detach().to(torch.int64)  # (Dv,) draft id -> target id
    if heads.root_proj is not None:
        tensors[ROOT_WEIGHT] = heads.root_proj.weight.detach()
    config = {
        "architectures": [ROOT_ARCH if heads.root_proj is not None else "MedusaModel"],
        "model_type": "medusa",
        "hidden_size": heads.hidden_size,
        "vocab_size": heads.vocab_size,
        "num_heads": k,
        "num_hidden_layers": cfg.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": shared,
        "truncated_vocab_size": heads.draft_vocab_size,
        "max_paths": 64,
        "topk": 10,
        "base_model_name_or_path": base_model,
    }
    return config, tensors


def vllm_engine_args(folder: Path) -> dict:
    """Extra `vllm.LLM` arguments an exported folder needs. vLLM's Medusa.load_weights registers the loaded
    `token_map` as a parameter without reporting it loaded, so its strict every-parameter-loaded check
    (default for unquantized models) refuses every truncated Medusa checkpoint ("Following weights were not
    initialized from checkpoint: {'token_map'}"); the check is turned off for those folders only. Root-token
    heads read the token each step samples, which asynchronous scheduling hands the drafter too late: off."""
    config = json.loads((Path(folder) / "config.json").read_text())
    out = {}
    if config.get("truncated_vocab_size", config.get("vocab_size")) < config.get("vocab_size", 0):
        out["model_loader_extra_config"] = {"enable_weights_track": False}
    if config.get("architectures") == [ROOT_ARCH]:  # the step's sampled tokens reach the heads in sync only
        out["async_scheduling"] = False
    return out


def write_layout(heads: MedusaHeads, layout: str, out: Path, base_model: str, num_heads: int = 0) -> Path:
    """`num_heads` (vllm layout): the first heads to ship (0: all)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown export layout {layout!r}: expected one of {list(LAYOUTS)}")
    if heads.root_proj is not None and layout == "medusa":  # the repo's heads read the hidden state only
        raise ValueError(
            "these heads read the root token (method.root_token=true), which the 'medusa' layout (the Medusa "
            "repo's heads read the hidden state only) cannot hold. Fix: --layout vllm (served with headstart's "
            "vLLM plugin) or headstart's decoder, or train with method.root_token=false"
        )
    if layout == "medusa":
        config, tensors = to_medusa_repo(heads, base_model)
    else:
        config, tensors = to_vllm(heads, base_model, num_heads)
    weights = "medusa_lm_head.safetensors" if layout == "medusa" else "model.safetensors"
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous().cpu() for k, v in tensors.items()}
    save_file(tensors, out / weights, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def read_layout(folder: Path) -> MedusaHeads:
    """Rebuild MedusaHeads from either exported layout (the inverse of write_layout)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") == "medusa":
        k, L = config["num_heads"], config["num_hidden_layers"]
        tensors = load_file(folder / "model.safetensors")
        shared = config.get("original_lm_head", False)
        name = {
            "w": "blocks.{h}.layers.{i}.weight",
            "b": "blocks.{h}.layers.{i}.bias",
            "lm": "lm_heads.{h}.weight",
        }
    else:
        k, L = config["medusa_num_heads"], config["medusa_num_layers"]
        tensors = load_file(folder / "medusa_lm_head.safetensors")
        shared = False
        name = {"w": "{h}.{i}.linear.weight", "b": "{h}.{i}.linear.bias", "lm": "{h}." + str(L) + ".weight"}
    vocab = config["vocab_size"]
    dv = config.get("truncated_vocab_size", vocab)  # the vLLM layout only; own heads (unshared) rebuilt
    root = ROOT_WEIGHT in tensors
    cfg = MedusaConfig(num_heads=k, num_layers=L, draft_vocab_size=dv if dv < vocab else 0, root_token=root)
    heads = MedusaHeads(cfg, config["hidden_size"], vocab)  # root_token: the decoder attaches the embedding
    with torch.no_grad():
        if heads.truncated:
            heads.token_map.copy_(tensors["token_map"])
        if root:
            heads.root_proj.weight.copy_(tensors[ROOT_WEIGHT])
        for h, block in enumerate(heads.blocks):
            for i, res in enumerate(block):
                res.linear.weight.copy_(tensors[name["w"].format(h=h, i=i)])
                res.linear.bias.copy_(tensors[name["b"].format(h=h, i=i)])
            heads.lm_heads[h].weight.copy_(tensors[name["lm"].format(h=0 if shared else h)])
    return heads


def medusa_card(meta: dict, layout: str, report: dict | None):
    """The layout's model card: what the heads are, and how FasterDecoding/Medusa or vLLM serves them."""
    from headstart.models.export.card import (
        THIS_REPO,
        base_model_id,
        model_card,
        tuned_k,
        tuned_lines,
        vllm_snippet,
    )

    m, base = meta["method_config"], base_model_id(meta["backbone"])
    k = m["num_heads"]
    served = min(tuned_k(meta, k), k) if layout == "vllm" else k
    shipped = shipped_heads(meta, k) if layout == "vllm" else k
    about = [
        f"{k} Medusa-1 heads ({m['num_layers']} residual block(s) each) for speculative decoding of `{base}`, "
        f"trained with headstart on the frozen model and exported in the **{layout}** layout."
    ]
    if acc := meta.get("head_topk_accuracy") or []:
        about += ["", "Held-out top-1 accuracy per head: " + ", ".join(f"{a[0]:.3f}" for a in acc) + "."]
    if "draft_vocab_coverage" in (meta.get("data_stats") or {}):  # a truncated draft vocabulary
        about += ["", truncation_note(meta, layout)]
    if layout == "medusa":
        library, serve = "medusa", [
            "With the FasterDecoding/Medusa repository (`pip install medusa-llm`); `config.json` names the base model:",
            "", "```python", "from medusa.model.medusa_model import MedusaModel", "",
            f'model = MedusaModel.from_pretrained("{THIS_REPO}")', "```",
        ]  # fmt: skip
    else:
        spec = {"model": THIS_REPO, "method": "medusa", "num_speculative_tokens": served}
        library, serve = "vllm", vllm_snippet(base, spec, meta) + tuned_lines(meta)
        if m.get("root_token"):
            serve += ["", "These heads also read the root, the token the model samples each step (`root_token`): "
                      "vLLM serves them through headstart's plugin (`pip install --no-deps headstart` in vLLM's "
                      "environment registers `HeadstartRootMedusaModel`; without it vLLM refuses the architecture) "
                      "and with `--no-async-scheduling`."]  # fmt: skip
        if shipped < k:
            serve += ["", f"This folder ships the first {shipped} of the {k} trained heads (vLLM drafts one token "
                      "per head it loads, and drops the drafts past `num_speculative_tokens`); the `medusa` layout "
                      "has all of them."]  # fmt: skip
    return model_card(meta, layout=layout, title=f"Medusa heads for {base}", about=about, serve=serve,
                      library=library, report=report, tags=("medusa",))  # fmt: skip


def truncation_note(meta: dict, layout: str) -> str:
    stats = meta["data_stats"]
    trained = (
        f"Trained over a truncated draft vocabulary of {stats['draft_vocab_size']} tokens (the most frequent"
        f" labels, {stats['draft_vocab_coverage']:.1%} of the labelled training tokens)."
    )
    if layout == "vllm":
        return trained + (
            " vLLM drafts over it (`truncated_vocab_size`, `token_map`), as headstart does; its Medusa loader"
            " leaves `token_map` off its list of loaded weights, so pass"
            ' `model_loader_extra_config={"enable_weights_track": False}` to `LLM(...)` or it refuses to start.'
        )
    return trained + (
        " This layout has no truncated vocabulary: the heads are written over the full lm_head, so the logits"
        " of the kept tokens are exact but every other token can be drafted too; drafts may differ from the"
        " measured ones (verification keeps decoding lossless)."
    )


def shipped_heads(meta: dict, num_heads: int) -> int:
    """How many heads the vLLM layout ships: the tuner's chain length (all heads without one), or the hybrid's
    longer lookup chain when the greedy record has a rule for that chain (vLLM's Medusa drafts one token per
    head it loads, and the lookup plugin replaces a chain of num_speculative_tokens)."""
    from headstart.models.export.card import kept_rule, tuned_k

    k = min(tuned_k(meta, num_heads), num_heads)
    rule = kept_rule(meta, k)
    return min(num_heads, max(k, rule["lookup_tokens"])) if rule else k


def export(drafter_dir: Path, meta: dict, out: Path, layouts: list[str], report: dict | None) -> list[Path]:
    """Medusa heads -> OUT/<layout> for each layout (OUT itself for one), each with a model card."""
    from headstart.models.checkpoint import load_for_export
    from headstart.models.export.card import base_model_id, save_card

    heads, _ = load_for_export(drafter_dir, meta)
    nested = len(layouts) > 1  # OUT/<layout> for each
    if (
        heads.root_proj is not None and "medusa" in layouts and nested
    ):  # asked for alone: write_layout refuses
        log.warning(
            "export: the 'medusa' layout is skipped, these heads read the root token (method.root_token) and the "
            "Medusa repo's heads read the hidden state only; writing %s",
            [layout for layout in layouts if layout != "medusa"],
        )
        layouts = [layout for layout in layouts if layout != "medusa"]
    base_model = base_model_id(meta["backbone"])
    k = shipped_heads(meta, heads.cfg.num_heads)
    written = []
    for layout in layouts:
        folder = out / layout if nested else out
        write_layout(heads, layout, folder, base_model, k)
        save_card(medusa_card(meta, layout, report), folder)
        written.append(folder)
    return written
