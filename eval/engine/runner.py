"""Runs one frozen backbone against its own preallocated KVCache: an eager prefill, then decode steps of q tokens
(q = 1 for plain decoding, or a candidate tree), through the HF model's own forward (no forked model code).

Each step returns the final normed hidden states (what Medusa/EAGLE heads read) and the logits, computed with
`backbone.model.model` + `backbone.lm_head`. On CUDA with `cuda_graphs=True`, each step width is captured once
in a CUDA graph over static buffers (ids, positions, write slots, a (1, 1, q, bucket) mask) and
replayed; a capture that fails (e.g. a model whose forward syncs with the host) falls back to eager, with a
warning. Setting `runner.cuda_graphs = True` on a CPU runner runs the same fixed-shape path without capture
(tests use it to check that path against the eager one).

With `compile` set (eval/engine/compiled.py: "max-autotune", or "auto" where inductor runs), each step width of
`compile_widths` (None: every width) runs the same fixed-shape path through `torch.compile` instead (on CUDA it
replaces the runner's own graph capture: inductor captures its own); other widths and the prefill stay eager.

A fixed-shape step attends over part of the buffer, not all of it (on a CPU, attention over the whole buffer made
a compiled step as slow as an eager one). A captured CUDA graph's length is fixed, so there it is a bucket: the
smallest of 256, 512, 1024, ... (and max_cache_len itself) that holds the prefix and the step, one graph each. A
compiled step's attended length is a dynamic dimension of its graph (compiled.dynamic_slots), so one graph per width
serves every length, and a step attends over the prefix rounded up to SLOT_STEP slots: 320 slots over 300 cached
tokens, not 512.
"""

from __future__ import annotations

import os
import warnings

import torch

from headstart.eval.engine import compiled
from headstart.eval.engine.kv_cache import CacheFullError, KVCache
from headstart.eval.engine.masks import WindowMasks
from headstart.eval.engine.tree import Tree, chain_tree

SMALLEST_BUCKET = 256
# a compiled step's attended slots: the prefix and the step rounded up to this (a new length costs one forward to
# set up its buffers, no compilation); each slot attended costs a compiled step ~5 us (1 query) to ~10 us (4
# queries) on SmolLM2 float32 (AVX2, 2 threads): at 700 cached tokens 704 slots ran 3-7% faster than 1,024
SLOT_STEP = 64
# Transformers' SDPA path copies grouped K/V heads out to one per query head (`repeat_kv`) whenever a mask is
# given, a rule written for CUDA's kernels; torch's CPU kernels take grouped heads and a mask together
# (`enable_gqa`), which this switch of transformers' turns on. Every tree verify and fixed-shape step passes a
# mask: SmolLM2 (9 query / 3 K/V heads), 8 tokens over 900 cached, float32, AVX2, 2 threads: eager 198 -> 101 ms.
GROUPED_SDPA = "TRANSFORMERS_SDPA_FORCE_GQA"


def grouped_sdpa_on_cpu(device: torch.device) -> None:
    """Turn transformers' grouped-head SDPA on for this process when decoding on a CPU (a user's own setting of
    the variable wins)."""
    if device.type == "cpu":
        os.environ.setdefault(GROUPED_SDPA, "1")


def bucket(needed: int, max_cache_len: int) -> int:
    """The cache slots a fixed-shape step attends over: the smallest power of two >= SMALLEST_BUCKET that holds
    `needed` positions, or the whole buffer."""
    size = SMALLEST_BUCKET
    while size < needed:
        size *= 2
    return min(size, max_cache_len)


