"""Damaged, half-written or misplaced checkpoints and outputs at eval and export: one line naming
the file and the fix, exit code 2, nothing written; a half-written `step_*.tmp` is never scored or exported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import CheckpointError, build_drafter, find_checkpoints, save_drafter
from headstart.models.medusa import MedusaConfig
from headstart.train import export as export_cli

REPO = Path(__file__).resolve().parents[2]
TINY = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})


def save(path: Path, backbone, step: int = 2) -> Path:
    cfg = MedusaConfig(num_heads=2)
    heads = build_drafter("medusa", cfg, backbone)
    return save_drafter(path, heads, "medusa", cfg, TINY, backbone, extra={"step": step})


def eval_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(REPO / "eval" / "run.py"), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def one_line(stderr: str, *needles: str) -> None:
    assert "Traceback" not in stderr, stderr[-2000:]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and all(n in line for n in needles), line


def export_fails(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        export_cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    one_line(err)
    return err


def test_half_written_checkpoints_are_never_scored_or_exported(backbone, tmp_path, capsys):
    run = tmp_path / "run"
    save(run / "checkpoints" / "step_00000002" / "drafter", backbone, 2)
    save(run / "checkpoints" / "step_00000004.tmp" / "drafter", backbone, 4)  # killed while saving
    save(run / "drafter.tmp123", backbone, 4)  # killed while publishing the final drafter
    found = find_checkpoints(run)
    assert list(found) == [run / "checkpoints" / "step_00000002" / "drafter"]
    with pytest.raises(CheckpointError, match="half-written"):
        find_checkpoints(run / "checkpoints" / "step_00000004.tmp" / "drafter")
    err = export_fails(["--checkpoint", str(run / "checkpoints" / "step_00000004.tmp" / "drafter")], capsys)
    assert "half-written" in err and not (run / "checkpoints" / "step_00000004.tmp" / "export").exists()


@pytest.mark.parametrize("damage", ["truncated_weights", "empty_config", "not_a_drafter_config"])
def test_damaged_drafter_at_export_and_eval_names_the_file(backbone, tmp_path, capsys, damage):
    ckpt = save(tmp_path / "run" / "drafter", backbone)
    if damage == "truncated_weights":
        bad = ckpt / "model.safetensors"
        bad.write_bytes(bad.read_bytes()[:-64])
    elif damage == "empty_config":
        bad = ckpt / "config.json"
        bad.write_text("")
    else:
        bad = ckpt / "config.json"
        bad.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    out = tmp_path / "out"
    err = export_fails(["--checkpoint", str(ckpt), "--out", str(out)], capsys)
    assert str(bad) in err and not out.exists()
    res = eval_cli([f"checkpoint={ckpt}", f"out_dir={tmp_path / 'eval'}", "device=cpu"], tmp_path)
    assert res.returncode == 2
    one_line(res.stderr, str(bad))


def test_out_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "a_file").write_text("x")
    for out in (tmp_path / "a_file", tmp_path / "a_file" / "sub"):
        res = eval_cli(["checkpoint=.", f"out_dir={out}"], tmp_path)
        assert res.returncode == 2
        one_line(res.stderr, f"out_dir={out}", "not a folder")


def test_push_without_token_or_network_fails_first_in_one_line(backbone, tmp_path, capsys, monkeypatch):
    ckpt = save(tmp_path / "run" / "drafter", backbone)
    out = tmp_path / "out"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    err = export_fails(["--checkpoint", str(ckpt), "--out", str(out), "--push", "me/heads"], capsys)
    assert "needs a Hugging Face token" in err and not out.exists()

    secret = "hf_SECRETtoken1234567890"
    monkeypatch.setattr("huggingface_hub.get_token", lambda: secret)

    def offline(self, *a, **kw):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr("huggingface_hub.HfApi.whoami", offline)
    err = export_fails(["--checkpoint", str(ckpt), "--out", str(out), "--push", "me/heads"], capsys)
    assert "cannot be reached (ConnectionError)" in err and secret not in err and not out.exists()
    shutil.rmtree(tmp_path / "run")
