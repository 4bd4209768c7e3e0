"""A shuffling sampler whose order is a pure function of (seed, epoch): the same permutation on every rank
and after a resume, so `skip_first_batches` lands on exactly the rows a killed run had not seen yet, and one
process with batch 2b sees the same rows per step as two processes with batch b. (accelerate's own seedable
sampler is pickled into checkpoints; this one needs no state beyond the step count.)"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class EpochShuffle(Sampler[int]):
    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())
