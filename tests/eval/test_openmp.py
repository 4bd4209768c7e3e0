"""The OpenMP wait chosen at start for CPU decoding (eval/timing/openmp.py): a bounded spin only on an
idle CPU, an explicit setting kept, the opt-out honoured, and the re-executed process seeing the spin count."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from headstart.eval.timing import openmp
from headstart.eval.timing.openmp import CHOSEN, OPT_OUT, SPIN_COUNT, choose


def test_an_idle_cpu_gets_the_bounded_spin():
    value, line = choose({}, busy=0.05, cores=2)
    assert value == SPIN_COUNT
    assert "idle at start (0.05 of 2 cores busy)" in line and f"{OPT_OUT}=0" in line


def test_a_busy_cpu_keeps_threads_sleeping_and_says_how_to_force_the_spin():
    value, line = choose({}, busy=1.1, cores=2)
    assert value is None
    assert "1.1 of 2 cores busy at start" in line and f"GOMP_SPINCOUNT={SPIN_COUNT}" in line


@pytest.mark.parametrize(
    ("env", "busy", "said"),
    [
        ({"GOMP_SPINCOUNT": "0"}, 0.0, "GOMP_SPINCOUNT=0 as set"),
        ({OPT_OUT: "0"}, 0.0, f"({OPT_OUT}=0)"),
        ({}, math.nan, "unreadable"),
        ({CHOSEN: "1", "GOMP_SPINCOUNT": SPIN_COUNT}, 0.0, ""),
    ],
)
def test_the_environment_or_an_unknown_load_leaves_the_wait_as_it_is(env, busy, said):
    value, line = choose(env, busy=busy, cores=2)
    assert value is None
    assert (said in line) if said else line == ""


def test_the_spin_re_executes_the_command_with_its_extra_arguments(monkeypatch):
    calls = []

    def execve(path, argv, env):
        calls.append((path, argv, env))
        raise SystemExit(0)  # a real execve never returns

    for key in ("GOMP_SPINCOUNT", OPT_OUT, CHOSEN):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(openmp, "busy_cores", lambda window_s: 0.0)
    monkeypatch.setattr(os, "execve", execve)
    said = []
    with pytest.raises(SystemExit):
        openmp.spin_when_idle(torch.device("cpu"), ["out_dir=/x"], say=said.append)
    (path, argv, env) = calls[0]
    assert path == sys.executable and argv == [*sys.orig_argv, "out_dir=/x"]
    assert env["GOMP_SPINCOUNT"] == SPIN_COUNT and env[CHOSEN] == "1"
    assert "idle at start" in said[0]

    calls.clear()
    monkeypatch.setattr(openmp, "busy_cores", lambda window_s: 1.5)
    openmp.spin_when_idle(torch.device("cpu"), say=said.append)  # busy: returns, runs on as it is
    assert calls == [] and "1.5 of" in said[-1]


def test_the_re_executed_process_runs_with_the_spin_count_once():
    code = (
        "import os\n"
        "import torch\n"
        "from headstart.eval.timing import openmp\n"
        "openmp.busy_cores = lambda window_s: 0.0\n"
        "openmp.spin_when_idle(torch.device('cpu'), say=lambda line: print('said', flush=True))\n"
        "print('GOMP_SPINCOUNT', os.environ.get('GOMP_SPINCOUNT'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", OPT_OUT, CHOSEN)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["said", f"GOMP_SPINCOUNT {SPIN_COUNT}"]
