"""OpenMP's wait at barriers for decoding on a CPU, chosen once at start.

libgomp reads `GOMP_SPINCOUNT` and `OMP_WAIT_POLICY` once, when torch loads it. `launch.sh` (and headstart's
package, imported first) set `OMP_WAIT_POLICY=PASSIVE`: beside another busy process a spinning team waits for a
member the kernel parked, and decoding ran 3-40x slower. A decode step, though, is many short OpenMP regions (a
compiled one hundreds) that each wake a sleeping team: on an idle CPU a bounded spin (`GOMP_SPINCOUNT=10000`, ~0.1
ms, then sleep) made steps 1.0-1.6x faster eager and 1.4-3x faster compiled, and beside a process started later
~2-4x slower (docs/measurement.md).

So a decoding command (the eval, the tuner, bench-decode) that finds the CPU idle at start runs with the bounded
spin: the process re-executes itself with `GOMP_SPINCOUNT` set (the only way libgomp sees it), after one line that
says so. `GOMP_SPINCOUNT` already set is used as set; `HEADSTART_OPENMP_SPIN=0` keeps threads sleeping. Training
keeps PASSIVE.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence

import torch

from headstart.eval.timing.harness import busy_cores, usable_cores

log = logging.getLogger("headstart.eval")

SPIN_COUNT = "10000"  # ~0.1 ms of spinning before a thread sleeps
# busy cores at start (every process's, this one's included) under which the CPU counts as idle
IDLE_BELOW = 0.25
OPT_OUT = "HEADSTART_OPENMP_SPIN"  # =0: threads sleep at barriers whatever the load
CHOSEN = "HEADSTART_OPENMP_SPIN_CHOSEN"  # set in the re-executed process, so it does not choose again


def choose(env: Mapping[str, str], busy: float, cores: int) -> tuple[str | None, str]:
    """(the GOMP_SPINCOUNT to re-execute with, or None to run as the environment is; the line that says why)."""
    if env.get(CHOSEN):
        return None, ""  # the re-executed process: its parent said why
    if "GOMP_SPINCOUNT" in env:
        return None, f"OpenMP: GOMP_SPINCOUNT={env['GOMP_SPINCOUNT']} as set in the environment"
    if env.get(OPT_OUT) == "0":
        return None, f"OpenMP: threads sleep at barriers ({OPT_OUT}=0)"
    if math.isnan(busy):
        return None, "OpenMP: threads sleep at barriers (the CPU's load is unreadable here)"
    if busy >= IDLE_BELOW:
        return None, (
            f"OpenMP: {busy:.1f} of {cores} cores busy at start: threads sleep at barriers (decode steps run up to "
            f"~1.6x slower, compiled ~3x, than with a spin on an idle CPU; GOMP_SPINCOUNT={SPIN_COUNT} forces it)"
        )
    return SPIN_COUNT, (
        f"OpenMP: the CPU is idle at start ({busy:.2f} of {cores} cores busy): decode steps run with threads "
        f"spinning ~0.1 ms at barriers (GOMP_SPINCOUNT={SPIN_COUNT}: faster idle, ~2-4x slower if another "
        f"process takes a core later; {OPT_OUT}=0 keeps them sleeping)"
    )


def spin_when_idle(
    device: torch.device, extra_args: Sequence[str] = (), say: Callable[[str], None] = log.info
) -> None:
    """For a decoding command on a CPU `device`: re-execute this process with the bounded spin when the CPU is idle
    now (the same command line plus `extra_args`, e.g. an output folder already resolved); otherwise say why not and
    return. Other devices: nothing."""
    if device.type != "cpu":
        return
    value, line = choose(os.environ, busy_cores(0.3), usable_cores())
    if line:
        say(line)
    if value is None:
        return
    for h in logging.getLogger().handlers + log.handlers:
        h.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    env = dict(os.environ, GOMP_SPINCOUNT=value, **{CHOSEN: "1"})
    # orig_argv keeps `-m` and interpreter flags
    os.execve(sys.executable, [*sys.orig_argv, *extra_args], env)
