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


def test_t_quantiles_match_scipys():
    from scipy.stats import t

    from headstart.eval.report.wins import t_quantile

    for df in (5, 10, 17, 34, 100):
        assert abs(t_quantile(0.975, df) - t.ppf(0.975, df)) < 0.02
    assert abs(t_quantile(0.975, 2) - t.ppf(0.975, 2)) < 0.15


def test_paired_intervals_by_hand():
    """Two categories of two prompts, log ratios a: +0.3, +0.5 (mean 0.4), b: -0.4, -0.4 (mean -0.4): pooled
    spread s = sqrt((0.01 + 0.01 + 0 + 0) / (4 - 2)) = 0.1, half width t(0.975, 2) * 0.1 / sqrt(2)."""
    import math

    from headstart.eval.report.wins import paired_intervals, t_quantile

    base = [10.0, 10.0, 10.0, 10.0]
    drafter = [10 * math.exp(x) for x in (0.3, 0.5, -0.4, -0.4)]
    got = paired_intervals(drafter, base, ["a", "a", "b", "b"])
    half = t_quantile(0.975, 2) * 0.1 / math.sqrt(2)
    assert math.isclose(got["a"].ratio, math.exp(0.4)) and math.isclose(got["a"].low, math.exp(0.4 - half))
    assert math.isclose(got["b"].high, math.exp(-0.4 + half)) and got["b"].prompts == 2
    assert got["b"].high < 1 < got["a"].low  # b lost beyond noise, a won beyond it
    assert paired_intervals([1.0, 2.0], [1.0, 1.0], ["a", "b"]) is None  # one prompt a category: no spread
