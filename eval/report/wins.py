"""The one rule for "the drafter is faster than a baseline in N categories", used by the eval stage's comparison
(eval/report/compare.py) and by the serve check's (eval/serving/baselines.py).

A category is a win only when the drafter's speedup exceeds the baseline's by more than `TIE` (2%), a loss when
it is more than 2% below, and a tie in between. Per-category speedups come from a few prompts each and move by a
few percent between runs on the same code, so a lead inside that band is not evidence the drafter is faster:
it is reported as a tie, never counted as a win. (Of the two rules this replaces, `>=` counted an exact tie as a
win and `>= baseline * 0.98` counted a drafter up to 2% slower as a win; both flattered the drafter.)

Beyond the band, `paired_intervals` says whether a category is won or lost beyond noise: per prompt, the ratio
of the two token rates measured on that prompt side by side; per category, their geometric mean with a
t-interval whose spread is pooled over all categories (the scatter of prompts around their category's mean,
timing noise and prompt-to-prompt differences alike), so that three prompts a category still give an interval.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from statistics import NormalDist

TIE = 0.02  # relative band within which two speedups are a tie


def beats(drafter: float | None, baseline: float | None, tie: float = TIE) -> bool:
    """The drafter's speedup exceeds the baseline's by more than `tie` (a missing figure counts as 0)."""
    return (drafter or 0.0) > (baseline or 0.0) * (1 + tie)


@dataclass(frozen=True)
class Wins:
    won: int  # categories where the drafter is faster beyond the tie band
    tied: int  # categories within the band either way
    of: int  # categories compared


def category_wins(
    drafter: dict[str, float | None], baseline: dict[str, float | None], tie: float = TIE
) -> Wins:
    """Speedups by category of the drafter and of a baseline (the same categories) -> won / tied / of."""
    won = sum(beats(drafter[c], baseline.get(c), tie) for c in drafter)
    lost = sum(beats(baseline.get(c), drafter[c], tie) for c in drafter)
    return Wins(won, len(drafter) - won - lost, len(drafter))


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (Cornish-Fisher expansion about the normal's; within 0.02 of the exact value from 5
    degrees of freedom, 0.13 at 2)."""
    z = NormalDist().inv_cdf(p)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True)
class Interval:
    ratio: float  # geometric mean over the category's prompts of (drafter's rate / baseline's rate)
    low: float
    high: float
    prompts: int


def paired_intervals(
    drafter: list[float], baseline: list[float], categories: list[str], level: float = 0.95
) -> dict[str, Interval] | None:
    """Per category, the paired ratio of two methods' per-prompt token rates (same prompts, timed side by side)
    with its `level` interval, the spread pooled over every category; None when no category has two prompts (no
    spread to pool: one prompt a category cannot tell noise from a loss)."""
    logs: dict[str, list[float]] = defaultdict(list)
    for a, b, c in zip(drafter, baseline, categories, strict=True):
        logs[c].append(math.log(a / b))
    df = len(drafter) - len(logs)
    if df < 1:
        return None
    means = {c: sum(v) / len(v) for c, v in logs.items()}
    s = math.sqrt(sum((x - means[c]) ** 2 for c, v in logs.items() for x in v) / df)
    t = t_quantile(0.5 + level / 2, df)
    out = {}
    for c, v in logs.items():
        half = t * s / math.sqrt(len(v))
        out[c] = Interval(math.exp(means[c]), math.exp(means[c] - half), math.exp(means[c] + half), len(v))
    return out
