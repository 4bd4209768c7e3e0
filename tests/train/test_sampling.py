"""The training samplers: every row once per epoch, the order a pure function of (seed, epoch), and with
train.group_by_length micro-batches of similar length (little right-padding)."""

from __future__ import annotations

import numpy as np
import pytest

from headstart.train.sampling import EpochShuffle, LengthGrouped


def skewed_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Chat-like lengths: most rows short, a long tail up to the cut (like the EAGLE-3 experiment's rows)."""
    rng = np.random.default_rng(seed)
    return np.minimum(384, 20 + rng.gamma(2.0, 80.0, n)).astype(np.int64)


def padding_ratio(order: list[int], lengths: np.ndarray, batch: int) -> float:
    """Tokens after right-padding each batch to its longest row / real tokens (full batches only)."""
    rows = np.asarray(order[: len(order) // batch * batch]).reshape(-1, batch)
    return float((lengths[rows].max(1) * batch).sum() / lengths[rows].sum())


@pytest.mark.parametrize("n", [1000, 1003])
def test_every_row_once_per_epoch_and_reproducible(n):
    lengths = skewed_lengths(n)
    s = LengthGrouped(lengths, group=8, seed=3)
    first = list(s)
    assert sorted(first) == list(range(n))
    assert list(LengthGrouped(lengths, group=8, seed=3)) == first  # a resumed run rebuilds the same order
    s.set_epoch(1)
    assert list(s) != first and sorted(s) == list(range(n))
    assert list(LengthGrouped(lengths, group=8, seed=4)) != first


def test_groups_hold_similar_lengths():
    lengths = skewed_lengths(4000)
    grouped = padding_ratio(list(LengthGrouped(lengths, group=8, seed=0)), lengths, 8)
    shuffled = padding_ratio(list(EpochShuffle(len(lengths), seed=0)), lengths, 8)
    assert shuffled > 1.4 and grouped < 1.05, (shuffled, grouped)


def test_group_order_is_shuffled_not_sorted():
    """Windows are sorted inside, but the groups are not served longest first (nor in any length order)."""
    lengths = skewed_lengths(4000)
    order = np.asarray(list(LengthGrouped(lengths, group=8, seed=0))).reshape(-1, 8)
    longest = lengths[order].max(1)
    assert not (np.all(np.diff(longest) <= 0) or np.all(np.diff(longest) >= 0))
    window = longest[:64]  # the first 64 groups come from several windows: both long and short ones
    assert window.max() > 2 * window.min()


def test_a_partial_group_comes_last():
    """n not a multiple of the group: the short group is the tail (drop_last drops it), so every full batch
    before it is one of the sorted groups."""
    lengths = skewed_lengths(1003)
    order = list(LengthGrouped(lengths, group=8, seed=1))
    full = np.asarray(order[:1000]).reshape(-1, 8)
    assert all(np.all(np.diff(lengths[g]) <= 0) for g in full)  # each full group: one sorted slice
    assert len(order) - 1000 == 3
