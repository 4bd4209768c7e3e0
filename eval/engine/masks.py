"""Sliding-window attention masks for tree steps.

HF builds its own causal (and sliding-window) masks when it gets none, but uses a 4-D additive mask exactly
as given. A tree step passes one (the tree's ancestor pattern, runner.py), so for a model with sliding-window
layers (Mistral, Phi-3, Mixtral on every layer; Gemma-2/3 on every other one, per `layer_types`) the window has
to be applied here, or those layers would attend to keys HF's own decoding never shows them.

HF's rule (masking_utils.sliding_window_overlay): a query at position p sees a key at position k iff
k > p - W. Positions, not cache slots, decide: a committed prefix slot j holds position j, a tree node written at
slot start + i holds position start + depth(i).
"""

from __future__ import annotations

import torch

from headstart.models.families import FULL, SLIDING, layer_windows


class WindowMasks:
    """Turns the runner's (1, 1, q, K) additive mask into what the model's forward takes: the mask itself
    (no sliding layers), the windowed mask (one window on every layer), or {layer type: mask} (mixed layers).
    All tensor ops, so it also runs inside a captured CUDA graph from static buffers."""

    def __init__(self, config) -> None:
        windows = set(layer_windows(config))
        self.window = next((w for w in windows if w is not None), None)
        if len(windows - {None}) > 1:  # no family in transformers has two sizes; refuse rather than guess
            raise ValueError(
                f"layers with different sliding windows {sorted(windows - {None})} are not supported"
            )
        self.mixed = self.window is not None and None in windows

    def __call__(
        self, mask: torch.Tensor, query_pos: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """mask (1, 1, q, K) over cache slots [0, K); query_pos (q,) the queries' positions, which are also the
        positions of the keys written at `slots` (q,); every other slot j < K holds position j."""
        if self.window is None:
            return mask
        key_pos = torch.arange(mask.shape[-1], device=mask.device)  # (K,)
        key_pos = key_pos.index_copy(0, slots, query_pos)
        outside = key_pos[None, :] <= query_pos[:, None] - self.window  # (q, K)
        windowed = mask.masked_fill(outside[None, None], torch.finfo(mask.dtype).min)
        return {FULL: mask, SLIDING: windowed} if self.mixed else windowed
