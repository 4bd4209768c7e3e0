"""Model families: tiny random configs of the causal LMs users bring (built in-process, no download), and the
start-time check of what headstart's decoder and drafters need from a backbone.

Every drafter reads the backbone through HF's own classes (hidden states, `get_output_embeddings`, the decoder
layer list), so a family works when its decoder layers take an external KV cache and a 4-D additive attention
mask. What differs between the families below, and where it is handled:

- q/k/v biases (Qwen2), q/k norms (Qwen3, Gemma-3), fused projections (Phi-3), expert MLPs (Qwen3-MoE,
  Mixtral), scaled embeddings (Gemma): inside HF's modules, nothing to do;
- sliding-window layers (Mistral, Phi-3, Gemma-2/3): the decoder's tree masks hide keys that fall out of each
  layer's window (eval/engine/masks.py), since HF uses a 4-D mask as given;
- attention logit soft caps (Gemma-2): only HF's eager attention applies them (SDPA refuses), so the backbone
  must load with `attn_implementation=eager`;
- final logit soft caps (Gemma-2): applied wherever logits come from the final hidden state
  (`Backbone.logits`, `final_softcap`).

`check_backbone` refuses, in one line at start, what none of this covers (linear-attention or chunked layers).
"""

from __future__ import annotations

SLIDING, FULL = "sliding_attention", "full_attention"
SUPPORTED_LAYER_TYPES = {FULL, SLIDING}

_SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)
_WINDOW = 8  # smaller than the tests' prompts: the windows really cut the context

# family -> (transformers config class, its tiny overrides on top of _SMALL). Each is a 2-layer model whose
# family-specific features are all switched on (biases, norms, windows, caps, experts).
TINY_FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=True)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),  # q/k/v biases are built in
    "qwen3": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=True)),  # q/k RMSNorm built in
    "mistral": ("MistralConfig", dict(sliding_window=_WINDOW, tie_word_embeddings=False)),
    "gemma2": (
        "Gemma2Config",
        dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=_WINDOW,
            layer_types=[SLIDING, FULL],
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            tie_word_embeddings=True,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=_WINDOW,
            layer_types=[SLIDING, FULL],
            tie_word_embeddings=True,
        ),
    ),
    "phi3": (
        "Phi3Config",
        dict(sliding_window=_WINDOW, partial_rotary_factor=0.5, tie_word_embeddings=False),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    ),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=_WINDOW)),
}


class FamilyError(ValueError):
    """A backbone family headstart cannot serve; the message names what is missing and the fix."""


def tiny_config(family: str, vocab_size: int, **overrides):
    """A 2-layer random config of `family` (TINY_FAMILIES): builds in milliseconds, for tests and `backbone=tiny`
    with `backbone.tiny.family=...`."""
    import transformers

    if family not in TINY_FAMILIES:
        raise FamilyError(f"backbone.tiny.family={family!r} is not one of {sorted(TINY_FAMILIES)}")
    cls_name, extra = TINY_FAMILIES[family]
    # special ids are the tokenizer's (load_backbone sets pad/eos): Phi-3's defaults lie outside a tiny vocabulary
    kw = {**_SMALL, **extra, "vocab_size": vocab_size, "bos_token_id": None, "eos_token_id": None}
    kw.update(pad_token_id=None, **overrides)
    if "layer_types" in kw and len(kw["layer_types"]) != kw["num_hidden_layers"]:
        pattern = kw["layer_types"]  # repeat the pattern over a deeper override
        kw["layer_types"] = [pattern[i % len(pattern)] for i in range(kw["num_hidden_layers"])]
    return getattr(transformers, cls_name)(**kw)


def layer_windows(config) -> list[int | None]:
    """Each decoder layer's sliding window (None: full attention), as HF's modules apply it: per layer from
    `layer_types` when the config has them, else `sliding_window` on every layer (Mistral, Phi-3, Mixtral)."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return [window if kind == SLIDING else None for kind in kinds]
    return [window] * n


def final_softcap(config) -> float | None:
    """Gemma-2's final logit soft cap c (logits = c * tanh(logits / c)), or None."""
    return getattr(config, "final_logit_softcapping", None) or None


def softcap(logits, cap: float | None):
    """c * tanh(logits / c): Gemma-2's final soft cap (identity when `cap` is None). Differentiable."""
    import torch

    return logits if cap is None else torch.tanh(logits / cap) * cap


def check_layer_types(config) -> None:
    """Refuse, in one line, layers the decoder's KV cache and masks cannot serve (recurrent or chunked state)."""
    name = getattr(config, "model_type", type(config).__name__)
    kinds = set(getattr(config, "layer_types", None) or [FULL])
    if unknown := sorted(kinds - SUPPORTED_LAYER_TYPES):
        raise FamilyError(
            f"backbone {name!r} has {unknown} layers; headstart's decoder serves only full and sliding-window "
            "attention (its KV cache has no recurrent or chunked state). Fix: a Llama/Qwen/Mistral/Gemma/Phi-style "
            "backbone"
        )


def check_backbone(config, attn_implementation: str) -> None:
    """Refuse at start, in one line, a backbone headstart cannot train on or decode with losslessly."""
    check_layer_types(config)
    name = getattr(config, "model_type", type(config).__name__)
    if getattr(config, "attn_logit_softcapping", None) and attn_implementation != "eager":
        raise FamilyError(
            f"backbone {name!r} soft-caps its attention logits, which only eager attention applies "
            f"(backbone.attn_implementation={attn_implementation}). Fix: backbone.attn_implementation=eager"
        )
