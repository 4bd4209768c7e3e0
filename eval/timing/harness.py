"""Ratios of wall-clock rates that survive a shared machine: interleaved pairs, repeated until the median is
pinned down, outlier pairs re-timed, and the conditions they ran under recorded.

A *unit* is the smallest thing both sides do the same way (one conversation turn in the eval stage, one prompt
in the decoding benchmark, one training-step process in the training benchmark). Each round times every side
on every unit back to back, the order rotating per unit and per round, so load that comes and goes lands on
both sides alike. A unit's ratio is side rate / base rate (tokens per second); the figure is the median over
(unit, round) ratios with a distribution-free 95% confidence interval (order statistics of Binomial(n, 1/2),
Conover 1999, Sec. 3.2) and the interquartile range as its spread. Rounds repeat until the CI's half-width is
within `rel_ci` of the median or `budget_s` is spent. A (unit, round) in which some side's seconds per step is
more than `outlier` times that side's median is re-timed (`retries` times) and counted if it stays out.

The thread policy (`choose_threads`) is here too: on a CPU, an OpenMP team larger than the cores that are
actually free waits at every barrier for a thread the kernel has parked behind another process; a 2-thread team
beside one busy process ran 25x slower than one thread. So a CPU run uses the cores found free
when it starts, and the report says how many.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from headstart.hardware import machine_facts

log = logging.getLogger("headstart.eval")


class TimingError(ValueError):
    """Bad timing option; the message names it."""


@dataclass
class TimingConfig:
    budget_s: float = 120.0  # seconds of repeated rounds after the first pass; 0: the first pass only
    rel_ci: float = 0.05  # stop once the 95% CI of the median ratio is within +-rel_ci of it
    max_rounds: int = 20  # first pass included
    outlier: float = 1.5  # a side whose s/step exceeds outlier x its median (or falls below 1/outlier) ...
    retries: int = 2  # ... is re-timed this many times, then counted as an outlier
    bound_tol: float = 0.15  # slack on the physical bound and on the step-cost check (eval stage)
    threads: int = 0  # CPU intra-op threads; 0: the cores free when the run starts (at least 1)
    cost_reps: int = 15  # step-cost microbenchmark: timed forwards per width

    def __post_init__(self) -> None:
        if self.budget_s < 0 or not 0 < self.rel_ci < 1 or self.max_rounds < 1 or self.outlier <= 1:
            raise TimingError(
                "timing: budget_s >= 0, 0 < rel_ci < 1, max_rounds >= 1 and outlier > 1 expected "
                f"(got {self.budget_s}, {self.rel_ci}, {self.max_rounds}, {self.outlier})"
            )
        for key, value, least, fix in (
            ("retries", self.retries, 0, "2 (the default)"),
            ("threads", self.threads, 0, "0 (the cores free at the start) or a core count"),
            ("cost_reps", self.cost_reps, 3, "15 (the default)"),
            ("bound_tol", self.bound_tol, 0, "0.15 (the default)"),
        ):
            if value < least:
                raise TimingError(f"timing.{key}={value}: must be >= {least}. Fix: timing.{key}={fix}")


# ---------------------------------------------------------------- conditions and threads


def busy_cores(window_s: float = 0.3) -> float:
    """Cores busy over the next `window_s` (from /proc/stat; other processes and ours). NaN where unreadable."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
        return sum(v[:8]), idle

    try:
        t0, i0 = read()
        time.sleep(window_s)
        t1, i1 = read()
    except (OSError, ValueError, IndexError):
        return float("nan")
    total = t1 - t0
    return usable_cores() * (1 - (i1 - i0) / total) if total > 0 else float("nan")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose_threads(requested: int = 0) -> int:
    """Intra-op threads for a CPU run: `requested`, else torch's current count (OMP_NUM_THREADS or all cores)
    capped at the cores not busy right now (at least 1). Sets torch's thread count and returns it."""
    import torch

    if requested:
        n = requested
    else:
        busy = busy_cores()
        free = usable_cores() - (0.0 if math.isnan(busy) else busy)
        n = max(1, min(torch.get_num_threads(), int(free + 0.5)))
    torch.set_num_threads(n)
    return n


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def conditions(device, dtype: str) -> dict:
    """What a timing ran under: device, dtype, threads, the OpenMP settings, cores and load now."""
    import torch

    dev = str(device)
    machine = machine_facts(device)  # CPU model, ISA, BLAS: what the figure was measured on
    name = machine["device_name"]
    keys = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")
    omp = {k: os.environ[k] for k in keys if k in os.environ}
    return {
        "device": dev,
        "device_name": name,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "omp_env": omp,
        "usable_cores": usable_cores(),
        "busy_cores_before": round(busy_cores(0.2), 2),
        "load_avg_before": load_average(),
        "torch": torch.__version__,
        "machine": machine,
    }


