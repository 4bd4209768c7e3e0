"""`dtype=auto` from the hardware (headstart/hardware.py), on machines described by hand: each resolves to the
dtype it computes natively, says why in one line, and an explicit bf16 where it is emulated warns once."""

from __future__ import annotations

import logging

import pytest

from headstart import hardware
from headstart.hardware import (
    Capabilities,
    blas,
    cpu_flags,
    cpu_model,
    resolve_dtype,
    resolve_mixed_precision,
    usable_flags,
)

AMX = Capabilities("cpu", isa="AVX512", cpu_flags=frozenset({"amx_bf16", "avx512_bf16"}))
AVX512_BF16 = Capabilities("cpu", isa="AVX512", cpu_flags=frozenset({"avx512_bf16"}))
AVX2 = Capabilities("cpu", isa="AVX2")
ARM_BF16 = Capabilities("cpu", isa="SVE256", cpu_flags=frozenset({"bf16"}))
ARM_NO_BF16 = Capabilities("cpu", isa="DEFAULT")
CUDA_BF16 = Capabilities("cuda", cuda_bf16=True)
CUDA_FP16 = Capabilities("cuda", cuda_bf16=False)  # T4, V100

# cpuinfo excerpts as the kernel writes them (one core each)
XEON_AMX = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
EPYC_AVX2 = """processor\t: 0
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse2 avx avx2 fma
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp sve svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
"""


@pytest.fixture(autouse=True)
def _fresh_once_sets():
    """Every test starts as a fresh process would: nothing warned or announced yet."""
    hardware._warned.clear()
    hardware._announced.clear()
    yield
    hardware._warned.clear()
    hardware._announced.clear()


@pytest.mark.parametrize(
    "caps, dtype, precision",
    [
        (AMX, "bfloat16", "bf16"),
        (AVX512_BF16, "bfloat16", "bf16"),
        (AVX2, "float32", "no"),
        (ARM_BF16, "bfloat16", "bf16"),
        (ARM_NO_BF16, "float32", "no"),
        (CUDA_BF16, "bfloat16", "bf16"),
        (CUDA_FP16, "float16", "fp16"),
        (Capabilities("mps"), "float32", "no"),
    ],
    ids=["amx", "avx512_bf16", "avx2", "arm_bf16", "arm", "cuda_bf16", "cuda_fp16", "mps"],
)
def test_auto_resolves_to_the_native_dtype(caps, dtype, precision, caplog):
    with caplog.at_level(logging.WARNING, "headstart"):
        choice = resolve_dtype("auto", caps=caps)
        assert resolve_mixed_precision("auto", caps=caps)[0] == precision
    assert (choice.dtype, choice.requested) == (dtype, "auto")
    assert choice.reason.startswith("auto: ") and caps.describe() in choice.reason
    assert choice.record() == {"requested": "auto", "resolved": dtype, "reason": choice.reason}
    assert not caplog.records  # auto never warns


def test_avx512_bf16_kernels_capped_below_it_are_not_native():
    """An AVX-512 BF16 CPU with torch dispatching AVX2 (ATEN_CPU_CAPABILITY=avx2) or oneDNN capped at AVX2 runs bf16
    emulated, as an AVX2-only CPU does: auto picks float32 and says which setting capped it."""
    flags = frozenset({"avx512_bf16", "amx_bf16"})
    assert usable_flags(flags, "AVX512") == (flags, "")
    assert usable_flags(flags, "AVX512", "avx512_core_amx") == (flags, "")
    assert usable_flags(flags, "AVX2") == (
        frozenset(),
        "amx_bf16, avx512_bf16 unused: torch dispatches AVX2 kernels",
    )
    assert usable_flags(flags, "AVX512", "avx2")[1] == "amx_bf16, avx512_bf16 unused: ONEDNN_MAX_CPU_ISA=AVX2"
    assert usable_flags(frozenset({"bf16"}), "DEFAULT") == (frozenset({"bf16"}), "")  # ARM: not x86's rule
    usable, unused = usable_flags(flags, "AVX2")
    capped = Capabilities("cpu", isa="AVX2", cpu_flags=usable, unused=unused)
    choice = resolve_dtype("auto", caps=capped)
    assert choice.dtype == "float32" and "torch dispatches AVX2 kernels" in choice.reason


def test_the_reason_names_what_decided():
    assert "amx_bf16" in resolve_dtype("auto", caps=AMX).reason
    assert "no native bf16" in resolve_dtype("auto", caps=AVX2).reason
    assert "fp16 is native" in resolve_dtype("auto", caps=CUDA_FP16).reason