def attended(needed: int, max_cache_len: int, step: int | None) -> int:
    """The cache slots a fixed-shape step attends over: `needed` rounded up to `step` slots, or (None) its
    `bucket`."""
    if step is None:
        return bucket(needed, max_cache_len)
    return min(-(-needed // step) * step, max_cache_len)


class ModelRunner:
    def __init__(
        self,
        backbone,
        max_cache_len: int,
        cuda_graphs: bool = False,
        compile: str = "eager",
        compile_widths: set[int] | None = None,
    ) -> None:
        self.body = backbone.model.model  # HF base model: embeddings -> decoder layers -> final norm
        self.logits = backbone.logits  # lm_head, then the final soft cap of the families with one
        self.device, self.dtype = backbone.device, backbone.dtype
        self.cache = KVCache(backbone.config, max_cache_len, self.dtype, self.device)
        self.windows = WindowMasks(backbone.config)  # sliding-window layers: their part of a tree mask
        grouped_sdpa_on_cpu(self.device)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"  # fixed-shape steps, see module doc
        self.compiled = compiled.resolve(compile, self.device)
        # compiled on a CPU: any attended length, one graph (module docstring); on CUDA inductor captures a CUDA
        # graph per length, so buckets
        self.slot_step = SLOT_STEP if self.compiled and self.device.type == "cpu" else None
        # None: every width; others run eagerly (never a multi-minute compile in the middle of a run)
        self.compile_widths = compile_widths
        self._masks: dict[int, tuple[torch.Tensor, int]] = {}  # eager: width -> (mask buffer, tree column)
        # (width, last_only, slots attended) -> its step, or None where capture/compilation failed (eager)
        self._graphs: dict[tuple[int, bool, int], GraphedStep | None] = {}

    @property
    def fixed_shapes(self) -> bool:
        """Steps run at fixed shapes (CUDA graphs or compiled), so a decoder pads its trees to one width."""
        return self.cuda_graphs or self.compiled

    def compiles(self, width: int) -> bool:
        return self.compiled and (self.compile_widths is None or width in self.compile_widths)

    @property
    def length(self) -> int:
        return self.cache.length

    def check_room(self, q: int) -> None:
        if self.cache.length + q > self.cache.max_cache_len:
            raise CacheFullError(
                f"{self.cache.length} cached + {q} new positions exceed max_cache_len={self.cache.max_cache_len}. "
                "Fix: raise max_cache_len"
            )

    def _forward(self, ids, pos, mask, last_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if mask is not None:  # HF uses a 4-D mask as given: sliding-window layers need their window applied
            q, start = ids.shape[1], self.cache.length
            slots = self.cache.slots
            slots = torch.arange(start, start + q, device=self.device) if slots is None else slots
            mask = self.windows(mask, pos[0], slots)
        out = self.body(
            input_ids=ids, position_ids=pos, attention_mask=mask, cache=self.cache, use_cache=True
        )
        hidden = out.last_hidden_state[0]  # (q, H)
        return hidden, self.logits(hidden[-1:] if last_only else hidden)  # (q or 1, V)

    def prefill(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `ids` after the cached prefix (eager, any length). -> last hidden (H,), last logits (V,)."""
        self.check_room(len(ids))
        start = self.cache.length
        x = torch.tensor([ids], device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)[None]
        hidden, logits = self._forward(x, pos, None, last_only=True)
        self.cache.commit(len(ids))
        return hidden[-1], logits[0]

    def step(
        self, ids: torch.Tensor, tree: Tree | None = None, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward ids (q,) after the cache without committing them. `tree` None means a causal chain.
        -> hidden (q, H), logits (q, V) (or (1, V) for the last position when `last_only`)."""
        q = ids.shape[0]
        self.check_room(q)
        start = self.cache.length
        if self.cuda_graphs or self.compiles(q):
            graph = self._graph(q, last_only, attended(start + q, self.cache.max_cache_len, self.slot_step))
            if graph is not None:
                depth, bias = (tree or chain_tree(q - 1)).device_tensors(self.device, self.dtype)
                return graph.run(ids, depth, bias, start)
        if tree is None:  # HF builds the causal mask (none at all for q == 1)
            pos = torch.arange(start, start + q, device=self.device)[None]
            return self._forward(ids[None], pos, None, last_only)
        depth, bias = tree.device_tensors(self.device, self.dtype)
        return self._forward(ids[None], (depth + start)[None], self._tree_mask(bias, start), last_only)

    def _tree_mask(self, bias: torch.Tensor, start: int) -> torch.Tensor:
        """(1, 1, q, start + q) additive mask: 0 on the whole prefix, `bias` on the tree block. One buffer per
        width, updated in place: only the q columns written last time and the q new ones change."""
        q = bias.shape[0]
        buf, prev = self._masks.get(q, (None, 0))
        if buf is None:
            buf = torch.zeros((1, 1, q, self.cache.max_cache_len), dtype=self.dtype, device=self.device)
        elif prev != start:
            buf[0, 0, :, prev : prev + q] = 0.0  # the old tree block is prefix now (or beyond what is read)
        buf[0, 0, :, start : start + q] = bias
        self._masks[q] = (buf, start)
        return buf[:, :, :, : start + q]

    def _graph(self, width: int, last_only: bool, slots: int) -> GraphedStep | None:
        key = (width, last_only, slots)
        if key not in self._graphs:
            what = "compilation" if self.compiles(width) else "CUDA graph capture"
            try:
                self._graphs[key] = GraphedStep(self, width, last_only, self.compiles(width), slots)
            except Exception as e:  # noqa: BLE001 - any capture failure means: run this width eagerly
                warnings.warn(
                    f"{what} failed for width {width} over {slots} cache slots ({e}); running it eagerly",
                    stacklevel=2,
                )
                self._graphs[key] = None
        return self._graphs[key]


class GraphedStep:
    """One fixed-shape forward of `width` query tokens over the first `slots` cache slots (`attended`), from
    static input buffers; captured in a CUDA graph and replayed on CUDA, run eagerly elsewhere (so CPU tests
    cover the same path). `compile`: run it through the compiled forward instead (compiled.py), compiled here on
    a free slot range."""

    def __init__(self, runner: ModelRunner, width: int, last_only: bool, compile: bool, slots: int) -> None:
        dev, cache = runner.device, runner.cache
        start = cache.length  # warm-up and capture write into the free slots [start, start + width)
        self.runner, self.last_only = runner, last_only
        self.arange = torch.arange(width, device=dev)
        self.ids = torch.zeros((1, width), dtype=torch.long, device=dev)
        self.pos = (self.arange + start)[None].clone()
        self.slots = self.arange + start
        self.view = slots
        self.mask = torch.zeros((1, 1, width, slots), dtype=runner.dtype, device=dev)
        self.neg = torch.finfo(runner.dtype).min
        self.graph = None
        self.forward = runner._forward
        if compile:
            step = compiled.compiled_step(dev)
            self.forward = lambda ids, pos, mask, last_only: step(
                runner.body,
                runner.logits,
                cache,
                ids,
                pos,
                compiled.dynamic_slots(runner.windows(mask, pos[0], cache.slots)),
                last_only,
            )
            bias = torch.zeros((width, width), dtype=runner.dtype, device=dev)
            self.run(self.ids[0], self.arange, bias, start)  # compile now (into free slots), not mid-step
            return
        if dev.type != "cuda":
            return
        cache.slots, cache.view = self.slots, self.view
        try:
            stream = torch.cuda.Stream(dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up kernels/allocator outside the capture
                    runner._forward(self.ids, self.pos, self.mask, last_only)
            torch.cuda.current_stream(dev).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.hidden, self.logits = runner._forward(self.ids, self.pos, self.mask, last_only)
            self.graph = graph
        finally:
            cache.slots, cache.view = None, cache.max_cache_len

    def run(self, ids: torch.Tensor, depth: torch.Tensor, bias: torch.Tensor, start: int):
        width = self.ids.shape[1]
        self.ids[0].copy_(ids)
        torch.add(depth, start, out=self.pos[0])
        torch.add(self.arange, start, out=self.slots)
        mask = self.mask[0, 0]  # (width, S): prefix visible, tree block = bias, unused slots hidden
        mask.fill_(self.neg)
        mask[:, :start] = 0.0
        mask[:, start : start + width] = bias
        if self.graph is not None:
            self.graph.replay()
            return self.hidden, self.logits  # static buffers: valid until the next replay of this width
        cache = self.runner.cache
        cache.slots, cache.view = self.slots, self.view
        try:
            return self.forward(self.ids, self.pos, self.mask, self.last_only)
        finally:
            cache.slots, cache.view = None, cache.max_cache_len
