"""One training per run folder (train/run_lock.py), and a `+key` that names no setting refused like a typo:
exit code 2, one line naming the other process or the setting, and the run folder left as it was."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from test_faults_train import one_line_error

from helpers import REPO, env, run_train, train_overrides, write_chat_file

HOLD = "import sys, time; from headstart.train.run_lock import run_lock\nwith run_lock(sys.argv[1]):\n" + (
    "    print('held', flush=True); time.sleep(600)"
)


def holder(run_dir: Path) -> subprocess.Popen:
    """Another process holding the run folder's lock, as a live training does."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def locked(lock: Path) -> bool:
    return lock.is_file() and lock.read_text() != ""


def listing(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.name != "medusa.log")


def test_second_training_on_a_run_in_use_is_refused_naming_it_and_moves_nothing(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3})
    run_train(over)
    before = listing(run_dir)
    other = holder(run_dir)
    try:
        for extra in ({}, {"train.resume": "never"}):  # never: would have moved the live run aside
            res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **extra), check=False)
            host = socket.gethostname()
            one_line_error(res, f"run_dir={run_dir} is in use", f"pid {other.pid} on host {host}", "Fix:")
            assert listing(run_dir) == before
            assert not list(tmp_path.glob("run.replaced-*"))
    finally:
        other.kill()
        other.wait()
    # the holder died without releasing anything (kill -9): its lock is gone with it, the run resumes
    assert json.loads((run_dir / ".lock").read_text())["pid"] == other.pid  # the stale record is still there
    res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 6}))
    assert "step_00000003 at step 3" in res.stdout + res.stderr
    assert (run_dir / ".lock").read_text() == ""  # released at the end


def test_two_trainings_started_together_one_refused_the_other_intact(tmp_path):
    """The concurrency case as a user meets it: a second launch while the first is training (long enough to
    outlast the second's start-up on a busy machine)."""
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(
        run_dir, data, tmp_path / "cache", **{"train.max_steps": 600, "train.save_every": 200}
    )
    cmd = [sys.executable, "train/medusa.py", *over]
    first = subprocess.Popen(
        cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.time() + 120
        while not locked(run_dir / ".lock"):  # the first one holds the lock (it records itself)
            assert first.poll() is None and time.time() < deadline, first.stdout.read()
            time.sleep(0.2)
        second = run_train(
            train_overrides(run_dir, data, tmp_path / "cache", **{"train.resume": "never"}), check=False
        )
        one_line_error(second, "is in use", f"pid {first.pid}")
        out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
    assert first.returncode == 0, out[-3000:]
    assert not list(tmp_path.glob("run.replaced-*"))
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["step"] == 600


def test_plus_key_that_names_no_setting_is_refused_like_a_typo(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    for extra, meant in (
        ("+resume=never", "Fix: train.resume=..."),
        ("+train.max_step=3", "train.max_steps"),
    ):
        res = run_train([*train_overrides(run_dir, data, tmp_path / "cache"), extra], check=False)
        one_line_error(res, extra[1:].split("=")[0], "no such setting", meant)
    assert not (run_dir / "checkpoints").exists()
