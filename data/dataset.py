"""The tokenized split as a torch Dataset, and the right-padding collate function."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from headstart.data.chat import IGNORE


class TokenizedDataset(Dataset):
    """Samples stored flat (see `cache.pack`); item i is {"input_ids": (T,), "labels": (T,), "row_id": int}."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.input_ids = arrays["input_ids"]  # (sum T,) int32
        self.labels = arrays["labels"]  # (sum T,) int32
        self.offsets = arrays["offsets"]  # (N + 1,) int64
        self.row_ids = arrays["row_ids"]  # (N,) int64

    def __len__(self) -> int:
        return len(self.row_ids)

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i = i % len(self)
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return {
            "input_ids": torch.from_numpy(self.input_ids[a:b].astype(np.int64)),  # (T,)
            "labels": torch.from_numpy(self.labels[a:b].astype(np.int64)),  # (T,)
            "row_id": int(self.row_ids[i]),
        }

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sample (N,), e.g. for length-grouped batching."""
        return np.diff(self.offsets)


def collate(items: list[dict], pad_id: int) -> dict:
    """Right-pad a list of items to the longest: input_ids / attention_mask / labels (B, T), row_ids (B,)."""
    width = max(len(it["input_ids"]) for it in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(items), width), IGNORE, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(items), width), dtype=torch.long)  # (B, T)
    for b, it in enumerate(items):
        n = len(it["input_ids"])
        ids[b, :n] = it["input_ids"]
        labels[b, :n] = it["labels"]
        mask[b, :n] = 1
    row_ids = torch.tensor([it["row_id"] for it in items], dtype=torch.long)  # (B,)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "row_ids": row_ids}
