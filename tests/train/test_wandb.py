"""W&B like the HF Trainer, read back from the offline run files (no network): grad norm, throughput,
samples/epoch, lr and measured tau by default; a resumed run continues the same W&B run; drafter artifacts
with logger.log_model=checkpoint (WANDB_LOG_MODEL)."""

from __future__ import annotations

import json
import subprocess
import sys

from wandb_files import run_files, summary

from helpers import REPO, env, run_train, train_overrides, write_chat_file


def test_offline_run_logs_trainer_metrics_resumes_same_run_and_artifacts(tmp_path, monkeypatch):
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):  # artifact staging etc. off $HOME
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    data = write_chat_file(tmp_path / "chat.jsonl", n=40)
    run = tmp_path / "run"
    extra = {
        "logger": "wandb",
        "logger.log_model": "checkpoint",
        "train.max_steps": 4,
        "train.save_every": 2,
        "train.eval_every": 2,
        "train.quick_eval_prompts": 1,
        "train.quick_eval_tokens": 4,
    }
    run_train(train_overrides(run, data, tmp_path / "cache", **extra))
    (first,) = run_files(run)
    one = summary(first)
    saved = json.loads((run / "wandb_run.json").read_text())
    assert one["id"] == saved["id"] and one["group"] == "run" and one["job_type"] == "train"
    logged = {k for row in one["history"] for k in row}
    for key in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/samples_per_s"):
        assert key in logged, key
    assert {"train/samples_seen", "train/epoch", "measured/tau", "eval/loss"} <= logged
    last = [r for r in one["history"] if "train/samples_seen" in r][-1]
    assert last["train/samples_seen"] == 4 * 4 and last["_step"] == 4  # 4 steps x batch 4 x 1 process
    assert all(r["train/grad_norm"] > 0 for r in one["history"] if "train/grad_norm" in r)
    arts = one["artifacts"]
    assert [a["name"] for a in arts] == [f"drafter-{one['id']}"] * 3 and all(
        a["type"] == "model" for a in arts
    )
    assert {"step_2", "step_4", "final"} <= {alias for a in arts for alias in a["aliases"]}

    run_train(train_overrides(run, data, tmp_path / "cache", **{**extra, "train.max_steps": 6}))
    files = run_files(run)
    assert len(files) == 2
    two = summary(next(f for f in files if f != first))
    assert two["id"] == one["id"]  # the same W&B run, continued
    assert min(r["_step"] for r in two["history"] if "train/loss" in r) > 4

    # the eval stage on its drafter: a W&B run in the training run's group, linked by id
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["alpha beta gamma"]}) + "\n")
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        "eval/run.py",
        f"checkpoint={run / 'drafter'}",
        f"out_dir={out}",
        f"prompts={prompts}",
    ]
    cmd += ["max_new_tokens=4", "warmup=0", "logger=wandb"]
    e = env() | {
        var: str(tmp_path / "wandb-home") for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR")
    }
    res = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (eval_file,) = run_files(out)
    ev = summary(eval_file)
    assert ev["group"] == one["group"] and ev["job_type"] == "eval"
    assert ev["config"]["train_run_id"] == one["id"] and ev["id"] != one["id"]