def test_explicit_bf16_on_avx2_runs_and_warns_once(caplog):
    with caplog.at_level(logging.WARNING, "headstart"):
        first = resolve_dtype("bfloat16", caps=AVX2, setting="backbone.dtype")
        again = resolve_dtype("bfloat16", caps=AVX2, setting="dtype")  # another setting, same process
        mixed = resolve_mixed_precision("bf16", caps=AVX2)
    assert first.dtype == again.dtype == "bfloat16" and mixed[0] == "bf16"  # kept: it runs
    [warning] = caplog.records
    msg = warning.getMessage()
    assert "backbone.dtype=bfloat16" in msg and "emulated" in msg and "13-70x slower" in msg
    assert "Fix: backbone.dtype=auto (float32 on this device)" in msg


@pytest.mark.parametrize("caps", [AMX, ARM_BF16, CUDA_BF16], ids=["amx", "arm_bf16", "cuda_bf16"])
def test_explicit_bf16_where_native_does_not_warn(caps, caplog):
    with caplog.at_level(logging.WARNING, "headstart"):
        assert resolve_dtype("bfloat16", caps=caps).dtype == "bfloat16"
        assert resolve_dtype("float32", caps=caps).dtype == "float32"
    assert not caplog.records


def test_explicit_bf16_on_a_cuda_without_it_names_fp16_as_the_fix(caplog):
    with caplog.at_level(logging.WARNING, "headstart"):
        resolve_dtype("bfloat16", caps=CUDA_FP16, setting="dtype")
    assert "Fix: dtype=auto (float16 on this device)" in caplog.records[0].getMessage()


def test_the_choice_is_said_once_in_one_line(caplog):
    with caplog.at_level(logging.INFO, "headstart"):
        choice = resolve_dtype("auto", caps=AVX2)
        hardware.announce("backbone.dtype", choice)
        hardware.announce("backbone.dtype", resolve_dtype("float32", caps=AVX2))  # the resolved value again
    [line] = [r.getMessage() for r in caplog.records]
    assert line == f"backbone.dtype: float32 ({choice.reason})"


def test_bad_values_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"backbone.dtype='bf16': expected auto or one of"):
        resolve_dtype("bf16", caps=AVX2, setting="backbone.dtype")
    with pytest.raises(ValueError, match="train.mixed_precision='fp8'"):
        resolve_mixed_precision("fp8", caps=AVX2)


def test_cpuinfo_flags_x86_and_arm():
    assert cpu_flags(XEON_AMX) == {"amx_bf16", "avx512_bf16"}
    assert cpu_flags(EPYC_AVX2) == frozenset()
    assert cpu_flags(GRAVITON3) == {"bf16", "fphp"}  # svebf16 is not the bf16 feature itself
    assert Capabilities("cpu", isa="SVE256", cpu_flags=cpu_flags(GRAVITON3)).native("bfloat16")
    assert not Capabilities("cpu", isa="AVX2", cpu_flags=cpu_flags(EPYC_AVX2)).native("bfloat16")
    assert cpu_model(XEON_AMX) == "Intel(R) Xeon(R) Platinum 8480C"
    assert cpu_model(EPYC_AVX2) == "AMD EPYC 7B12"


def test_blas_from_torch_config():
    mkl = "  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64\n"
    assert blas(mkl + "  - Build settings: BLAS_INFO=mkl, LAPACK_INFO=mkl") == "MKL 2024.2"
    assert blas("  - Build settings: BLAS_INFO=open, LAPACK_INFO=open") == "open"
    assert blas("nothing") == "unknown BLAS"


def test_machine_facts_name_the_machine():
    facts = hardware.machine_facts("cpu")
    assert {
        "cpu",
        "isa",
        "cpu_bf16",
        "blas",
        "threads",
        "cores",
        "device",
        "device_name",
        "torch",
    } <= facts.keys()
    assert facts["threads"] >= 1 and facts["device"] == "cpu"
    line = hardware.machine_line(facts, "float32")
    assert line.startswith(f"machine: {facts['cpu']} ({facts['isa']}, ") and "float32" in line
    assert f"{facts['threads']} threads" in line and facts["blas"] in line
    capped = facts | {
        "isa": "AVX2",
        "cpu_bf16": [],
        "unused": "avx512_bf16 unused: torch dispatches AVX2 kernels",
    }
    assert (
        "(AVX2, no native bf16; avx512_bf16 unused: torch dispatches AVX2 kernels)"
        in hardware.machine_line(capped, "float32")
    )
