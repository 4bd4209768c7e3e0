"""Sources through `datasets.load_dataset`: local parquet/csv/jsonl files and folders, saved datasets with or
without a `train` split, Hub ids (the same call, checked by intercepting it: no hub here), streaming, and
tokenization over `.map(num_proc=...)`."""

import json

import datasets
import pytest
import torch

from headstart.data import DataConfig, DataError, build_datasets
from headstart.data import loading as loading_module
from headstart.data.loading import open_source
from headstart.data.sources import read_rows
from headstart.models.tiny import tiny_tokenizer


def openai(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}


def rows_of(tmp_path, source: str, **kw):
    cfg = DataConfig(source=source, **kw)
    with open_source(cfg) as src:
        return read_rows(src, cfg.format, cfg, hf_cache=tmp_path / "hf")


def test_parquet_file(tmp_path):
    path = tmp_path / "chats.parquet"
    datasets.Dataset.from_list([openai(i) for i in range(6)]).to_parquet(str(path))
    rows, stats = rows_of(tmp_path, str(path))
    assert stats["format"] == "openai" and stats["source_kind"] == "file" and len(rows) == 6
    assert rows[5].messages[1] == {"role": "assistant", "content": "a5"}


def test_csv_prompt_completion(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text('prompt,completion\n"What is 2+2?","4, of course."\nhi,hello\n')
    rows, stats = rows_of(tmp_path, str(path))
    assert stats["format"] == "prompt_completion" and len(rows) == 2
    assert rows[0].messages == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4, of course."},
    ]


def test_folder_of_data_files(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(json.dumps(openai(i)) for i in range(4)))
    (folder / "test.jsonl").write_text(json.dumps(openai(9)))
    rows, stats = rows_of(tmp_path, str(folder))
    assert stats["source_kind"] == "folder" and len(rows) == 4
    rows, _ = rows_of(tmp_path, str(folder), split="test")
    assert [r.messages[0]["content"] for r in rows] == ["q9"]


def test_saved_dataset_dict_splits(tmp_path):
    one = tmp_path / "one_split"
    datasets.DatasetDict(
        {"train_sft": datasets.Dataset.from_list([openai(i) for i in range(3)])}
    ).save_to_disk(str(one))
    rows, stats = rows_of(tmp_path, str(one))  # the only split, whatever its name
    assert stats["source_kind"] == "saved" and len(rows) == 3

    two = tmp_path / "two_splits"
    datasets.DatasetDict(
        {
            "train_sft": datasets.Dataset.from_list([openai(i) for i in range(3)]),
            "test_sft": datasets.Dataset.from_list([openai(7)]),
        }
    ).save_to_disk(str(two))
    with pytest.raises(DataError, match=r"splits \['train_sft', 'test_sft'\].*data.split="):
        rows_of(tmp_path, str(two))
    rows, _ = rows_of(tmp_path, str(two), split="test_sft")
    assert rows[0].messages[0]["content"] == "q7"

    with_train = tmp_path / "with_train"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list([openai(1)]), "test": datasets.Dataset.from_list([openai(2)])}
    ).save_to_disk(str(with_train))
    rows, _ = rows_of(tmp_path, str(with_train))
    assert rows[0].messages[0]["content"] == "q1"


def test_hub_id_is_the_same_load_dataset_call(tmp_path, monkeypatch):
    """No hub here: intercept `load_dataset` and check a Hub id arrives with split/subset/revision/streaming."""
    local = datasets.Dataset.from_list([openai(i) for i in range(5)])
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return local

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows, stats = rows_of(
        tmp_path, "HuggingFaceH4/ultrachat_200k", split="train_sft[:5]", subset="default", revision="abc123"
    )
    assert len(rows) == 5 and stats["source_kind"] == "hub"
    ((args, kwargs),) = calls
    assert args == ("HuggingFaceH4/ultrachat_200k",)
    assert kwargs == {"split": "train_sft[:5]", "streaming": False, "name": "default", "revision": "abc123"}


def test_unreachable_hub_id_is_a_data_error(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="Hub has no dataset by that name or cannot be reached"):
        rows_of(tmp_path, "someone-xyz/no-such-dataset-here")


def test_missing_local_file_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        rows_of(tmp_path, str(tmp_path / "nope.jsonl"))


def test_streaming_reads_only_what_it_needs(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(json.dumps(openai(i)) for i in range(200)))
    cfg = DataConfig(source=str(path), streaming=True, max_rows=10, eval_rows=4, shuffle_buffer=50)
    with open_source(cfg) as src:
        rows, stats = read_rows(src, cfg.format, cfg, hf_cache=tmp_path / "hf", limit=14)
    assert len(rows) == 14 and stats["records_read"] == 14
    assert sorted(r.row_id for r in rows) != list(range(14))  # the seeded shuffle buffer mixed them
    train, evals, stats = build_datasets(cfg, tiny_tokenizer(), tmp_path / "cache", show_progress=False)
    assert len(train) == 10 and len(evals) == 4


def test_streaming_needs_max_rows():
    with pytest.raises(DataError, match="data.max_rows"):
        DataConfig(source="x.jsonl", streaming=True)


def test_num_proc_tokenization_matches_one_process(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(openai(i)) for i in range(150)) + '\n{"messages": []}\n')
    tok = tiny_tokenizer()
    a = build_datasets(DataConfig(source=str(path), eval_rows=4), tok, tmp_path / "a", show_progress=False)
    b = build_datasets(
        DataConfig(source=str(path), eval_rows=4, num_proc=2), tok, tmp_path / "b", show_progress=False
    )
    for x, y in zip(a[:2], b[:2]):
        assert len(x) == len(y) == len(x)
        for i in range(len(x)):
            assert x[i]["row_id"] == y[i]["row_id"] and torch.equal(x[i]["input_ids"], y[i]["input_ids"])
            assert torch.equal(x[i]["labels"], y[i]["labels"])
    assert a[2]["skipped"] == b[2]["skipped"] == {"empty conversation": 1}


def test_load_is_the_only_reader_for_clean_files(tmp_path, monkeypatch):
    """A clean JSONL file goes through datasets, not the record-by-record fallback."""
    path = tmp_path / "clean.jsonl"
    path.write_text("\n".join(json.dumps(openai(i)) for i in range(3)))
    monkeypatch.setattr(loading_module, "_json_records", lambda *a: pytest.fail("fallback reader used"))
    rows, _ = rows_of(tmp_path, str(path))
    assert len(rows) == 3
