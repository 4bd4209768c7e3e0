"""Writing where the user may not (a read-only or foreign folder), as a user who is not root: root writes
through permissions, so the commands run as `nobody` (setpriv). Each refusal: exit code 2, one line naming the
folder and the fix, before any work, nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_export_faults import make_run

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to run as nobody"
)


@pytest.fixture
def world(backbone):
    """A run and a read-only folder in a temporary folder `nobody` can read."""
    root = Path(tempfile.mkdtemp(prefix="headstart-ro-"))
    try:
        make_run(root / "run", backbone)
        (root / "ro").mkdir()
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        (root / "ro").chmod(0o555)
        yield root
    finally:
        shutil.rmtree(root)


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, *argv]
    # not this process's inductor cache either (set by the compiled decoder's first compile: root's home)
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env |= {"HOME": "/tmp", "HEADSTART_CACHE": "/tmp/headstart-ro-cache"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def one_line(res: subprocess.CompletedProcess, *needles: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert lines and lines[-1].startswith("error: ") and all(n in lines[-1] for n in needles), res.stderr


@pytest.mark.parametrize("out", ["ro", "ro/export"])
def test_export_into_a_read_only_folder_is_one_line(world, out):
    res = as_nobody(
        "-m", "headstart.train.export", "--checkpoint", str(world / "run"), "--out", str(world / out)
    )
    one_line(res, str(world / "ro"), "not writable", "Fix:")
    assert list((world / "ro").iterdir()) == []


def test_tune_into_a_read_only_folder_is_one_line_before_tuning(world):
    res = as_nobody("eval/tune.py", "--checkpoint", str(world / "run"), "--out", str(world / "ro" / "tuned"))
    one_line(res, str(world / "ro" / "tuned"), "Fix:")
    assert len(res.stderr.strip().splitlines()) == 1, (
        res.stderr
    )  # refused before loading or measuring anything
    assert list((world / "ro").iterdir()) == []
