"""A preallocated KV cache for decoding with a frozen HF causal LM, plugged in through transformers' `Cache` API.

All layers live in one tensor (layers, 2, 1, kv_heads, max_cache_len + 1, head_dim), allocated once. A forward
writes its q new keys/values at slots [length, length + q) and leaves `length` alone: the decoder then keeps
what the target accepted, without re-running anything:

- `commit(n)`: keep the first n written slots (a chain, or vanilla decoding);
- `accept(nodes)`: keep tree nodes `nodes` (indices into the q written slots, root first, increasing) by
  moving their K/V into contiguous slots with one gather/scatter over all layers at once (the compaction of
  Medusa's `update_inference_inputs`, Cai et al. 2024, Sec. 2.1.2).

Two write modes:
- eager (`slots is None`): writes by slicing and returns the views [0, length + q), so attention only reads
  the live prefix; `get_mask_sizes` matches, so HF can still build its own causal mask for plain decoding.
- static (`slots` set to a device tensor of q slot indices): `index_copy_` into those slots and return the
  buffers' first `view` slots (a cache-length bucket the runner sets, at most max_cache_len), for fixed shapes
  inside a captured CUDA graph or a compiled step; the caller's 4-D mask hides unused slots.

The buffer holds one slot more than max_cache_len, never attended: every view, however long, is then a strided
part of it, never the whole (contiguous) buffer, so one compiled step whose view length is dynamic serves every
bucket (inductor specializes a graph on whether a view is contiguous; eval/engine/compiled.py).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from headstart.models.families import check_layer_types


class CacheFullError(ValueError):
    """A prompt (plus the tokens to generate) that does not fit the preallocated cache."""


class PreallocLayer(CacheLayerMixin):
    """One decoder layer's view into the shared buffer; the sequence length lives on the owning KVCache."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, owner: KVCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = owner
        self.keys, self.values = keys, values  # (1, KVH, S, D) views into owner.kv
        self.device = keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # allocated up front by KVCache

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        slots = self.owner.slots
        if slots is not None:  # static shapes: scatter into fixed slots, attend over the first `view` slots
            self.keys.index_copy_(2, slots, key_states)
            self.values.index_copy_(2, slots, value_states)
            view = self.owner.view  # an int, or inside a compiled step the mask's (dynamic) width
            return self.keys.narrow(2, 0, view), self.values.narrow(2, 0, view)
        start = self.owner.length
        end = start + key_states.shape[-2]
        if end > self.owner.max_cache_len:
            raise CacheFullError(
                f"KV cache overflow: {end} positions needed, max_cache_len={self.owner.max_cache_len}. "
                "Fix: raise max_cache_len"
            )
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.max_cache_len


class KVCache(Cache):
    """Preallocated cache for batch size 1. Pass it as `cache=` to the HF model; the decoder owns `length`."""

    def __init__(
        self, config, max_cache_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> None:
        # every slot is kept (no rolling window buffer): sliding-window layers read all keys and their masks hide
        # the ones out of the window (HF's masks for plain steps, eval/engine/masks.py for trees)
        check_layer_types(config)
        n_layers = config.num_hidden_layers
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # zeros, not empty: masked slots still enter q.k (times an additive -inf), and NaN garbage would leak
        # + 1: a spare slot, never attended (module docstring)
        self.kv = torch.zeros(
            (n_layers, 2, 1, kv_heads, max_cache_len + 1, head_dim), dtype=dtype, device=device
        )
        self.length = 0  # committed positions; a forward writes after them without moving it
        self.slots: torch.Tensor | None = None  # static-mode write slots (q,), see module docstring
        self.max_cache_len = max_cache_len
        self.view = max_cache_len  # static mode: the slots attended over (a cache-length bucket, runner.py)
        super().__init__(layers=[PreallocLayer(self, self.kv[i, 0], self.kv[i, 1]) for i in range(n_layers)])

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states)  # skip Cache's offloading checks

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.length + query_length, 0

    def reset(self) -> None:
        self.length = 0

    def crop(self, tokens_to_remove: int) -> None:
        """transformers 5.x convention: `crop(-n)` drops the last n positions."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative count of positions to remove")
        self.rollback(self.length + tokens_to_remove)

    def commit(self, n: int) -> None:
        """Keep the first n slots written by the last forward."""
        self.length += n

    def rollback(self, length: int) -> None:
        """Forget everything after `length` (the slots are overwritten by the next forward)."""
        if length > self.length:
            raise ValueError(f"rollback to {length} > cached length {self.length}")
        self.length = length

    def accept(self, nodes: list[int]) -> None:
        """Keep the written slots `nodes` (increasing, relative to `length`) as the next len(nodes) positions.

        A path that is already contiguous (a chain, or the first children) needs no copy. Sources are never
        left of their destinations (nodes[i] >= i), and the gather completes before the scatter, so moving in
        place is safe.
        """
        n = len(nodes)
        if nodes[-1] != n - 1:  # not a prefix of the written slots: compact
            src = torch.tensor(nodes, device=self.kv.device) + self.length
            dst = slice(self.length, self.length + n)
            self.kv[:, :, :, :, dst] = self.kv.index_select(4, src)  # (layers, 2, 1, KVH, n, D)
        self.length += n
