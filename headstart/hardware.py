"""The compute dtype from the hardware, and the facts every figure should name.

`dtype=auto` (the default of backbone.dtype, train.mixed_precision, the eval and the vLLM runs) resolves to
bfloat16 where the device computes it natively: CUDA with bf16 (compute capability 8.0+), x86 CPUs with AMX or
AVX512_BF16, ARM CPUs with the BF16 extension. float16 on CUDA without bf16 (T4, V100). float32 otherwise: on an
AVX2-only CPU bf16 is emulated (a 576x1536 matmul costs 13x fp32 for one row, 71x for 64), so asking for it there
runs, with one warning that names the cost and the fix.

What the device offers is read once into a `Capabilities` (from torch and /proc/cpuinfo), so tests can hand
`resolve_dtype` any machine without owning it.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from dataclasses import dataclass, field
from functools import cache

import torch

log = logging.getLogger("headstart.hardware")

DTYPE_NAMES = ("float32", "bfloat16", "float16")
AUTO = "auto"
# train.mixed_precision (accelerate's names) for each compute dtype
MIXED_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}
# x86 flags of native bf16 / fp16 matmuls (AMX tiles, AVX-512 dot products); ARM: the `bf16` / `fphp` features
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
CPU_FP16_FLAGS = ("amx_fp16", "avx512_fp16", "fphp")
# the x86 ones need AVX-512 kernels: torch dispatching AVX2 (ATEN_CPU_CAPABILITY=avx2) or oneDNN capped below them
# (ONEDNN_MAX_CPU_ISA=AVX2) computes bf16 as an AVX2-only CPU does, emulated
X86_NATIVE_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "amx_fp16", "avx512_fp16"})


@dataclass(frozen=True)
class Capabilities:
    """What one device computes natively. `kind`: cpu | cuda | mps; `cuda_bf16`: torch.cuda.is_bf16_supported
    without emulation; `isa`: torch.backends.cpu.get_cpu_capability() (AVX2, AVX512, SVE256, ...); `cpu_flags`:
    the /proc/cpuinfo flags (x86) or Features (ARM) that matter here and the kernels can use; `unused`: why the
    CPU's other native flags are not (see `usable_flags`), empty when none are dropped."""

    kind: str = "cpu"
    cuda_bf16: bool = False
    isa: str = ""
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    unused: str = ""

    def native(self, dtype: str) -> bool:
        if dtype == "float32":
            return True
        if self.kind == "cuda":
            return dtype == "float16" or self.cuda_bf16
        if self.kind == "cpu":
            return bool(self.cpu_flags & set(CPU_BF16_FLAGS if dtype == "bfloat16" else CPU_FP16_FLAGS))
        return False  # mps and others: fp32 until measured

    def describe(self) -> str:
        """e.g. 'CUDA (bf16)', 'CPU AVX2 (no native bf16)', 'CPU AVX512 (amx_bf16)'."""
        if self.kind == "cuda":
            return f"CUDA ({'bf16' if self.cuda_bf16 else 'no bf16: fp16'})"
        if self.kind != "cpu":
            return self.kind.upper()
        bf16 = sorted(self.cpu_flags & set(CPU_BF16_FLAGS))
        unused = f"; {self.unused}" if self.unused else ""
        return f"CPU {self.isa or '?'} ({', '.join(bf16) if bf16 else 'no native bf16'}{unused})"


@dataclass(frozen=True)
class DtypeChoice:
    """A resolved dtype: `dtype` (float32 | bfloat16 | float16), what was asked (`requested`) and why."""

    dtype: str
    requested: str
    reason: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def mixed_precision(self) -> str:
        return MIXED_PRECISION[self.dtype]

    def record(self) -> dict:
        return {"requested": self.requested, "resolved": self.dtype, "reason": self.reason}


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The native-bf16/fp16 flags among /proc/cpuinfo's `flags` (x86) or `Features` (ARM) lines."""
    wanted = set(CPU_BF16_FLAGS + CPU_FP16_FLAGS)
    found: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            found |= wanted & set(value.split())
    return frozenset(found)