def finish_conditions(cond: dict) -> dict:
    """Add the load after the run to a `conditions` record."""
    return {**cond, "busy_cores_after": round(busy_cores(0.2), 2), "load_avg_after": load_average()}


# ---------------------------------------------------------------- statistics


def median_ci(xs: list[float], conf: float = 0.95) -> tuple[float, float, float]:
    """Median and a distribution-free CI for it: the k-th smallest and k-th largest values, k the largest with
    P(Binomial(n, 1/2) < k) <= (1 - conf) / 2. Under 6 values no such k exists: (min, max)."""
    v = sorted(xs)
    n = len(v)
    if n == 0:
        raise ValueError("median_ci of nothing")
    med = float(np.median(v))
    alpha, k, cdf = (1 - conf) / 2, 0, 0.0
    for j in range(n):  # cdf = P(B <= j - 1) before adding term j
        term = math.comb(n, j) / 2**n
        if cdf + term > alpha:
            break
        cdf += term
        k = j + 1
    k = max(k, 1)
    return med, float(v[k - 1]), float(v[n - k])


def summarize(ratios: list[float]) -> dict:
    """median, 95% CI, IQR, n and the CI's half-width relative to the median."""
    if not ratios:
        return {"median": None, "ci": None, "iqr": None, "n": 0, "rel_ci": None}
    med, lo, hi = median_ci(ratios)
    q1, q3 = np.percentile(ratios, [25, 75])
    return {
        "median": med,
        "ci": [lo, hi],
        "iqr": [float(q1), float(q3)],
        "n": len(ratios),
        "rel_ci": (hi - lo) / 2 / med if med else None,
    }


# ---------------------------------------------------------------- interleaved rounds


@dataclass
class Sample:
    """One side on one unit: tokens (or items) produced, wall seconds, steps (target forwards, train steps)."""

    tokens: float
    seconds: float
    steps: int = 1
    extra: dict = field(default_factory=dict)  # per-side details the caller wants back (stats, costs)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def step_s(self) -> float:
        return self.seconds / max(self.steps, 1)


RunFn = Callable[[str, int], Sample]  # (side, unit) -> Sample


