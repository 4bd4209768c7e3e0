"""build_datasets: seeded disjoint splits, item format, collate, and a cache that only the same inputs reuse."""

import json
import os

import pytest
import torch

from headstart.data import DataConfig, DataError, RegenConfig, build_datasets, collate
from headstart.data import build as build_module
from headstart.data.chat import IGNORE
from headstart.models.tiny import tiny_tokenizer


def write_source(path, n: int = 30) -> None:
    rows = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": f"question number {i}"},
                {"from": "gpt", "value": f"answer {i} " + "z" * (i % 7) * 20},
            ],
        }
        for i in range(n)
    ]
    rows.insert(3, {"conversations": []})  # one bad row, skipped and counted
    path.write_text(json.dumps(rows))


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "chats.json"
    write_source(path)
    return path


def build(source, cache_dir, tokenizer=None, **kw):
    cfg = DataConfig(source=str(source), **{"eval_rows": 5, "max_length": 64, **kw})
    return build_datasets(cfg, tokenizer or tiny_tokenizer(), cache_dir, show_progress=False)


class ReadCounter:
    """Wraps `read_rows` to count how often the source is actually read."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = build_module.read_rows

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(build_module, "read_rows", counted)


def test_splits_items_and_stats(source, tmp_path):
    train, evals, stats = build(source, tmp_path / "cache", max_rows=12)
    assert len(evals) == 5 and len(train) == 12
    train_ids = {train[i]["row_id"] for i in range(len(train))}
    eval_ids = {evals[i]["row_id"] for i in range(len(evals))}
    assert not train_ids & eval_ids and 3 not in train_ids | eval_ids  # disjoint; the bad row is gone
    item = train[0]
    assert item["input_ids"].dtype == torch.long and item["labels"].shape == item["input_ids"].shape
    assert (item["labels"] == IGNORE).any() and (item["labels"] != IGNORE).any()
    assert stats["records_read"] == 31 and stats["skipped"] == {"empty conversation": 1}
    assert stats["train"]["samples"] == 12 and stats["train"]["truncated"] > 0  # long answers truncated, kept
    assert all(len(train[i]["input_ids"]) <= 64 for i in range(len(train)))
    assert 0 < stats["train"]["labeled_fraction"] < 1 and stats["cache_hit"] is False


def test_labels_belong_to_the_row(source, tmp_path):
    tok = tiny_tokenizer()
    train, _, _ = build(source, tmp_path / "cache", tokenizer=tok, max_length=512)
    rows = json.loads(source.read_text())
    for i in range(len(train)):
        item = train[i]
        reply = rows[item["row_id"]]["conversations"][1]["value"]
        assert tok.decode(item["input_ids"][item["labels"] != IGNORE].tolist()) == reply + "<|im_end|>\n"


def test_eval_set_does_not_move_with_max_rows(source, tmp_path):
    _, eval_a, _ = build(source, tmp_path / "a", max_rows=3)
    train_b, eval_b, _ = build(source, tmp_path / "b", max_rows=20)
    ids = [[ds[i]["row_id"] for i in range(len(ds))] for ds in (eval_a, eval_b)]
    assert ids[0] == ids[1]
    _, eval_c, _ = build(source, tmp_path / "c", seed=1)
    assert [eval_c[i]["row_id"] for i in range(len(eval_c))] != ids[0]


def test_collate_right_pads():
    items = [
        {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([IGNORE, 6, 7]), "row_id": 4},
        {"input_ids": torch.tensor([8]), "labels": torch.tensor([8]), "row_id": 9},
    ]
    batch = collate(items, pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6, 7], [8, IGNORE, IGNORE]]
    assert batch["row_ids"].tolist() == [4, 9]


def test_second_call_loads_from_cache_without_reading_source(source, tmp_path, monkeypatch):
    counter = ReadCounter(monkeypatch)
    train1, eval1, stats1 = build(source, tmp_path / "cache")
    train2, eval2, stats2 = build(source, tmp_path / "cache")
    assert counter.calls == 1 and stats2["cache_hit"] and stats2["cache_file"] == stats1["cache_file"]
    for a, b in ((train1, train2), (eval1, eval2)):
        assert len(a) == len(b)
        for i in range(len(a)):
            assert torch.equal(a[i]["input_ids"], b[i]["input_ids"]) and torch.equal(
                a[i]["labels"], b[i]["labels"]
            )
    files = list(
        (tmp_path / "cache" / "tokenized").rglob("*")
    )  # (cache/hf: datasets' Arrow copy of the file)
    assert [f.suffix for f in files if f.is_file()] == [".safetensors"]  # no pickle, no temp leftovers


def test_other_tokenizer_or_config_or_source_does_not_reuse_cache(source, tmp_path, monkeypatch):
    counter = ReadCounter(monkeypatch)
    cache = tmp_path / "cache"
    build(source, cache)
    other_vocab = tiny_tokenizer()
    other_vocab.add_tokens(["<extra>"])
    build(source, cache, tokenizer=other_vocab)
    other_template = tiny_tokenizer()
    other_template.chat_template = other_template.chat_template.replace("\n", "\n\n")
    build(source, cache, tokenizer=other_template)
    build(source, cache, max_length=48)
    assert counter.calls == 4
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same content, newer file
    build(source, cache)
    assert counter.calls == 5
    assert len(list((cache / "tokenized").iterdir())) == 5


def test_corrupt_cache_is_rebuilt(source, tmp_path, monkeypatch):
    counter = ReadCounter(monkeypatch)
    _, _, stats = build(source, tmp_path / "cache")
    with open(stats["cache_file"], "r+b") as f:
        f.write(b"garbage!")
    train, _, stats = build(source, tmp_path / "cache")
    assert counter.calls == 2 and not stats["cache_hit"] and len(train) > 0


def test_config_range_checks():
    for bad in (
        {"format": "csv"},
        {"responses": "distilled"},
        {"max_length": 4},
        {"max_rows": 0},
        {"eval_rows": -1},
    ):
        with pytest.raises(DataError, match="Fix:"):
            DataConfig(**bad)
    with pytest.raises(DataError, match="max_turns"):
        RegenConfig(max_turns=0)
    assert DataConfig(regen={"max_turns": 2}).regen.max_turns == 2


def test_errors_name_cause_and_fix(source, tmp_path):
    with pytest.raises(DataError, match="eval_rows"):
        build(source, tmp_path / "c", eval_rows=30)
    with pytest.raises(DataError, match="backbone"):
        build(source, tmp_path / "c", responses="regenerated")
    with pytest.raises(DataError, match="does-not-exist.json"):
        build(tmp_path / "does-not-exist.json", tmp_path / "c")
