"""Every config composes against its schema; typos and bad values fail at compose/start time, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from headstart.data import DataError
from headstart.train.config import JobConfig, register_configs, to_job

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def make(overrides: list[str], name: str = "medusa"):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name=name, overrides=overrides)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("backbone", group_options("backbone"))
@pytest.mark.parametrize("data", group_options("data"))
def test_every_backbone_and_data_option_composes(backbone, data):
    extra = []
    if backbone == "hf":
        extra.append("backbone.path=some/model")
    if data == "jsonl":
        extra.append("data.source=/tmp/x.jsonl")
    cfg = make([f"backbone={backbone}", f"data={data}", *extra])
    job = to_job(cfg)
    assert isinstance(job, JobConfig) and job.method.num_heads >= 1


@pytest.mark.parametrize("group", ["experiment", "debug", "logger", "optim"])
def test_every_other_option_composes(group):
    for option in group_options(group):
        # an experiment is for the job config its name starts with (medusa_..., eagle_..., eagle3_...)
        name = option.split("_")[0] if group == "experiment" else "medusa"
        job = to_job(make([f"{group}={option}"], name=name))
        assert job.train.max_steps >= 1 and job.method_name == name


@pytest.mark.parametrize("job", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_every_job_config_composes_with_its_method(job):
    """Each entry script's top-level config (medusa, and the other drafter kinds) with its default method."""
    cfg = to_job(make(["backbone=tiny"], name=job))
    assert cfg.method_name and cfg.method is not None


def test_run_dir_is_deterministic_no_timestamps():
    a = make(["backbone=tiny"])
    b = make(["backbone=tiny"])
    assert a.run_dir == b.run_dir == "runs/medusa-tiny-sharegpt"
    assert "${now" not in (CONF / "medusa.yaml").read_text()


def test_unknown_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException) as e:
        make(["method.num_head=5"])
    assert "num_head" in str(e.value) + str(e.value.__cause__)


def test_wrong_type_fails_naming_key():
    with pytest.raises(ConfigCompositionException) as e:
        make(["method.num_heads=five"])
    msg = str(e.value) + str(e.value.__cause__)
    assert "num_heads" in msg


def test_range_checks_run_when_building_objects():
    with pytest.raises(ValueError, match="num_heads"):
        to_job(make(["method.num_heads=0"]))
    with pytest.raises(DataError, match="max_length"):
        to_job(make(["data.max_length=2"]))
    with pytest.raises(ValueError, match="mixed_precision"):
        to_job(make(["train.mixed_precision=fp8"]))
    with pytest.raises(ValueError, match="dtype"):
        to_job(make(["backbone.dtype=float8"]))


def test_structured_node_rejects_unknown_nested_key():
    cfg = make([])
    with pytest.raises((ConfigKeyError, ConfigAttributeError)):
        cfg.train.not_a_key = 1
