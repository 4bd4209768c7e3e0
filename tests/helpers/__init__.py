"""Helpers for the training tests: a small local chat file and a way to run train/medusa.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write_chat_file(path: Path, n: int = 48, varied: bool = False) -> Path:
    """n ShareGPT rows; varied: answers of 12 to 30 words instead of 12 (rows of different lengths)."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    with open(path, "w") as f:
        for i in range(n):
            q = " ".join(words[(i + j) % 8] for j in range(5))
            a = " ".join(words[(i * 3 + j) % 8] for j in range(12 + (i * 7) % 19 if varied else 12))
            row = {
                "id": f"r{i}",
                "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}],
            }
            f.write(json.dumps(row) + "\n")
    return path


def train_overrides(run_dir: Path, data_file: Path, cache: Path, **extra) -> list[str]:
    base = {
        "backbone": "tiny",
        "data": "jsonl",
        "data.source": str(data_file),
        "data.max_length": 96,
        "data.eval_rows": 4,
        "train.max_steps": 6,
        "train.micro_batch_size": 4,
        "train.mixed_precision": "no",
        "train.log_every": 2,
        "train.eval_every": 3,
        "train.eval_batches": 1,
        "train.save_every": 3,
        "train.device": "cpu",
        "run_dir": str(run_dir),
        "cache_dir": str(cache),
        "method.num_heads": 2,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def env() -> dict:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    return e


def run_train(
    overrides: list[str],
    timeout: int = 180,
    nproc: int = 1,
    check: bool = True,
    script: str = "train/medusa.py",
):
    if nproc == 1:
        cmd = [sys.executable, script, *overrides]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            "29517",
            script,
            *overrides,
        ]
    res = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(
            f"exit {res.returncode}\nSTDOUT:\n{res.stdout[-3000:]}\nSTDERR:\n{res.stderr[-5000:]}"
        )
    return res


def ctrl_c_default() -> None:
    """`preexec_fn` of a child a test sends Ctrl-C: SIGINT back to its default disposition. A suite started in
    the background by a non-interactive shell ignores SIGINT, and an ignored signal stays ignored across exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
