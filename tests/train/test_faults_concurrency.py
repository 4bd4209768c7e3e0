"""Readers beside a training that writes and prunes checkpoints: the drafter loader that eval uses, and
export, run over and over against the run while it trains. Each read either gets a complete checkpoint (its
weights match the digest recorded when it was written) or is refused in one line; nothing half-written is
ever read, and the training ends intact. (Two trainings on one run: test_faults_lock.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from headstart.models.checkpoint import CheckpointError, find_checkpoints, load_drafter
from headstart.models.export import export
from headstart.models.export.medusa import read_layout
from helpers import REPO, env, train_overrides, write_chat_file


def test_eval_and_export_beside_a_training_read_only_complete_checkpoints(tmp_path, backbone):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(
        run_dir,
        data,
        tmp_path / "cache",
        **{"train.max_steps": 40, "train.save_every": 2, "train.eval_every": 20},
    )
    trainer = subprocess.Popen(
        [sys.executable, "train/medusa.py", *over], cwd=REPO, env=env(), stderr=subprocess.PIPE, text=True
    )
    loaded, refused, exported = 0, [], 0
    try:
        deadline = time.time() + 600
        while trainer.poll() is None and time.time() < deadline:
            try:
                for folder in list(
                    find_checkpoints(run_dir)
                ):  # every published checkpoint (the eval stage's list)
                    load_drafter(folder, backbone)  # the digest check: exactly the bytes written
                    loaded += 1
                out = tmp_path / "export"
                newest = sorted((run_dir / "checkpoints").glob("step_????????"))
                if newest:
                    export(newest[-1] / "drafter", out, ["vllm"])
                    read_layout(out)  # the published layout is whole
                    exported += 1
            except (CheckpointError, FileNotFoundError) as e:  # pruned or replaced under the reader
                assert "\n" not in str(e) and "Fix:" in str(e), str(e)
                refused.append(str(e))
                time.sleep(0.05)
        _, err = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode == 0, err[-3000:]
    assert loaded > 0 and exported > 0, (loaded, exported, refused)
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["step"] == 40
    load_drafter(run_dir / "drafter", backbone)
    assert not list(run_dir.rglob("*.tmp*")) and not list(tmp_path.glob("export.*"))
    print(f"loaded {loaded}, exported {exported}, refused {len(refused)}")


def test_two_exports_into_one_folder_at_once_leave_whole_layouts(tmp_path, backbone):
    """Two export processes of one drafter into one folder at once: each publishes whole folders (neither
    fails on the other's rename); the layouts left are whole."""
    from headstart.models.backbone import BackboneConfig
    from headstart.models.checkpoint import build_drafter, save_drafter
    from headstart.models.medusa import MedusaConfig

    cfg = MedusaConfig(num_heads=2)
    heads = build_drafter("medusa", cfg, backbone)
    tiny = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})
    drafter = save_drafter(tmp_path / "run" / "drafter", heads, "medusa", cfg, tiny, backbone)
    out = tmp_path / "exp"
    cmd = [sys.executable, "train/export.py", "--checkpoint", str(drafter), "--out", str(out)]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env(), stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    read_layout(out / "vllm")
    read_layout(out / "medusa")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "run"]  # no .tmp / .old left
