"""Compiled target forwards: each fixed-shape decode step of a `ModelRunner` through `torch.compile`.

On a CPU without native bf16 (AVX2 only), MKL's small-M GEMMs reach a fraction of the peak, so a verify of 8 tokens
costs about twice a plain step. Inductor's max-autotune benchmarks its own vectorized micro-GEMMs over weights
prepacked at compile time (`freezing`: the frozen backbone's weights become constants) against MKL and keeps the
faster per projection. Every step runs at a fixed width over part of the cache (static write slots and a
(1, 1, width, slots) mask over the cache's first `slots` slots: `KVCache`'s static mode, the lengths in
runner.py); the slots attended are a dynamic dimension of the graph (`dynamic_slots`), so each (width, last_only)
is one graph that no later step recompiles, whatever the cache length. Measured on SmolLM2-135M float32 (AVX2):
as fast as graphs specialized to each length (docs/results.md), and a graph, with its copy of the weights, per
width instead of per width and length.

Modes (`compile=` on the Decoder / eval config):
- eager: the HF forward as is (the default; compiling costs minutes per width the first time);
- max-autotune: CPU: inductor's "max-autotune-no-cudagraphs" with freezing; CUDA: "max-autotune" (inductor
  captures CUDA graphs itself). Fails with one line where inductor cannot run (no C++ compiler, no triton);
- auto: max-autotune where inductor can run, else eager (said once in the log);
- hardware (the eval's, resolved by `for_hardware` once the compute dtype is known): auto on a CPU computing
  float32 (no native bf16: eager verify steps of 2-8 tokens cost 2-3 plain steps there, compiled ones about one),
  eager where eager steps already pay (native bf16 on a CPU) or where compiling was not measured (CUDA).

Compilation happens on a width's first step. In this process it is cached by dynamo (shared by every runner over
the same backbone module, so a second Decoder on it recompiles nothing). On disk, under $HEADSTART_CACHE/inductor
unless TORCHINDUCTOR_CACHE_DIR is set, inductor keeps its compiled C++ kernels and autotuning results; a graph with
frozen weights bypasses inductor's FX-graph cache, though, so another process traces and lowers each width again
(about 5 min a width for SmolLM2-135M on a busy 2-core AVX2 CPU). A width that fails to compile runs eagerly, with
a warning. Greedy output is checked equal to eager vanilla, token for token
(tests/eval/test_compiled.py); inductor's GEMMs sum in another order than MKL, so logits differ in the last bits.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import psutil  # accelerate's dependency
import torch

log = logging.getLogger("headstart.eval")

COMPILE_MODES = ("eager", "auto", "max-autotune")
HARDWARE = "hardware"  # the eval's mode chosen from the device and the compute dtype (`for_hardware`)
EVAL_MODES = (*COMPILE_MODES, HARDWARE)  # what the eval config accepts
# dynamo keeps every graph of `_step` in one per-code cache: (width, last_only) pairs times backbones pass its
# default limit of 8, after which it would silently run eagerly
_RECOMPILE_LIMIT = 64


def check_mode(mode: str) -> None:
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r}: expected one of {list(COMPILE_MODES)}. Fix: compile=eager")


def unavailable(device: torch.device) -> str | None:
    """Why inductor cannot compile for `device` here, or None when it can."""
    if device.type == "cpu":
        found = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
        return None if found else "no C++ compiler"
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed"
        return None
    return f"inductor does not compile for device type {device.type!r}"


# Resident memory a compiled CPU graph keeps, in multiples of the weights' bytes: freezing puts a prepacked copy
# of the weights into every graph, and inductor does not give it back (SmolLM2-135M float32, 0.54 GB of weights:
# +1.5 GB a graph while it compiles, 0.9 GB still resident after torch._dynamo.reset() and malloc_trim); and the
# graphs an eval builds, one per step width: vanilla's, the drafter's two, a baseline's, the tuner's timing widths
# and its finalists' (the main job's eval without its tuner, 4 graphs: 5.4 GB resident at its peak)
GRAPH_WEIGHT_COPIES, EVAL_GRAPHS = 1.7, 10


def for_hardware(
    device: torch.device, dtype: str, weight_bytes: int = 0, available: int | None = None
) -> tuple[str, str]:
    """compile=hardware: (the mode steps on `device` in `dtype` run with, why). Measured on SmolLM2-135M, 2
    threads (docs/results.md): under AVX2 kernels in float32 a compiled plain step ran 2.0x eager and the main
    job's heads 1.39x compiled vanilla where eager chose plain decoding; on an AMX Xeon in bf16 the eager heads
    ran 1.56x eager vanilla, and a compiled eval took 1.5x the eager one's time for half the prompts. Eager, too,
    where the graphs' copies of `weight_bytes` would not fit in 80% of the `available` memory (None: what the
    system reports now)."""
    if device.type == "cpu" and dtype == "float32":
        need = weight_bytes * GRAPH_WEIGHT_COPIES * EVAL_GRAPHS
        free = psutil.virtual_memory().available if available is None else available
        if need > 0.8 * free:
            return "eager", (
                f"float32 on a CPU, but compiled steps would keep ~{need / 1e9:.0f} GB resident (a prepacked copy "
                f"of the {weight_bytes / 1e9:.1f} GB of weights in each of ~{EVAL_GRAPHS} graphs) of "
                f"{free / 1e9:.0f} GB available: eager steps (compile=auto forces them)"
            )
        return (
            "auto",
            "float32 on a CPU: eager verify steps of a few tokens cost 2-3 plain steps, compiled ~1",
        )
    if device.type == "cpu":
        return "eager", f"{dtype} on a CPU: eager verify steps cost about one plain step already"
    return "eager", f"compiled decoding is not measured on {device.type} (compile=auto compiles)"


def resolve(mode: str, device: torch.device) -> bool:
    """Whether steps on `device` are compiled under `mode`."""
    check_mode(mode)
    if mode == "eager":
        return False
    problem = unavailable(device)
    if problem is None:
        return True
    if mode == "auto":
        log.info("compile=auto: eager decoding on %s (%s)", device, problem)
        return False
    raise ValueError(f"compile={mode} on {device}: {problem}. Fix: compile=eager (or auto)")


def inductor_options(device: torch.device) -> dict:
    """CPU: max-autotune without CUDA graphs, weights frozen into the graph; CUDA: the ordinary max-autotune."""
    import torch._inductor as inductor

    # the autotuner's per-GEMM tables go to stderr (hundreds of lines a compiled eval); its choices stay the same
    quiet = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
    if device.type == "cuda":
        return {**inductor.list_mode_options("max-autotune"), **quiet}
    return {**inductor.list_mode_options("max-autotune-no-cudagraphs"), "freezing": True, **quiet}


def cache_dir() -> Path:
    """Where inductor keeps compiled graphs and autotuning results across processes: TORCHINDUCTOR_CACHE_DIR
    when the user set it, else $HEADSTART_CACHE/inductor. Inductor writes its own /tmp default into that
    variable on first use (some imports trigger it), so a value equal to that default counts as unset."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    mine = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if mine and os.path.abspath(mine) != os.path.abspath(default_cache_dir()):
        return Path(mine)
    root = os.environ.get("HEADSTART_CACHE") or Path.home() / ".cache" / "headstart"
    return Path(root) / "inductor"


