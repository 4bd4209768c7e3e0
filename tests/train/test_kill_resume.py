"""kill -9 mid-epoch, resume, and end with exactly (bitwise) the weights of an uninterrupted run, for every
method that draws random numbers while training: Medusa (none, the baseline), EAGLE-1 (feature noise),
EAGLE-3 (training-time test) and DistillSpec on-policy (mixture: a seeded coin and sampled responses)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from helpers import REPO, env, run_train, train_overrides, write_chat_file

COMMON = {
    "train.max_steps": 12,
    "train.save_every": 2,
    "train.keep_checkpoints": 0,
    "train.eval_every": 100,
}
METHODS = {
    "medusa": ("train/medusa.py", {}),
    "eagle": ("train/eagle.py", {"method": "eagle", "method.noise": 0.2}),
    "eagle3": ("train/eagle.py", {"method": "eagle3", "method.draft_vocab_size": 48, "method.ttt_steps": 2}),
    "distillspec": (
        "train/distill.py",
        {
            "+backbone.tiny.initializer_range": 0.2,
            "method.keep_layers": "[0]",
            "method.data_mode": "mixture",
            "method.gen_max_new_tokens": 8,
            "method.gen_temperature": 1.0,
        },
    ),
}


def overrides(method: str, run_dir, data, cache) -> list[str]:
    _, extra = METHODS[method]
    out = train_overrides(run_dir, data, cache, **COMMON, **extra)
    return out if method == "medusa" else [o for o in out if not o.startswith("method.num_heads=")]


@pytest.mark.parametrize("method", list(METHODS))
def test_kill9_mid_epoch_then_resume_is_bitwise_exact(tmp_path, method):
    script = METHODS[method][0]
    # 76 training rows of several lengths: 19 batches of 4 per epoch (EAGLE groups them by length)
    data = write_chat_file(tmp_path / "chat.jsonl", n=80, varied=True)
    straight = tmp_path / "straight"
    run_train(overrides(method, straight, data, tmp_path / "cache"), script=script)

    killed = tmp_path / "killed"
    cmd = [sys.executable, script, *overrides(method, killed, data, tmp_path / "cache")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = killed / "checkpoints" / "step_00000006"
    deadline = time.time() + 120
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "drafter").exists(), "the run finished before it was killed; the test proves nothing"
    res = run_train(overrides(method, killed, data, tmp_path / "cache"), script=script)
    assert "resumed from" in res.stderr + res.stdout

    a = load_file(straight / "drafter" / "model.safetensors")
    b = load_file(killed / "drafter" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: max |delta| {(a[k] - b[k]).abs().max()}"
