"""The one "faster in N categories" rule (eval/report/wins.py), by hand: a lead within 2% is a tie, not a win."""

from __future__ import annotations

from headstart.eval.report.wins import Wins, beats, category_wins


def test_a_lead_within_the_band_is_a_tie_and_only_a_clear_lead_wins():
    assert beats(1.03, 1.00) and not beats(1.02, 1.00) and not beats(1.00, 1.00) and not beats(0.99, 1.00)
    assert beats(0.1, None) and not beats(None, 0.1)  # a missing figure counts as 0
    drafter = {"a": 1.30, "b": 1.00, "c": 1.10, "d": 1.49, "e": 1.20}
    lookup = {"a": 1.20, "b": 1.50, "c": 1.10, "d": 1.50, "e": 1.19}
    # a: won (+8%); b: lost; c: equal; d: -0.7%; e: +0.8%: ties, none of them a win
    assert category_wins(drafter, lookup) == Wins(won=1, tied=3, of=5)
    assert category_wins(drafter, lookup, tie=0.0) == Wins(won=2, tied=1, of=5)
