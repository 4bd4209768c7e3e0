"""Weight-only int8 drafter layers for decoding on CPU.

A drafter's decode step on CPU is bound by reading its weights from memory: EAGLE-3's (16,384 x 576) draft head
alone is 19 MB in bf16, read twice a step. Stored as int8 with one scale per output row (symmetric, per channel;
what gpt-fast and torchao call weight-only int8), the same projection reads half the bytes
(`torch._weight_int8pack_mm`, PyTorch's CPU kernel: bf16 / fp16 / fp32 activations, int8 weights). Decoding
stays lossless (the target verifies every drafted token); only which tokens are drafted can change, and the
eval measures that acceptance.

Measured on the 2-core CPU (the EAGLE-3 reference, depth 2 / 7 nodes / top-3, 12 dev prompts x 96 tokens, a
native and an int8 drafter in one process, prompts interleaved):
the draft step 10.0 -> 6.8 ms, the decode step 78.0 -> 73.6 ms, tau unchanged (1.81, 1.82). Medusa's residual
blocks gained nothing (2.5 ms a draft step either way: 576 x 576 weights, the projection is the frozen lm_head's
rows) and stay as trained. A draft LM gains most, every step reading all its weights: Qwen2.5-Coder-0.5B drafting
3 tokens for its 1.5B sibling, 279 -> 160 ms a step, 1.05x -> 1.29x over plain decoding (docs/results.md). The
kernel has no CUDA path, and on a GPU the draft step is bound by kernel
launches, not bytes: there the weights stay as trained.

On a CPU without native bf16 the same kernel is slower than the trained float32 weights: on a 2-core AVX2-only
AMD EPYC, one row through a (16,384 x 576) projection took 4.45 ms in int8 vs 2.18 ms in float32, the 0.5B draft
LM's (4,864 x 896) MLP rows 2.05 vs 0.45 ms, and an EAGLE-3 draft step 40.8 vs 12.6 ms (docs/results.md). So
`auto` times the drafter's largest layer both ways on the device before it quantizes anything, and keeps int8
only where it is faster (`int8_pays`).

    mode: "auto" (int8 on CPU where it times faster, as trained elsewhere) | "int8" (CPU only) | "native"
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

log = logging.getLogger("headstart.eval")

MODES = ("auto", "int8", "native")
# auto keeps int8 only when its projection takes at most this share of the trained weights' time
MIN_GAIN = 0.9
# the kernel's bf16 path needs in_features a multiple of 16 (100 crashed, 8 gave NaN); 32 for margin
ALIGN = 32


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights (out, in) and a per-row scale in the activations' dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(1).clamp_min(1e-12) / 127  # (out,)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (out, in), for code that reads a linear's dtype or rows; decoding never
        calls it (forward reads the int8 rows)."""
        return self.weight_int8.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).to(self.scale.dtype).contiguous()
        if rows.shape[0] == 0:
            y = rows.new_zeros(0, self.out_features)
        else:
            y = torch._weight_int8pack_mm(rows, self.weight_int8, self.scale)
        y = y.view(*lead, self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def quantizable(linear: nn.Module) -> bool:
    return type(linear) is nn.Linear and linear.in_features % ALIGN == 0


def quantize_linears(module: nn.Module, within: list[nn.Module] | None = None) -> int:
    """Replace, in place, every nn.Linear under `module` (and inside one of `within`, or itself one; default:
    all) whose shape the kernel takes by an Int8Linear -> how many were replaced."""
    keep = None if within is None else {id(m) for w in within for m in w.modules()}
    done = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if quantizable(child) and (keep is None or id(child) in keep):
                setattr(parent, name, Int8Linear(child))
                done += 1
    return done


def check_mode(mode: str, device: torch.device | str) -> None:
    if mode not in MODES:
        raise ValueError(f"draft_weights={mode!r}: expected one of {list(MODES)}")
    if mode == "int8" and torch.device(device).type != "cpu":
        raise ValueError(
            f"draft_weights=int8 on {device}: the int8 kernel runs on CPU only (on a GPU the draft step is "
            "launch-bound). Fix: draft_weights=auto or native"
        )


def for_decoding(drafter: nn.Module, device: torch.device | str, mode: str = "auto") -> str:
    """Quantize, in place, the layers the drafter names (`int8_modules()`) for decoding on `device` ->
    "int8" when any layer now is, else "native". Call it on a drafter loaded for decoding, never one
    being trained."""
    return _quantize(drafter, drafter.int8_modules(), device, mode, f"a {type(drafter).__name__}")


def for_draft_model(model: nn.Module, device: torch.device | str, mode: str = "auto") -> str:
    """The same for a draft LM named by the user (an HF causal LM, not a checkpoint's drafter): every projection,
    its lm_head included (a tied one gets its own int8 copy), as a DistillSpec draft's; its input embedding, read
    a row a token, stays as loaded. -> "int8" | "native"."""
    return _quantize(model, [model], device, mode, "this draft model")


def _quantize(module: nn.Module, targets: list[nn.Module], device, mode: str, what: str) -> str:
    check_mode(mode, device)
    if mode == "native" or torch.device(device).type != "cpu":
        return weights_of(module)
    if mode == "int8" and not targets:
        raise ValueError(f"draft_weights=int8: {what} has no layers served in int8. Fix: draft_weights=auto")
    if mode == "auto":
        layers = [m for t in targets for m in t.modules() if quantizable(m)]
        pays, why = int8_pays(layers)
        log.info("draft_weights=auto: %s (%s)", "int8" if pays else "native", why)
        if not pays:
            return weights_of(module)
    quantize_linears(module, targets)
    return weights_of(module)


def int8_pays(layers: list[nn.Linear]) -> tuple[bool, str]:
    """Whether int8 weights make these layers faster on this CPU -> (pays, why): one row through the largest
    of them, int8 against its trained weights, each timed as the best of a few runs (about a second at most)."""
    if not layers:
        return False, "no layer the kernel takes"
    big = max(layers, key=lambda m: m.weight.numel())
    native, int8 = time_projection(big)
    ratio = int8 / native
    shape = f"{big.out_features} x {big.in_features}"
    return (
        ratio <= MIN_GAIN,
        f"one row through the {shape} layer: int8 {ratio:.2f}x the time of {big.weight.dtype}",
    )


@torch.inference_mode()
def time_projection(linear: nn.Linear, runs: int = 5) -> tuple[float, float]:
    """(seconds for one row through `linear` as trained, through its int8 copy): the best of `runs` each."""
    x = torch.randn(1, linear.in_features, dtype=linear.weight.dtype, device=linear.weight.device)
    out = []
    for layer in (linear, Int8Linear(linear)):
        layer(x)  # first call: kernel selection, packing
        best = float("inf")
        for _ in range(runs):
            start = time.perf_counter()
            layer(x)
            best = min(best, time.perf_counter() - start)
        out.append(best)
    return out[0], out[1]


def weights_of(drafter: nn.Module) -> str:
    """ "int8" when any of the drafter's layers is an Int8Linear, else "native" (what decoding.json records)."""
    return "int8" if any(isinstance(m, Int8Linear) for m in drafter.modules()) else "native"