def _step(body, logits, cache, ids, pos, mask, last_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ModelRunner._forward, as one graph: the cache's static write slots and the sliding-window masks are set
    by the caller; `logits` is the backbone's (lm_head, then the soft cap of the families with one). The cache
    slots attended are the mask's width, a dimension of the graph (`dynamic_slots`): one graph per step width
    serves every cache-length bucket."""
    cache.view = next(iter(mask.values())).shape[-1] if isinstance(mask, dict) else mask.shape[-1]
    out = body(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True)
    hidden = out.last_hidden_state[0]  # (q, H)
    return hidden, logits(hidden[-1:] if last_only else hidden)  # (q or 1, V)


def dynamic_slots(mask: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
    """`mask` (or each of a family's masks by layer type), its last dimension (the cache slots attended) marked
    dynamic for the compiled step: a step over the next bucket then reuses the graph instead of compiling another
    (each keeps a prepacked copy of the weights, see GRAPH_WEIGHT_COPIES)."""
    for m in mask.values() if isinstance(mask, dict) else (mask,):
        torch._dynamo.maybe_mark_dynamic(m, 3)
    return mask


_COMPILED: dict[tuple[str, str], Callable] = {}  # (function, device type) -> its compiled version


def compiled_step(device: torch.device) -> Callable:
    """The compiled `_step` for `device`; the first call of each new shape compiles it (minutes on a CPU)."""
    return compiled_function(_step, device)


def compiled_function(fn: Callable, device: torch.device) -> Callable:
    """`fn` through torch.compile with this module's options for `device` (one graph per input shape and per
    module passed in; modules' weights frozen into the graph on a CPU); the first call of each compiles it."""
    key = (f"{fn.__module__}.{fn.__qualname__}", device.type)
    if key not in _COMPILED:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir())  # read by inductor on each cache access
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, _RECOMPILE_LIMIT)
        options = inductor_options(device)
        step = torch.compile(fn, fullgraph=True, dynamic=False, options=options)  # one graph per shape
        _COMPILED[key] = _with_freezing(step) if options.get("freezing") else step
    return _COMPILED[key]


def _with_freezing(step: Callable) -> Callable:
    """Dynamo reads inductor's global `freezing` while it traces, to keep the weights as constants rather than
    graph inputs; `options` reach inductor only after tracing, so without this the weights stay inputs and the
    GEMMs stay MKL's."""
    import torch._inductor.config as inductor_config

    def run(*args):
        with inductor_config.patch(freezing=True):
            return step(*args)

    return run
