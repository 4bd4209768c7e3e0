"""EAGLE drafter settings: the method configs (EAGLE-1/2, EAGLE-3), the fused target layers, the draft layer's
shape. (EAGLE-3's reduced draft vocabulary, d2t / t2d from token frequencies: models/draft_vocab.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import LlamaConfig

from headstart.models.eagle_ttt import ATTENTION
from headstart.models.feature_cache import check_hidden_cache
from headstart.models.losses import loss_mix


@dataclass
class EagleConfig:  # EAGLE-1/2
    w_feat: float = 1.0  # EAGLE-1's v_w
    w_tok: float = 0.1  # EAGLE-1's p_w
    noise: float = 0.2  # uniform noise U(-noise/2, noise/2) on input features while training
    sim_steps: int = 4  # draft chain length of the simulated tau (eval batches)
    loss_chunk: int = 1024  # rows per vocabulary-projection chunk (the soft CE never holds N x V logits)
    # Target features: "online" (the frozen backbone runs in every step) or "offline" (computed once before
    # training into safetensors shards under cache_dir/hidden/, reused while the backbone and data match).
    hidden_cache: str = "online"
    hidden_cache_dtype: str = "bfloat16"  # bfloat16 | float16 | float32 (offline shards only)
    # 0: draft over the full vocabulary (the frozen lm_head); else over the lm_head's rows of the Dv most
    # frequent labelled tokens (`token_map`, models/draft_vocab.py); >= the backbone's vocabulary: the full one
    draft_vocab_size: int = 0
    min_coverage: float = 0.9  # refuse a draft vocabulary that covers less of the labelled tokens than this
    # The token term's objective (models/losses.py): ce_weight * soft CE + lk_weight * (1 - acceptance)
    # against the teacher's distribution; 1/0 = EAGLE's soft CE, 0/1 = the LK loss, both > 0 = the hybrid
    ce_weight: float = 1.0
    lk_weight: float = 0.0
    # HASS's harmonized objective distillation (models/losses.py): the teacher's top-K terms of the soft
    # cross-entropy added again with weight hass_weight; hass_topk 0 = off
    hass_topk: int = 0
    hass_weight: float = 1.0

    def __post_init__(self) -> None:
        loss_mix(self)
        check_hass(self)
        if self.draft_vocab_size < 0 or not 0 <= self.min_coverage <= 1:
            raise ValueError(
                "method.draft_vocab_size must be >= 0 (0 = full) and method.min_coverage in [0, 1]"
            )
        if self.w_feat < 0 or self.w_tok < 0 or self.w_feat + self.w_tok == 0:
            raise ValueError("method.w_feat and method.w_tok must be >= 0 and not both 0")
        if self.noise < 0 or self.sim_steps < 1 or self.loss_chunk < 1:
            raise ValueError("method.noise must be >= 0, method.sim_steps and method.loss_chunk >= 1")
        check_hidden_cache(self)


@dataclass
class Eagle3Config:
    # HF hidden_states ids = the *input* of decoder layer i (vLLM's convention); [] = (2, N//2, N-3), clamped
    # into [1, N-1] for backbones too shallow for that.
    aux_layers: list[int] = field(default_factory=list)
    ttt_steps: int = 3  # training-time-test unroll (SpecForge: 7)
    decay: float = 0.8  # step s's loss weight is decay**s
    draft_vocab_size: int = 32000  # clamped to the backbone's vocabulary; the most frequent labelled tokens
    min_coverage: float = 0.9  # refuse a draft vocabulary that covers less of the labelled tokens than this
    noise: float = 0.0
    sim_steps: int = 4
    loss_chunk: int = 1024
    hidden_cache: str = "online"  # online | offline (see EagleConfig)
    hidden_cache_dtype: str = "bfloat16"
    # recompute each TTT step's layer activations in backward: activation memory stops growing with
    # ttt_steps, for one more draft-layer forward per step (the layer is small next to the vocabulary loss)
    recompute: bool = True
    ce_weight: float = 1.0  # the token objective, as in EagleConfig
    lk_weight: float = 0.0
    # GRIFFIN: step s's loss only where steps 0..s-1 drafted the teacher's top token (what serving runs)
    griffin_mask: bool = False
    # steps 1.. run only on the rows some step >= 1 trains (not the prompt); step 0 still runs on every row,
    # whose keys later steps read. Exact: the same loss and gradients, fewer rows through the layer
    skip_prompt_rows: bool = False
    # HASS's harmonized objective distillation (models/losses.py): the teacher's top-K terms of the soft
    # cross-entropy added again with weight hass_weight; hass_topk 0 = off
    hass_topk: int = 0
    hass_weight: float = 1.0

    def __post_init__(self) -> None:
        loss_mix(self)
        check_hass(self)
        if not 1 <= self.ttt_steps <= 16:
            raise ValueError(
                f"method.ttt_steps={self.ttt_steps}: must be in 1..16. Fix: method.ttt_steps=3 (the default) "
                "or another value in 1..16"
            )
        if not 0 < self.decay <= 1:
            raise ValueError(f"method.decay={self.decay}: must be in (0, 1]. Fix: method.decay=0.8, e.g.")
        if self.ttt_steps == 1 and (self.griffin_mask or self.skip_prompt_rows):
            raise ValueError(
                "method.griffin_mask / method.skip_prompt_rows act on training-time-test steps 1..: with "
                "method.ttt_steps=1 there are none. Fix: ttt_steps >= 2, or leave both false"
            )
        if self.aux_layers and len(self.aux_layers) != 3:
            raise ValueError(f"method.aux_layers={self.aux_layers}: EAGLE-3 fuses exactly 3 layers (or [])")
        if self.draft_vocab_size < 1 or not 0 <= self.min_coverage <= 1:
            raise ValueError("method.draft_vocab_size must be >= 1 and method.min_coverage in [0, 1]")
        if self.noise < 0 or self.sim_steps < 1 or self.loss_chunk < 1:
            raise ValueError("method.noise must be >= 0, method.sim_steps and method.loss_chunk >= 1")
        check_hidden_cache(self)


def check_hass(cfg) -> None:
    """HASS's top-K term: K >= 0, a positive weight, and not beside the LK loss (which would read the
    reweighted teacher table as the target's distribution)."""
    if cfg.hass_topk < 0 or cfg.hass_weight <= 0:
        raise ValueError(
            f"method.hass_topk={cfg.hass_topk}, method.hass_weight={cfg.hass_weight}: need K >= 0 (0 = off) and "
            "a weight > 0. Fix: method.hass_topk=10 method.hass_weight=1.0, or method.hass_topk=0"
        )
    if cfg.hass_topk and cfg.lk_weight:
        raise ValueError(
            f"method.hass_topk={cfg.hass_topk} with method.lk_weight={cfg.lk_weight}: HASS's top-K term is a "
            "cross-entropy on the teacher's top tokens and the LK term would read its reweighted table as the "
            "target's distribution. Fix: method.lk_weight=0, or method.hass_topk=0"
        )