class Interleaved:
    """Rounds of (unit x side) timings; ratios of every side against `base`, median + CI + IQR."""

    def __init__(self, sides: list[str], base: str, cfg: TimingConfig) -> None:
        if base not in sides:
            raise ValueError(f"base side {base!r} is not among {sides}")
        self.sides, self.base, self.cfg = list(sides), base, cfg
        self.samples: dict[tuple[int, int], dict[str, Sample]] = {}  # (unit, round) -> side -> Sample
        self.retimed = 0
        self.outliers: list[tuple[int, int]] = []
        self.rounds = 0

    def order(self, unit: int, rnd: int) -> list[str]:
        k = (unit + rnd) % len(self.sides)  # rotate, so no side always runs first (or right after another)
        return self.sides[k:] + self.sides[:k]

    def time_unit(self, run: RunFn, unit: int, rnd: int, shift: int = 0) -> dict[str, Sample]:
        self.samples[unit, rnd] = {side: run(side, unit) for side in self.order(unit, rnd + shift)}
        return self.samples[unit, rnd]

    def add(self, unit: int, rnd: int, samples: dict[str, Sample]) -> None:
        """A (unit, round) timed by the caller (e.g. the eval stage's first pass, which also builds the turns)."""
        self.samples[unit, rnd] = samples

    def ratios(self, side: str, units: set[int] | None = None) -> list[float]:
        out = []
        for (u, _), s in sorted(self.samples.items()):
            if (units is None or u in units) and s[self.base].rate > 0:
                out.append(s[side].rate / s[self.base].rate)
        return out

    def totals(self, unit: int) -> dict[str, list[float]]:
        """side -> [tokens, seconds] of one unit summed over its timed rounds."""
        rows = [s for (u, _), s in self.samples.items() if u == unit]
        return {
            side: [sum(r[side].tokens for r in rows), sum(r[side].seconds for r in rows)]
            for side in self.sides
        }

    def summary(self, side: str, units: set[int] | None = None) -> dict:
        return summarize(self.ratios(side, units))

    def _median_step(self, side: str) -> float:
        return float(np.median([s[side].step_s for s in self.samples.values()]))

    def out_of_line(self) -> list[tuple[int, int]]:
        """(unit, round)s where some side's s/step is off its median by more than the `outlier` factor."""
        med = {side: self._median_step(side) for side in self.sides}
        f = self.cfg.outlier
        return [
            key
            for key, s in sorted(self.samples.items())
            if any(not med[x] / f <= s[x].step_s <= med[x] * f for x in self.sides if med[x] > 0)
        ]

    def converged(self) -> bool:
        """The CI of every side's median ratio is within rel_ci (and rests on at least 6 pairs)."""
        for side in self.sides:
            if side != self.base:
                r = self.summary(side)
                if r["n"] < 6 or r["rel_ci"] is None or r["rel_ci"] > self.cfg.rel_ci:
                    return False
        return True

    def n_rounds(self) -> int:
        return 1 + max((r for _, r in self.samples), default=-1)

    def retime_outliers(self, run: RunFn, deadline: float) -> None:
        for attempt in range(1, self.cfg.retries + 1):
            bad = self.out_of_line()
            if not bad or time.perf_counter() > deadline:
                break
            for unit, rnd in bad:  # the same (unit, round) again, in another side order
                self.time_unit(run, unit, rnd, shift=attempt)
                self.retimed += 1
        self.outliers = self.out_of_line()

    def run(self, run: RunFn, units: int, budget_s: float | None = None) -> None:
        """Round 0 over all units (unless the caller `add`ed it), then outliers re-timed and further rounds
        until the ratios converge, `budget_s` (default cfg.budget_s) is spent or max_rounds are done."""
        now = time.perf_counter
        deadline = now() + (self.cfg.budget_s if budget_s is None else budget_s)
        if not self.samples:  # a compiled eval's first pass was dropped: round 0 over built graphs, said
            log.info("timing round 1 of up to %d: %d units", self.cfg.max_rounds, units)
            for unit in range(units):
                self.time_unit(run, unit, 0)
        while True:
            self.retime_outliers(run, deadline)
            rnd = self.n_rounds()
            if self.converged() or rnd >= self.cfg.max_rounds or now() > deadline:
                break
            left = deadline - now()
            log.info(
                "timing round %d of up to %d: %d units, %.0f s of budget left",
                rnd + 1,
                self.cfg.max_rounds,
                units,
                left,
            )
            for unit in range(units):
                if now() > deadline:
                    break
                self.time_unit(run, unit, rnd)
        self.rounds = self.n_rounds()

    def pair(self, side: str, name: str | None = None) -> Interleaved:
        """The base and one `side` of these rounds (that side renamed `name`): its ratios, outliers and
        report as if only the two had been timed -- the others still ran in the same rounds, so every side's
        figure rests on the same base timings."""
        if side not in self.sides or side == self.base:
            raise ValueError(f"side {side!r} is not one of the timed sides {self.sides} other than the base")
        name = name or side
        view = Interleaved([self.base, name], self.base, self.cfg)
        view.samples = {k: {self.base: s[self.base], name: s[side]} for k, s in self.samples.items()}
        view.retimed, view.rounds = self.retimed, self.rounds
        view.outliers = view.out_of_line() if view.samples else []
        return view

    def report(self) -> dict:
        """JSON-friendly: per side (not base) the ratio summary; counts of pairs, re-timed and outliers."""
        return {
            "base": self.base,
            "rounds": self.rounds,
            "pairs": len(self.samples),
            "retimed": self.retimed,
            "outliers": len(self.outliers),
            "converged": self.converged(),
            "ratios": {side: self.summary(side) for side in self.sides if side != self.base},
        }
