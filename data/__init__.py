"""Conversation data for drafter training: read chat rows, optionally regenerate the replies with the frozen
backbone (self-distillation), tokenize with labels on assistant tokens only, and cache the result."""

from headstart.data.build import build_datasets
from headstart.data.config import DataConfig, DataError, RegenConfig
from headstart.data.dataset import TokenizedDataset, collate

__all__ = ["DataConfig", "DataError", "RegenConfig", "TokenizedDataset", "build_datasets", "collate"]
