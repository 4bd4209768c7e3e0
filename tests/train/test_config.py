"""Every config composes against its schema; typos and bad values fail at compose/start time, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from headstart.data import DataError
from headstart.models import registry
from headstart.models.eagle_config import Eagle3Config
from headstart.train.config import EntryError, JobConfig, register_configs, to_job
from helpers import run_train, train_overrides, write_chat_file

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def make(overrides: list[str], name: str = "medusa"):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name=name, overrides=overrides)


def group_options(group: str) -> list[str]:
    """YAML files of the group and the options stored from dataclasses (train/config.py)."""
    stored = {name.removesuffix(".yaml") for name in ConfigStore.instance().repo.get(group, {})}
    return sorted({p.stem for p in (CONF / group).glob("*.yaml")} | stored)


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
    assert group_options(group)
    for option in group_options(group):
        # an experiment is for the method its name starts with (medusa_..., eagle_..., eagle3_...), composed
        # with the config of the entry script that trains it
        method = option.split("_")[0] if group == "experiment" else "medusa"
        entry = registry.get(method).entry
        job = to_job(make([f"{group}={option}"], name=entry), entry)
        assert job.train.max_steps >= 1 and job.method_name == method


@pytest.mark.parametrize("method", sorted(registry.METHODS))
def test_every_method_composes_with_its_entry_config(method):
    """`method=<name>` through the config of the script that trains it: the method's own typed schema."""
    spec = registry.get(method)
    job = to_job(make(["backbone=tiny", f"method={method}"], name=spec.entry), spec.entry)
    assert job.method_name == method and type(job.method) is spec.config
    assert (CONF / "method" / f"{method}.yaml").is_file()
    assert job.run_dir == f"runs/{method}-tiny-sharegpt"


def test_each_entry_config_defaults_to_its_method():
    for entry, method in [("medusa", "medusa"), ("eagle", "eagle"), ("distill", "distillspec")]:
        assert to_job(make(["backbone=tiny"], name=entry), entry).method_name == method


def test_method_switch_from_an_experiment_and_typed_schema():
    """No argv sniffing: an experiment's `override /method` gives the method's schema (its keys validate)."""
    job = to_job(make(["experiment=eagle3_smollm2_selfdistill_cpu"], name="eagle"), "eagle")
    assert type(job.method) is Eagle3Config and job.method.ttt_steps == 3
    job = to_job(make(["method=eagle3", "method.ttt_steps=7"], name="eagle"), "eagle")
    assert job.method.ttt_steps == 7
    with pytest.raises(ConfigCompositionException):  # EAGLE-1 has no ttt_steps
        make(["method.ttt_steps=7"], name="eagle")


def test_the_main_job_reads_a_prefix_of_the_reference_runs_rows():
    """The main job's 1,152 conversations are the first rows of the 3,840 the references and the EAGLE-3
    experiment read (one seeded order): its regenerated answers are theirs, reused from the cache."""
    jobs = {
        exp: to_job(make([f"experiment={exp}"], name=entry), entry)
        for exp, entry in [
            ("medusa_smollm2_selfdistill_cpu", "medusa"),
            ("medusa_smollm2_reference_cpu", "medusa"),
            ("eagle3_smollm2_selfdistill_cpu", "eagle"),
            ("eagle3_smollm2_reference_cpu", "eagle"),
        ]
    }
    rows = {exp: job.data.max_rows for exp, job in jobs.items()}
    assert rows == {
        "medusa_smollm2_selfdistill_cpu": 1152,
        "medusa_smollm2_reference_cpu": 3840,
        "eagle3_smollm2_selfdistill_cpu": 3840,
        "eagle3_smollm2_reference_cpu": 3840,
    }
    main, eagle3 = jobs["medusa_smollm2_selfdistill_cpu"], jobs["eagle3_smollm2_selfdistill_cpu"]
    same = ("source", "seed", "eval_rows", "max_length", "responses", "regen")
    assert all(getattr(main.data, k) == getattr(eagle3.data, k) for k in same)
    # EAGLE-3 adds the backbone's own prompts to its training rows only; the held-out rows stay ShareGPT's
    assert (main.data.backbone_prompts, eagle3.data.backbone_prompts) == (0, 1231)
    # the reference keeps the drafter it was measured with (README); the experiment trains a cheaper step
    ref = jobs["eagle3_smollm2_reference_cpu"].method
    assert (ref.draft_vocab_size, ref.ttt_steps) == (16384, 4)
    assert jobs["eagle3_smollm2_reference_cpu"].data.backbone_prompts == 0
    assert (eagle3.method.draft_vocab_size, eagle3.method.ttt_steps) == (8192, 3)
    # EAGLE batches rows of similar length (its layer runs over every padded position); Medusa reads only the
    # labelled positions, and the reference keeps the random batches it was measured with
    assert (main.train.group_by_length, eagle3.train.group_by_length) == (False, True)
    # the main job's heads read the root token; the reference keeps the heads it was measured with
    assert main.method.root_token and not jobs["medusa_smollm2_reference_cpu"].method.root_token
    assert not jobs["eagle3_smollm2_reference_cpu"].train.group_by_length


def test_a_method_through_another_entry_script_is_refused():
    with pytest.raises(EntryError, match=r"train/eagle.py.*launch.sh eagle"):
        to_job(make(["method=eagle3"], name="medusa"), "medusa")


def test_distill_seed_follows_train_seed():
    assert to_job(make(["train.seed=7"], name="distill"), "distill").method.seed == 7


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


def _one_line_error(res, *needles: str) -> None:
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and all(n in line for n in needles), line


def test_required_settings_are_required(tmp_path):
    data = write_chat_file(tmp_path / "chat.jsonl")
    over = train_overrides(tmp_path / "run", data, tmp_path / "cache")
    res = run_train([o for o in over if not o.startswith("backbone=")] + ["backbone=hf"], check=False)
    _one_line_error(res, "backbone.path is required", "backbone.path=...")
    res = run_train([o for o in over if not o.startswith("data.source=")], check=False)
    _one_line_error(res, "data.source is required", "data.source=...")
    assert not (tmp_path / "run").exists()


def test_required_setting_left_unset_is_refused_by_to_job():
    with pytest.raises(ValueError, match=r"backbone.path is required here. Fix: add backbone.path=\.\.\."):
        to_job(make(["backbone=hf"]))
    assert to_job(make(["backbone=hf", "backbone.path=/models/x"])).backbone.path == "/models/x"
