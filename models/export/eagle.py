"""Serving layouts for EAGLE drafters, and their inverse (for round-trip tests).

- `eagle3` (SafeAILab/EAGLE-3 and SGLang's `LlamaForCausalLMEagle3`): `fc.weight` (H, 3H), `midlayer.*` (q/k/v
  read 2H), `norm.weight`, `lm_head.weight` (Dv, H), `d2t` (Dv,) int64, `t2d` (V,) bool; LlamaConfig-style
  config.json with `draft_vocab_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`. SGLang reads id j
  as the *output* of layer j (it captures before layer j+1), so we write (our input-of-layer id) - 1. vLLM
  loads this layout too, but reads the same ids as *inputs* of layers (one layer early) unless a top-level
  `eagle_aux_hidden_state_layer_ids` exists, which it prefers and SGLang ignores: so that key carries our ids
  as they are, and each engine fuses the layers the drafter was trained on. Over the full vocabulary
  (draft_vocab_size = V) `d2t`/`t2d` are left out: vLLM then has no parameter for them and refuses the file.
- `speculators` (vllm-project/speculators, loaded by vLLM's eagle3 model): the same tensors with `layers.0.*`;
  config `speculators_model_type: eagle3`, `transformer_layer_config`, `draft_vocab_size`,
  `norm_before_residual` (always written: False, the residual is the un-normed feature), top-level
  `eagle_aux_hidden_state_layer_ids` in vLLM's convention (id i = the input of layer i: written as is), and
  `speculators_config` naming the verifier.
- `eagle` (SafeAILab/EAGLE-1, SGLang `LlamaForCausalLMEagle`): `fc.weight`/`fc.bias` (H, 2H), `layers.0.*` without
  `input_layernorm` (EAGLE's layer 0 has none); config.json LlamaConfig-style with `bias: true`.
- `eagle_vllm` (vLLM's `EagleLlamaForCausalLM`, method "eagle"): vLLM builds `fc` without a bias and, for
  `bias: true`, q/k/v/o biases. fc's bias b is folded into them exactly: the layer's input is x + b (no input
  norm), so q/k/v gain W b (RoPE is applied after the projection, bias included) and the residual's + b
  becomes o_proj's bias. Loading `eagle` instead fails in vLLM (no parameter for `fc.bias`).

EAGLE-1 over a truncated draft vocabulary (method.draft_vocab_size): neither EAGLE-1 layout can say so. vLLM's
`EagleLlamaForCausalLM` has no lm_head, d2t or token_map of its own: it drafts through the target's full
lm_head (and would refuse an unknown `token_map` tensor), and SGLang's EAGLE-1 loader likewise. Both layouts
are written without the map: served there, the drafter proposes over the full vocabulary (the kept ids' logits
are exact; the others become draftable, so drafts may differ from the measured ones, and decoding stays
lossless). The card says so; read_layout rebuilds the full-vocabulary drafter that an engine serves.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from headstart.models.eagle import Eagle3Config, EagleConfig, EagleDrafter

# what an EAGLE-1 / EAGLE-3 drafter can be written as
V1_LAYOUTS, V3_LAYOUTS = ("eagle", "eagle_vllm"), ("eagle3", "speculators")
# layout -> (vLLM speculative_config method, must serve in vLLM); `eagle` is the EAGLE repo / SGLang layout, whose
# fc.bias vLLM's fc lacks: served for information only
VLLM = {
    "eagle": ("eagle", False),
    "eagle_vllm": ("eagle", True),
    "eagle3": ("eagle3", True),
    "speculators": ("eagle3", True),
}
PREFIX = {"eagle": "layers.0.", "eagle_vllm": "layers.0.", "eagle3": "midlayer.", "speculators": "layers.0."}
ATTN = "layers.0.self_attn."


def fold_fc_bias(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """EAGLE-1 tensors with fc.bias moved into q/k/v/o biases (vLLM's fc has no bias; see the docstring)."""
    out = dict(tensors)
    b = out.pop("fc.bias").float()  # (H,)
    for name in ("q_proj", "k_proj", "v_proj"):
        w = out[f"{ATTN}{name}.weight"]
        out[f"{ATTN}{name}.bias"] = (w.float() @ b).to(w.dtype)  # (out,)
    out[f"{ATTN}o_proj.bias"] = b.to(out["fc.weight"].dtype)
    return out


def unfold_fc_bias(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of fold_fc_bias (o_proj's bias is b; the q/k/v biases follow from it)."""
    out = {k: v for k, v in tensors.items() if not (k.startswith(ATTN) and k.endswith(".bias"))}
    out["fc.bias"] = tensors[f"{ATTN}o_proj.bias"]
    return out


def _llama_config(d: EagleDrafter) -> dict:
    c = d.layer_config
    rope = dict(c.rope_parameters)
    return {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None if rope.get("rope_type", "default") == "default" else rope,
        "vocab_size": d.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def to_layout(
    d: EagleDrafter, layout: str, base_model: str, verifier_arch: list[str], k: int = 0
) -> tuple[dict, dict]:
    """-> (config.json dict, tensors) for `layout`. `k`: the speculators layout's `speculative_tokens`, which
    vLLM reads as num_speculative_tokens (0: the training-time-test depth)."""
    if layout not in (V3_LAYOUTS if d.v3 else V1_LAYOUTS):
        raise ValueError(f"a {'EAGLE-3' if d.v3 else 'EAGLE-1'} drafter cannot be written as {layout!r}")
    tensors = {}
    for name, value in d.state_dict().items():
        if name == "token_map":  # EAGLE-1's truncated vocabulary: no engine's EAGLE-1 loader reads it
            continue
        tensors[PREFIX[layout] + name[len("layer.") :] if name.startswith("layer.") else name] = (
            value.detach()
        )
    config = _llama_config(d)
    if layout == "eagle":
        return {**config, "architectures": ["LlamaForCausalLM"], "bias": True}, tensors
    if layout == "eagle_vllm":
        return {**config, "architectures": ["LlamaForCausalLM"], "bias": True}, fold_fc_bias(tensors)
    aux = list(d.aux_layers)
    config |= {"draft_vocab_size": len(d.d2t)}
    if d.full_draft_vocab:  # vLLM has no d2t parameter then and refuses the file
        tensors = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    if layout == "eagle3":
        if 0 in aux:
            raise ValueError("aux layer 0 (the embeddings) has no 'output of layer j' id for SGLang/EAGLE-3")
        eagle = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux], "use_aux_hidden_state": True}
        return {
            **config,
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": eagle,  # SGLang / EAGLE-3: output of layer j
            "eagle_aux_hidden_state_layer_ids": aux,  # vLLM (read first there): input of layer i
        }, tensors
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": config,
        "draft_vocab_size": len(d.d2t),
        "norm_before_residual": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": aux,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k or d.cfg.ttt_steps}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": base_model, "architectures": verifier_arch},
        },
    }, tensors


