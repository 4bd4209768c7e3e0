"""The `method.hidden_cache` option shared by the drafters that read the frozen backbone's features (Medusa: the
final hidden state; EAGLE: the fused layers and the final state): "online" runs the backbone in every training
step; "offline" computes the features once before training into safetensors shards (train/hidden_cache.py),
so every further epoch costs only the drafter."""

from __future__ import annotations

HIDDEN_CACHES = ("online", "offline")
HIDDEN_CACHE_DTYPES = ("bfloat16", "float16", "float32")


def check_hidden_cache(cfg) -> None:
    if cfg.hidden_cache not in HIDDEN_CACHES or cfg.hidden_cache_dtype not in HIDDEN_CACHE_DTYPES:
        raise ValueError(
            f"method.hidden_cache={cfg.hidden_cache!r}, method.hidden_cache_dtype={cfg.hidden_cache_dtype!r}: "
            f"expected one of {HIDDEN_CACHES} and one of {HIDDEN_CACHE_DTYPES}"
        )


def cached_layers(cfg, layers: tuple[int, ...]) -> tuple[tuple[int, ...], str] | None:
    """A drafter's `feature_cache()`: the aux `layers` (the final state is always cached) and the storage dtype
    when the features are cached offline, else None."""
    if cfg.hidden_cache != "offline":
        return None
    return tuple(layers), cfg.hidden_cache_dtype
