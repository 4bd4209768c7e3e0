"""Where a DistillSpec draft starts (DistillConfig.init), always as a plain HF causal LM in fp32:

- `pretrained`: a smaller LM of the same family (its tokenizer must match the target's exactly);
- `pruned`: the target with only `keep_layers` kept (embeddings, final norm and lm_head copied), the layer-
  dropping init of e.g. Sheared-LLaMA / LayerSkip-style early exits, which starts far closer to the target;
- `fresh`: the target's architecture and width with `num_layers` layers, randomly initialized.

A checkpoint stores the draft's HF config, so `build(cfg, target, meta)` needs neither the target's weights nor the
pretrained draft to rebuild it.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from headstart.models.backbone import Backbone, backbone_config, load_backbone
from headstart.models.distill import DistillConfig, DistillDrafter

PER_LAYER_KEYS = ("layer_types", "no_rope_layers")  # config lists with one entry per decoder layer
_LAYER_KEY = re.compile(r"(^|\.)layers\.(\d+)\.")  # model.layers.7.mlp.up_proj.weight


def evenly_spaced(n: int, k: int) -> list[int]:
    """k of n layer ids, first and last included: evenly_spaced(30, 6) = [0, 6, 12, 17, 23, 29]."""
    return [0] if k == 1 else [round(i * (n - 1) / (k - 1)) for i in range(k)]


def keep_layers(cfg: DistillConfig, n: int) -> list[int]:
    """The target layers a pruned draft keeps, checked against the target's n layers."""
    keep = list(cfg.keep_layers) or evenly_spaced(n, cfg.num_layers)
    if not cfg.keep_layers and cfg.num_layers > n:
        raise ValueError(
            f"method.num_layers={cfg.num_layers} but the target has only {n} layers. Fix: a smaller "
            "method.num_layers or an explicit method.keep_layers"
        )
    bad = [i for i in keep if not 0 <= i < n]
    if bad:
        raise ValueError(
            f"method.keep_layers={keep}: layer {bad[0]} is outside the target's {n} layers (0..{n - 1}). "
            "Fix: pick ids in that range"
        )
    return keep


def draft_config(target_config, layers: list[int]):
    """The target's config with one decoder layer per entry of `layers` (per-layer lists follow the ids)."""
    d = target_config.to_dict()
    d["num_hidden_layers"] = len(layers)
    for key in PER_LAYER_KEYS:
        if isinstance(d.get(key), list) and len(d[key]) == target_config.num_hidden_layers:
            d[key] = [d[key][i] for i in layers]
    return type(target_config).from_dict(d)


def _from_config(config, attn_implementation: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation=attn_implementation
    )


def _attn(model: nn.Module) -> str:
    return getattr(model.config, "_attn_implementation", None) or "sdpa"


def pruned_draft(target: nn.Module, keep: list[int]) -> nn.Module:
    """A fresh model with len(keep) layers (their layer_idx renumbered for the KV cache), holding copies of the
    target's layers `keep`, embeddings, final norm and lm_head."""
    draft = _from_config(draft_config(target.config, keep), _attn(target))
    source = target.state_dict()
    state = {}
    for key in draft.state_dict():
        src = _LAYER_KEY.sub(lambda m: f"{m.group(1)}layers.{keep[int(m.group(2))]}.", key, count=1)
        state[key] = source[src].detach().to(torch.float32).clone()
    draft.load_state_dict(state, strict=True)
    return draft


def fresh_draft(target: nn.Module, num_layers: int) -> nn.Module:
    layers = evenly_spaced(target.config.num_hidden_layers, num_layers)  # only for per-layer config lists
    return _from_config(draft_config(target.config, layers), _attn(target))


def check_same_tokenizer(target_tok, draft_tok, draft_name: str) -> None:
    """Raise naming the first token (by target id) or special token on which the two tokenizers differ."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    fix = "Fix: pick a draft of the target's family (identical tokenizer), or method.init=pruned|fresh"
    for token, i in sorted(tv.items(), key=lambda kv: kv[1]):
        if dv.get(token) != i:
            where = "missing" if token not in dv else f"id {dv[token]}"
            raise ValueError(
                f"draft {draft_name!r} has another tokenizer than the target: the first mismatch is token "
                f"{token!r}, id {i} in the target but {where} in the draft. {fix}"
            )
    extra = sorted(set(dv) - set(tv), key=dv.get)
    if extra:
        raise ValueError(
            f"draft {draft_name!r} has another tokenizer than the target: token {extra[0]!r} (id "
            f"{dv[extra[0]]}) exists only in the draft ({len(dv)} vs {len(tv)} tokens). {fix}"
        )
    for name in ("eos", "bos", "pad", "unk"):
        a = (getattr(target_tok, f"{name}_token"), getattr(target_tok, f"{name}_token_id"))
        b = (getattr(draft_tok, f"{name}_token"), getattr(draft_tok, f"{name}_token_id"))
        if a != b:
            raise ValueError(
                f"draft {draft_name!r} has other special tokens than the target: {name} token is {a[0]!r} "
                f"(id {a[1]}) in the target but {b[0]!r} (id {b[1]}) in the draft. {fix}"
            )


def pretrained_draft(cfg: DistillConfig, target: Backbone) -> nn.Module:
    # a named backbone's packages are joined and converted like the target's; load_backbone defaults pad to eos
    loaded = load_backbone(backbone_config(cfg.draft_path, "draft", dtype="float32"))
    check_same_tokenizer(target.tokenizer, loaded.tokenizer, cfg.draft_path)
    return loaded.model


def init_draft(cfg: DistillConfig, target: Backbone) -> nn.Module:
    """The draft LM in fp32, trainable, in train mode."""
    if cfg.init == "pretrained":
        draft = pretrained_draft(cfg, target)
    elif cfg.init == "pruned":
        draft = pruned_draft(target.model, keep_layers(cfg, target.num_layers))
    else:
        draft = fresh_draft(target.model, cfg.num_layers)
    return draft.requires_grad_(True).train()


def build(cfg: DistillConfig, target: Backbone, meta: dict | None = None) -> DistillDrafter:
    """A new draft (`cfg.init`), or, from a checkpoint's `meta`, the draft rebuilt from its saved HF config
    (no pretrained draft or pruning needed; the caller loads the weights)."""
    if meta is None:
        draft = init_draft(cfg, target)
    else:
        from transformers import AutoConfig

        draft = _from_config(AutoConfig.for_model(**meta["draft_config"]), _attn(target.model))
    drafter = DistillDrafter(cfg, draft)
    drafter.attach_teacher_head(target.lm_head, target.final_softcap)
    return drafter