def write_layout(
    d: EagleDrafter, layout: str, out: Path, base_model: str, verifier_arch: list[str], k: int = 0
) -> Path:
    config, tensors = to_layout(d, layout, base_model, verifier_arch, k)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous().cpu() for k, v in tensors.items()}, out / "model.safetensors", {"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def read_layout(folder: Path, backbone) -> EagleDrafter:
    """Rebuild an EagleDrafter from any of the layouts onto `backbone` (its embeddings and lm_head)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(folder / "model.safetensors")
    if config.get("speculators_model_type") == "eagle3":
        layout, aux = "speculators", config["eagle_aux_hidden_state_layer_ids"]
    elif "LlamaForCausalLMEagle3" in config.get("architectures", []):
        layout, aux = "eagle3", [j + 1 for j in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    else:
        layout, aux = "eagle", None
        if "fc.bias" not in tensors:  # eagle_vllm: the bias was folded into the attention
            tensors = unfold_fc_bias(tensors)
    if aux is None:
        cfg = EagleConfig()
    else:
        cfg = Eagle3Config(aux_layers=aux, draft_vocab_size=config["draft_vocab_size"])
    d = EagleDrafter(cfg, backbone.config, backbone.vocab_size)
    d.attach(backbone.embed_tokens, backbone.lm_head, backbone.final_softcap)
    written = config.get("transformer_layer_config", config)
    ours = _llama_config(d)
    for key in ("rope_theta", "rope_scaling", "hidden_size", "head_dim"):
        if key in written and written[key] != ours[key]:
            raise ValueError(
                f"{folder}/config.json has {key}={written[key]!r} but the backbone gives {ours[key]!r}: this "
                "drafter was exported for another backbone (or RoPE configuration). Fix: load it onto the "
                "backbone it was trained on"
            )
    prefix = PREFIX[layout]
    state = {("layer." + k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in tensors.items()}
    if d.full_draft_vocab and "d2t" not in state:  # written without the map: the identity
        state |= {"d2t": d.d2t, "t2d": d.t2d}
    d.load_state_dict(state, strict=True)
    return d.to(torch.float32)


def eagle_card(meta: dict, layout: str, report: dict | None, truncated: bool = False):
    """The layout's model card: what the drafter is, and how SGLang (EAGLE repo layouts) or vLLM serves it."""
    from headstart.models.export.card import (
        THIS_REPO,
        base_model_id,
        model_card,
        tuned,
        tuned_k,
        tuned_lines,
        vllm_snippet,
    )

    base, kind = base_model_id(meta["backbone"]), meta["method"].upper()
    # SGLang's tree: the tuner's (depth, top-k, nodes + the root) when the checkpoint has one
    tree = (tuned(meta) or {}).get("decoder_summary", {})
    steps, topk = tree.get("num_draft_tokens", 3), tree.get("topk", 4)
    draft_tokens = tree["tree_nodes"] + 1 if "tree_nodes" in tree else 8
    about = [
        f"An {kind} draft layer for speculative decoding of `{base}`, trained with headstart on the frozen "
        f"model's features and exported in the **{layout}** layout."
    ]
    if (tau := (meta.get("eval") or {}).get("eval/sim_tau")) is not None:
        about += ["", f"Simulated tau on held-out data (greedy chain, at training time): {tau:.2f}."]
    if truncated:  # EAGLE-1 over a truncated vocabulary, written without it (see the module docstring)
        stats = meta["data_stats"]
        about += ["", (
            f"Trained over a truncated draft vocabulary of {stats['draft_vocab_size']} tokens (the most frequent"
            f" labels, {stats['draft_vocab_coverage']:.1%} of the labelled training tokens). EAGLE-1 loaders"
            " (vLLM, SGLang) have no place for it and draft through the target's full lm_head: the kept tokens'"
            " logits are exact, every other token can be drafted too, so drafts may differ from the measured"
            " ones (verification keeps decoding lossless)."
        )]  # fmt: skip
    if layout in ("eagle3", "eagle"):  # the EAGLE repo's layout, which SGLang loads
        library, serve = "sglang", [
            "With SGLang:", "", "```bash",
            f"python -m sglang.launch_server --model-path {base} --speculative-algorithm {kind} \\",
            f"  --speculative-draft-model-path {THIS_REPO} --speculative-num-steps {steps} \\",
            f"  --speculative-eagle-topk {topk} --speculative-num-draft-tokens {draft_tokens}", "```",
        ]  # fmt: skip
    else:  # vLLM's layouts (speculators for EAGLE-3)
        k = tuned_k(meta, 3)
        spec = {"model": THIS_REPO, "method": meta["method"], "num_speculative_tokens": k}
        library, serve = "vllm", vllm_snippet(base, spec, meta) + tuned_lines(meta)
    return model_card(meta, layout=layout, title=f"{kind} drafter for {base}", about=about, serve=serve,
                      library=library, report=report, tags=("eagle",))  # fmt: skip


def export(drafter_dir: Path, meta: dict, out: Path, layouts: list[str], report: dict | None) -> list[Path]:
    """A headstart eagle/eagle3 checkpoint -> OUT/<layout> for each layout, with a model card."""
    from headstart.models.checkpoint import load_for_export
    from headstart.models.export.card import base_model_id, save_card, tuned_k

    drafter, backbone = load_for_export(drafter_dir, meta)
    base = base_model_id(meta["backbone"])
    k = tuned_k(meta, 0)  # the tuner's chain length for vLLM (speculators' speculative_tokens), 0: none
    arch = list(getattr(backbone.config, "architectures", None) or [type(backbone.model).__name__])
    written = []
    for layout in layouts:
        folder = write_layout(drafter, layout, out / layout, base, arch, k)
        save_card(eagle_card(meta, layout, report, drafter.truncated), folder)
        written.append(folder)
    return written
