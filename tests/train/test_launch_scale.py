"""Launching as a user does: `./launch.sh` with the shipped accelerate configs (two CPU ranks from
cpu_ddp.yaml, ZeRO-2 from zero2.yaml on one CPU process), FSDP2 sharding on two CPU ranks against one process
(torchtitan-style parity), `--help` listing only what a job takes, and Hydra multirun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import REPO, env, train_overrides, write_chat_file

VENV = Path(sys.prefix)  # the venv running the tests: ./launch.sh uses it as it is (HEADSTART_NO_SETUP)


def launch(verb: str, overrides: list[str], accelerate_config: Path | str | None = None, timeout: int = 300):
    e = env() | {"HEADSTART_VENV": str(VENV), "HEADSTART_NO_SETUP": "1"}
    e.pop("ACCELERATE_USE_CPU", None)
    if accelerate_config is not None:
        e["ACCELERATE_CONFIG"] = str(accelerate_config)
    res = subprocess.run(
        ["./launch.sh", verb, *overrides], cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    return res


def test_cpu_ddp_yaml_through_launch_sh_starts_two_ranks(tmp_path):
    """The README's command: ACCELERATE_CONFIG=accelerate_configs/cpu_ddp.yaml ./launch.sh medusa ..."""
    data = write_chat_file(tmp_path / "chat.jsonl", n=24)
    run = tmp_path / "run"
    over = train_overrides(
        run,
        data,
        tmp_path / "cache",
        **{
            "train.max_steps": 2,
            "train.micro_batch_size": 2,
            "train.trace_rows": "true",
            "train.save_every": 2,
        },
    )
    res = launch("medusa", [o for o in over if o != "train.device=cpu"], "accelerate_configs/cpu_ddp.yaml")
    ranks = sorted(p.name for p in (run / "trace").iterdir())
    assert ranks == ["rank0.jsonl", "rank1.jsonl"], res.stderr[-3000:]
    assert "processes: 2" in res.stdout  # the banner says so too
    assert "were not passed to `accelerate launch`" not in res.stderr


def test_help_lists_only_job_groups():
    res = subprocess.run(
        [sys.executable, "train/medusa.py", "--help"], cwd=REPO, env=env(), capture_output=True, text=True
    )
    groups = res.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    names = {
        line.split(":")[0] for line in groups.splitlines() if ":" in line and not line.startswith("Compose")
    }
    assert names == {"backbone", "data", "debug", "experiment", "logger", "method", "optim"}


def test_multirun_gives_each_job_its_own_run_dir(tmp_path):
    data = write_chat_file(tmp_path / "chat.jsonl", n=24)
    base = tmp_path / "sweep"
    over = train_overrides(base, data, tmp_path / "cache", **{"train.max_steps": 1, "train.save_every": 1})
    over = [o for o in over if not o.startswith("method.num_heads")] + ["method.num_heads=1,2"]
    res = subprocess.run(
        [sys.executable, "train/medusa.py", "-m", *over, f"hydra.sweep.dir={tmp_path / 'multirun'}"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    runs = sorted(p.name for p in base.iterdir())
    assert runs == ["method.num_heads=1", "method.num_heads=2"]
    for run, heads in zip(runs, (1, 2)):
        saved = json.loads((base / run / "config.json").read_text())
        assert saved["method"]["num_heads"] == heads and saved["run_dir"] == str(base / run)
        assert (base / run / "drafter" / "model.safetensors").is_file()


@pytest.mark.slow
def test_fsdp_two_cpu_ranks_match_one_process(tmp_path):
    """FSDP2 over gloo (2 ranks, batch 2 each) == one process (batch 4), weights after 3 AdamW steps."""
    data = write_chat_file(tmp_path / "chat.jsonl", n=24)
    outs = {}
    for n in (1, 2):
        outs[n] = tmp_path / f"w{n}.safetensors"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n)]
        cmd += [
            "--master_port",
            str(29561 + n),
            "tests/train/fsdp_parity.py",
            str(data),
            str(tmp_path / "c"),
            str(outs[n]),
        ]
        res = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stderr[-4000:]
    one, two = load_file(outs[1]), load_file(outs[2])
    assert one.keys() == two.keys()
    moved = 0
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=1e-5, msg=k)
        moved += int(one[k].abs().sum() > 0)
    assert moved  # the zero-initialized blocks trained


@pytest.mark.slow
def test_zero2_on_one_cpu_process_matches_plain_training(tmp_path):
    """accelerate_configs/zero2.yaml's DeepSpeed section, one CPU process (DeepSpeed's CPU accelerator), the
    same losses and weights as training without DeepSpeed. Needs deepspeed (`./launch.sh setup deepspeed`)."""
    pytest.importorskip("deepspeed")
    cfg = yaml.safe_load((REPO / "accelerate_configs" / "zero2.yaml").read_text())
    cfg.update(num_processes=1, mixed_precision="no", main_process_port=29571)
    ds_yaml = tmp_path / "zero2_1cpu.yaml"
    ds_yaml.write_text(yaml.safe_dump(cfg))
    data = write_chat_file(tmp_path / "chat.jsonl", n=24)
    extra = {"train.max_steps": 3, "train.save_every": 3, "train.eval_every": 3, "train.log_every": 1}
    runs = {}
    for name, config in (("plain", None), ("zero2", ds_yaml)):
        runs[name] = tmp_path / name
        over = train_overrides(runs[name], data, tmp_path / "cache", **extra)
        # train.device=cpu would make accelerate drop DeepSpeed (the loop refuses that): leave it unset
        launch("medusa", [o for o in over if o != "train.device=cpu"], config, timeout=600)
    ckpt = runs["zero2"] / "checkpoints" / "step_00000003"
    assert (ckpt / "pytorch_model").is_dir(), "no DeepSpeed checkpoint: ZeRO did not run"
    a = load_file(runs["plain"] / "drafter" / "model.safetensors")
    b = load_file(runs["zero2"] / "drafter" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    ea, eb = (json.loads((runs[n] / "final_eval.json").read_text()) for n in ("plain", "zero2"))
    assert ea["eval/loss"] == pytest.approx(eb["eval/loss"], rel=1e-5)


def test_fsdp_config_on_cpu_is_refused_not_silently_ddp(tmp_path):
    cfg = yaml.safe_load((REPO / "accelerate_configs" / "fsdp.yaml").read_text())
    cfg.update(num_processes=1, mixed_precision="no", use_cpu=True)
    cfg["fsdp_config"]["fsdp_version"] = 2
    path = tmp_path / "fsdp_cpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    data = write_chat_file(tmp_path / "chat.jsonl", n=24)
    e = env() | {"HEADSTART_VENV": str(VENV), "HEADSTART_NO_SETUP": "1", "ACCELERATE_CONFIG": str(path)}
    over = train_overrides(tmp_path / "run", data, tmp_path / "cache", **{"train.max_steps": 1})
    res = subprocess.run(["./launch.sh", "medusa", *over], cwd=REPO, env=e, capture_output=True, text=True)
    assert res.returncode != 0 and "asks for FSDP but accelerate set up MULTI_CPU" in res.stderr, res.stderr[
        -3000:
    ]
