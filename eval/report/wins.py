"""The one rule for "the drafter is faster than a baseline in N categories", used by the eval stage's comparison
(eval/report/compare.py) and by the serve check's (eval/serving/baselines.py).

A category is a win only when the drafter's speedup exceeds the baseline's by more than `TIE` (2%), a loss when
it is more than 2% below, and a tie in between. Per-category speedups come from a few prompts each and move by a
few percent between runs on the same code, so a lead inside that band is not evidence the drafter is faster:
it is reported as a tie, never counted as a win. (Of the two rules this replaces, `>=` counted an exact tie as a
win and `>= baseline * 0.98` counted a drafter up to 2% slower as a win; both flattered the drafter.)
"""

from __future__ import annotations

from dataclasses import dataclass

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