def resolve_aux_layers(cfg: Eagle3Config, num_layers: int) -> tuple[int, ...]:
    """The 3 hidden_states ids to fuse, each the input of a decoder layer in [0, N) (what vLLM can capture)."""
    if not cfg.aux_layers:
        return tuple(min(max(i, 1), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))
    bad = [i for i in cfg.aux_layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"method.aux_layers={cfg.aux_layers}: ids {bad} are outside the backbone's {num_layers} layers. "
            f"Fix: ids in 0..{num_layers - 1} (id i = the input of decoder layer i), or [] for the default"
        )
    return tuple(cfg.aux_layers)


def rope_of(config) -> dict:
    """The backbone's RoPE settings as transformers 5 `rope_parameters`; from the older `rope_theta` +
    `rope_scaling` attributes when a config has no rope_parameters. A config with neither is an error: a draft
    layer with default RoPE on a backbone trained with another would mis-rotate every position."""
    rope = getattr(config, "rope_parameters", None)
    if rope:
        return dict(rope)
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        raise ValueError(
            f"the backbone config ({type(config).__name__}) has neither rope_parameters nor rope_theta: the "
            "EAGLE draft layer cannot match its rotary embedding. Fix: a config with its RoPE settings"
        )
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling["rope_type"] = scaling.pop("type", scaling.get("rope_type", "default"))
    return {**scaling, "rope_theta": theta}


def draft_layer_config(backbone_config, vocab_size: int) -> LlamaConfig:
    """A one-layer LlamaConfig with the backbone's attention/MLP shape (EAGLE drafts with a Llama layer). Its
    attention is `eagle_attention` (models/eagle_ttt.py): SDPA, plus the training-time-test unroll."""
    c = backbone_config
    heads = c.num_attention_heads
    rope = rope_of(c)
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        hidden_act=getattr(c, "hidden_act", "silu"),
        rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
        max_position_embeddings=c.max_position_embeddings,
        rope_parameters=dict(rope),
        attention_bias=False,
        attn_implementation=ATTENTION,
    )