@cache  # read once a process: device names key the tuner's records, read on every match
def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:  # macOS, Windows: torch's own probes below still answer for x86
        return ""


def usable_flags(
    flags: frozenset[str], isa: str, onednn_max_isa: str | None = None
) -> tuple[frozenset[str], str]:
    """The native-dtype flags the kernels can use -> (flags, why the others are not: "" when all are). x86's bf16
    and fp16 instructions are AVX-512 ones: with torch dispatching below AVX-512 (`isa`, ATEN_CPU_CAPABILITY) or
    oneDNN capped below them (ONEDNN_MAX_CPU_ISA), bf16 runs emulated, as on an AVX2-only CPU."""
    x86 = flags & X86_NATIVE_FLAGS
    if not x86:
        return flags, ""
    cap = (onednn_max_isa or "ALL").upper()
    onednn_native = (
        cap in ("ALL", "DEFAULT") or cap.startswith("AVX10") or any(s in cap for s in ("BF16", "AMX", "FP16"))
    )
    if not isa.upper().startswith("AVX512"):
        why = f"torch dispatches {isa or '?'} kernels"
    elif not onednn_native:
        why = f"ONEDNN_MAX_CPU_ISA={cap}"
    else:
        return flags, ""
    return flags - x86, f"{', '.join(sorted(x86))} unused: {why}"


@cache
def _cpu_capabilities() -> Capabilities:
    flags = set(cpu_flags(_read_cpuinfo()))
    probes = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}
    for flag, name in probes.items():  # torch's CPUID probes (private; absent in older torch)
        probe = getattr(torch.cpu, name, None)
        if probe is not None and probe():
            flags.add(flag)
    isa = torch.backends.cpu.get_cpu_capability()
    usable, unused = usable_flags(frozenset(flags), isa, os.environ.get("ONEDNN_MAX_CPU_ISA"))
    return Capabilities("cpu", isa=isa, cpu_flags=usable, unused=unused)


def capabilities(device: torch.device | str = "cpu") -> Capabilities:
    device = torch.device(device)
    if device.type == "cuda":
        if (
            not torch.cuda.is_available()
        ):  # CUDA named (e.g. vLLM's own venv) but not in this torch: no bf16 claim
            return Capabilities("cuda")
        try:
            bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.4 has no including_emulation (and reported native support only)
            bf16 = torch.cuda.is_bf16_supported()
        return Capabilities("cuda", cuda_bf16=bool(bf16))
    if device.type == "cpu":
        return _cpu_capabilities()
    return Capabilities(device.type)


def resolve_dtype(
    requested: str,
    device: torch.device | str = "cpu",
    caps: Capabilities | None = None,
    setting: str = "dtype",
) -> DtypeChoice:
    """`requested`: auto | float32 | bfloat16 | float16 -> the dtype to compute in on `device`, with the reason.
    An explicit dtype the device only emulates is kept, with one warning (per process and dtype) naming the cost
    and the fix; `setting` is the key the user set (backbone.dtype, dtype, --dtype)."""
    if requested != AUTO and requested not in DTYPE_NAMES:
        raise ValueError(f"{setting}={requested!r}: expected auto or one of {list(DTYPE_NAMES)}")
    caps = caps or capabilities(device)
    where = caps.describe()
    if requested != AUTO:
        if not caps.native(requested):
            _warn_emulated(setting, requested, where, _auto(caps))
        return DtypeChoice(requested, requested, f"{setting}={requested} set explicitly, on {where}")
    return DtypeChoice(_auto(caps), AUTO, _auto_reason(caps))


def _auto(caps: Capabilities) -> str:
    if caps.native("bfloat16"):
        return "bfloat16"
    return "float16" if caps.kind == "cuda" else "float32"


def _auto_reason(caps: Capabilities) -> str:
    where = caps.describe()
    if caps.native("bfloat16"):
        return f"auto: {where} computes bf16 natively"
    if caps.kind == "cuda":
        return f"auto: {where} has no native bf16, fp16 is native"
    return f"auto: {where}: bf16 would be emulated there, its matmuls 13-70x slower than float32"


