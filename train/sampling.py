"""Shuffling samplers whose order is a pure function of (seed, epoch): the same permutation on every rank and
after a resume, so `skip_first_batches` lands on exactly the rows a killed run had not seen yet, and one
process with batch 2b sees the same rows per step as two processes with batch b. (accelerate's own seedable
sampler is pickled into checkpoints; these need no state beyond the step count.)"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Sampler


class EpochShuffle(Sampler[int]):
    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def epoch_rng(self) -> torch.Generator:
        """This epoch's generator (not named `generator`: accelerate reads that as a sampler's state)."""
        return torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.epoch_rng()).tolist())


class LengthGrouped(EpochShuffle):
    """`train.group_by_length`: EpochShuffle's permutation cut into windows of `window` groups; each window's
    rows sorted by length and cut into groups of `group` rows (one global micro-batch: micro_batch_size x
    processes), then the full groups' order shuffled (a partial group stays last, where drop_last drops it).
    Every micro-batch then holds rows of similar length, so right-padding to the longest wastes little
    (HF's `group_by_length` megabatches). Each row is still seen once per epoch.

    Measured on the EAGLE-3 experiment's 4,603 rows (180 tokens on average, at most 384), batch 8: random
    batches pad to 1.54x the real tokens, grouped ones to 1.01x."""

    def __init__(self, lengths: np.ndarray, group: int, seed: int, window: int = 64) -> None:
        super().__init__(len(lengths), seed)
        self.lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.long)  # (N,)
        self.group, self.window = group, window

    def __iter__(self):
        g = self.epoch_rng()
        perm = torch.randperm(self.n, generator=g)
        groups: list[torch.Tensor] = []
        for s in range(0, self.n, self.group * self.window):
            rows = perm[s : s + self.group * self.window]
            order = torch.sort(self.lengths[rows], descending=True, stable=True).indices
            groups += rows[order].split(self.group)
        full = [x for x in groups if len(x) == self.group]
        rest = [x for x in groups if len(x) < self.group]  # at most one: the last window's tail
        shuffled = [full[i] for i in torch.randperm(len(full), generator=g).tolist()]
        return iter(torch.cat(shuffled + rest).tolist() if groups else [])
