"""backbone.dtype and train.mixed_precision default to `auto`: the training device's native dtype (capabilities
described by hand), said once with its reason, and recorded in the run's config as the resolved value beside
what was asked, why, and the machine."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from headstart import hardware
from headstart.hardware import Capabilities
from headstart.train.config import register_configs, to_job
from headstart.train.loop import resolve_dtypes

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()
AMX = Capabilities("cpu", isa="AVX512", cpu_flags=frozenset({"amx_bf16", "avx512_bf16"}))
AVX2 = Capabilities("cpu", isa="AVX2")
ARM_BF16 = Capabilities("cpu", isa="SVE256", cpu_flags=frozenset({"bf16"}))
CUDA_BF16 = Capabilities("cuda", cuda_bf16=True)
CUDA_FP16 = Capabilities("cuda", cuda_bf16=False)


def job_on(caps: Capabilities, monkeypatch, overrides: list[str] = ()):
    monkeypatch.setattr(hardware, "capabilities", lambda device="cpu": caps)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: caps.kind == "cuda")
    hardware._warned.clear()
    hardware._announced.clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="medusa", overrides=list(overrides))
    job = to_job(cfg, "medusa")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolve_dtypes(job, resolved)
    return job, resolved


def test_the_defaults_are_auto():
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="medusa")
    assert cfg.backbone.dtype == "auto" and cfg.train.mixed_precision == "auto"


@pytest.mark.parametrize(
    "caps, dtype, precision",
    [
        (AMX, "bfloat16", "bf16"),
        (AVX2, "float32", "no"),
        (ARM_BF16, "bfloat16", "bf16"),
        (CUDA_BF16, "bfloat16", "bf16"),
        (CUDA_FP16, "float16", "fp16"),
    ],
    ids=["amx", "avx2", "arm_bf16", "cuda_bf16", "cuda_fp16"],
)
def test_auto_is_resolved_said_once_and_recorded(caps, dtype, precision, monkeypatch, caplog):
    with caplog.at_level(logging.INFO, "headstart"):
        job, resolved = job_on(caps, monkeypatch)
    assert (
        job.backbone.dtype == resolved["backbone"]["dtype"] == dtype
    )  # what config.json and checkpoints hold
    assert job.train.mixed_precision == resolved["train"]["mixed_precision"] == precision
    compute = resolved["compute"]
    assert compute["backbone.dtype"]["requested"] == "auto" and compute["backbone.dtype"]["resolved"] == dtype
    assert compute["train.mixed_precision"] == {
        "requested": "auto",
        "resolved": precision,
        "reason": compute["train.mixed_precision"]["reason"],
    }
    assert caps.describe() in compute["backbone.dtype"]["reason"]
    assert {"cpu", "isa", "blas", "threads", "device"} <= compute["machine"].keys()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("backbone.dtype:")]
    assert lines == [f"backbone.dtype: {dtype} ({compute['backbone.dtype']['reason']})"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_explicit_bf16_on_avx2_is_kept_with_one_warning(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, "headstart"):
        job, resolved = job_on(AVX2, monkeypatch, ["backbone.dtype=bfloat16", "train.mixed_precision=bf16"])
    assert (job.backbone.dtype, job.train.mixed_precision) == ("bfloat16", "bf16")
    assert resolved["compute"]["backbone.dtype"]["requested"] == "bfloat16"
    [warning] = caplog.records
    assert "emulated" in warning.getMessage() and "Fix: backbone.dtype=auto (float32" in warning.getMessage()


def test_a_bad_value_is_one_clear_line():
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="medusa", overrides=["backbone.dtype=bf16"])
    with pytest.raises(ValueError, match=r"backbone.dtype='bf16' is not auto or one of .* Fix"):
        to_job(cfg, "medusa")