def resolve_mixed_precision(
    requested: str, device: torch.device | str = "cpu", caps: Capabilities | None = None
):
    """train.mixed_precision: auto -> bf16 | fp16 | no as `resolve_dtype` picks for `device`; an explicit value is
    kept (bf16 / fp16 autocast on a device that emulates it warns once). -> (value, reason)."""
    names = {v: k for k, v in MIXED_PRECISION.items()}
    if requested != AUTO and requested not in names:
        raise ValueError(f"train.mixed_precision={requested!r}: expected auto, no, bf16 or fp16")
    choice = resolve_dtype(names.get(requested, AUTO), device, caps, setting="train.mixed_precision")
    reason = choice.reason if requested == AUTO else f"train.mixed_precision={requested} set explicitly"
    return choice.mixed_precision, reason


_warned: set[str] = set()
_announced: set[str] = set()


def announce(setting: str, choice: DtypeChoice) -> None:
    """Say once per process (per dtype) which dtype was chosen and why, in one line."""
    if (
        choice.dtype not in _announced
    ):  # the first word wins: a later call with the resolved value adds nothing
        _announced.add(choice.dtype)
        log.info("%s: %s (%s)", setting, choice.dtype, choice.reason)


def _warn_emulated(setting: str, dtype: str, where: str, auto: str) -> None:
    if dtype in _warned:  # once per process, whichever setting asked for it
        return
    _warned.add(dtype)
    log.warning(
        "%s=%s on %s: %s is emulated here, its matmuls run ~13-70x slower than float32. Fix: %s=auto (%s on "
        "this device)",
        setting, dtype, where, dtype, setting, auto,
    )  # fmt: skip


def cpu_model(cpuinfo: str | None = None) -> str:
    for line in (cpuinfo if cpuinfo is not None else _read_cpuinfo()).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def blas(config: str | None = None) -> str:
    """The BLAS torch was built with, from torch.__config__.show(): 'MKL 2024.2', 'openblas', 'accelerate'."""
    config = config if config is not None else torch.__config__.show()
    if m := re.search(r"Math Kernel Library Version ([\d.]+)", config):
        return f"MKL {m.group(1)}"
    if m := re.search(r"BLAS_INFO=(\w+)", config):
        return m.group(1)
    return "unknown BLAS"


def machine_facts(device: torch.device | str = "cpu") -> dict:
    """What a figure was measured on: CPU model, ISA level, native bf16 flags, BLAS, threads, device name."""
    device = torch.device(device)
    caps = capabilities("cpu")
    facts = {
        "cpu": cpu_model(),
        "isa": caps.isa,
        "cpu_bf16": sorted(caps.cpu_flags & set(CPU_BF16_FLAGS)),
        "blas": blas(),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "device": str(device),
        "device_name": _cuda_name(device) if device.type == "cuda" else cpu_model(),
        "torch": torch.__version__,
    }
    if caps.unused:  # kernels capped below the CPU's (an emulated machine): say so beside every figure
        facts["unused"] = caps.unused
    return facts


def _cuda_name(device: torch.device) -> str:
    try:
        return torch.cuda.get_device_name(device)
    except (AssertionError, RuntimeError):  # a torch built without CUDA: the name is unknown, not an error
        return "CUDA device"


def machine_line(facts: dict, dtype: str) -> str:
    """One line naming the machine, for a report header or a benchmark's first line."""
    bf16 = ", ".join(facts["cpu_bf16"]) or "no native bf16"
    bf16 += f"; {facts['unused']}" if facts.get("unused") else ""
    where = facts["device_name"] if facts["device"].startswith("cuda") else facts["device"]
    return (
        f"machine: {facts['cpu']} ({facts['isa']}, {bf16}), {facts['blas']}, {facts['threads']} threads of "
        f"{facts['cores']} cores, {where}, {dtype}, torch {facts['torch']}"
    )
