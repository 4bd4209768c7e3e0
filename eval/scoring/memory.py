"""Memory overhead of a decoding method beside vanilla decoding, measured per side in one process.

A side's peak memory while it decodes = what it holds (the target's weights and preallocated KV cache, which
every side of a run shares in size, plus the drafter's weights and the state its proposer keeps between steps)
+ the peak of the tensors allocated during one decode above what existed before it (activations, logits, tree
masks). Overhead = that peak minus vanilla's.

Why not the process's peak resident set: `getrusage(...).ru_maxrss` is process-wide and never goes down, so
the side measured second inherits the first one's peak, and freed memory stays in the C heap. Instead:
- held bytes are counted from the tensors themselves: parameters and buffers of the modules the proposer
  reaches (a Medusa / EAGLE drafter, a draft LM), other tensors it reaches (a draft LM's or EAGLE's KV cache),
  each storage once and none that the target owns (a drafter sharing the target's lm_head adds nothing), plus
  `state_bytes()` for state kept in Python objects (lookahead's n-gram pool);
- the decode's transient peak is tracked per allocation: on CUDA the caching allocator's peak
  (`max_memory_allocated` after a reset), on CPU the torch profiler's raw allocation events (`profile_memory`)
  replayed in time order. Memory outside torch tensors (the Python heap, allocator slack) is not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

GB = 1e9
_WALKED = ("headstart.", "transformers.cache_utils")  # objects whose attributes may hold a proposer's tensors


@dataclass
class MemoryUse:
    """One side's memory, in bytes."""

    target_bytes: int  # the target's parameters + buffers
    cache_bytes: int  # the target's preallocated KV cache
    drafter_bytes: int  # parameters + buffers the proposer adds (drafter heads, a draft LM); 0 for vanilla
    state_bytes: int  # kept between steps beyond weights: a draft KV cache, an n-gram pool
    transient_bytes: int  # peak tensor allocations during one decode, above what existed before it
    tracked_by: str  # how the transient peak was tracked

    @property
    def peak_bytes(self) -> int:
        return (
            self.target_bytes
            + self.cache_bytes
            + self.drafter_bytes
            + self.state_bytes
            + self.transient_bytes
        )

    def as_report(self) -> dict:
        return {**asdict(self), "peak_bytes": self.peak_bytes, "peak_gb": self.peak_bytes / GB}


def _storages(tensors) -> dict[int, int]:
    """data pointer -> bytes of each distinct storage behind `tensors` (views share one)."""
    out = {}
    for t in tensors:
        s = t.untyped_storage()
        out[s.data_ptr()] = s.nbytes()
    return out


def module_bytes(module: torch.nn.Module) -> int:
    """Parameters + buffers of a module, each storage once (tied weights count once)."""
    return sum(_storages([*module.parameters(), *module.buffers()]).values())


def _reach(obj, modules: list, tensors: list, stateful: list, seen: set[int], depth: int = 0) -> None:
    """Collect the modules, loose tensors and `state_bytes()` owners reachable from a proposer's attributes."""
    if id(obj) in seen or depth > 8:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        modules.append(obj)
    elif isinstance(obj, torch.Tensor):
        tensors.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _reach(v, modules, tensors, stateful, seen, depth + 1)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _reach(v, modules, tensors, stateful, seen, depth + 1)
    elif type(obj).__module__.startswith(_WALKED):
        if callable(getattr(obj, "state_bytes", None)):
            stateful.append(obj)
        for v in vars(obj).values() if hasattr(obj, "__dict__") else ():
            _reach(v, modules, tensors, stateful, seen, depth + 1)


def proposer_bytes(proposer, target: torch.nn.Module, target_cache: torch.Tensor) -> tuple[int, int]:
    """(drafter bytes, state bytes) a proposer holds beyond the target's weights and KV cache (module doc)."""
    if proposer is None:
        return 0, 0
    modules, tensors, stateful = [], [], []
    _reach(proposer, modules, tensors, stateful, set())
    owned = set(_storages([*target.parameters(), *target.buffers(), target_cache]))
    weights = _storages(t for m in modules for t in (*m.parameters(), *m.buffers()))
    weights = {p: n for p, n in weights.items() if p not in owned}
    state = {p: n for p, n in _storages(tensors).items() if p not in owned and p not in weights}
    return sum(weights.values()), sum(state.values()) + sum(s.state_bytes() for s in stateful)


def _cpu_transient(run) -> int:
    """Peak of torch's CPU tensor allocations while `run()` executes: the profiler's raw allocation events
    ("[memory]": +bytes allocated, -bytes freed) replayed in time order. Frees of tensors allocated before the
    start count too, so the running level may dip below zero; the peak is the highest level above the start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    level = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def transient_peak(run, device: torch.device) -> tuple[int, str]:
    """(peak bytes allocated by `run()` above what was allocated before it, how it was tracked)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, "cuda max_memory_allocated"
    return _cpu_transient(run), "torch profiler (CPU tensor allocations)"


def measure_memory(decoder, ids: list[int], max_new_tokens: int, eos: list[int]) -> MemoryUse:
    """One untimed greedy decode of `ids` through `decoder`, tracked; the held bytes counted from tensors."""
    backbone = decoder.backbone

    def run() -> None:
        decoder.generate(ids, max_new_tokens, temperature=0.0, eos_token_ids=eos)

    run()  # the first call builds per-width buffers (masks): steady-state steps are what is measured
    transient, how = transient_peak(run, decoder.device)
    # after a decode: what the proposer keeps has grown to its size at the end of one answer (a filled pool)
    drafter, state = proposer_bytes(decoder.proposer, backbone.model, decoder.runner.cache.kv)
    return MemoryUse(
        target_bytes=module_bytes(backbone.model),
        cache_bytes=sum(_storages([decoder.runner.cache.kv]).values()),
        drafter_bytes=drafter,
        state_bytes=state,
        transient_bytes=transient,
        tracked_by=how,
    )


def memory_report(side: MemoryUse, vanilla: MemoryUse) -> dict:
    """A report's `memory` entry: both sides in bytes and peak GB, and the overhead in GB."""
    return {
        "vanilla": vanilla.as_report(),
        "spec": side.as_report(),
        "overhead_gb": (side.peak_bytes - vanilla.peak_bytes) / GB,
        "drafter_gb": side.drafter_bytes / GB,
        "state_gb": side.state_bytes / GB,
    }
