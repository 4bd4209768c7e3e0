"""Reading rows: file formats, format detection, bad rows counted per reason, truncated JSON recovery."""

import json
import logging

import pytest

from headstart.data import DataError, jsonio
from headstart.data.config import DataConfig
from headstart.data.loading import open_source
from headstart.data.sources import read_rows


def sharegpt(i: int, first: str = "human") -> dict:
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": first, "value": f"question {i} é你"},
            {"from": "gpt", "value": f"answer {i}"},
        ],
    }


def openai(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}


def test_json_array_and_role_mapping(tmp_path):
    rec = {
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "user", "value": "u1"},
            {"from": "chatgpt", "value": "a1"},
            {"from": "human", "value": "u2"},
            {"from": "bard", "value": "a2"},
            {"from": "human", "value": "trailing user turn: no label, dropped"},
        ]
    }
    path = tmp_path / "d.json"
    path.write_text(json.dumps([rec, sharegpt(1)]))
    rows, stats = read_rows(path)
    assert stats["format"] == "sharegpt" and stats["usable_rows"] == 2 and stats["skipped"] == {}
    assert [m["role"] for m in rows[0].messages] == ["system", "user", "assistant", "user", "assistant"]
    assert rows[0].messages[-1]["content"] == "a2"
    assert rows[1].row_id == 1 and rows[1].messages[0]["content"] == "question 1 é你"


def test_jsonl_openai_detected(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(openai(i)) for i in range(3)) + "\n")
    rows, stats = read_rows(path)
    assert stats["format"] == "openai" and len(rows) == 3
    assert rows[2].messages == [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]


def test_bad_rows_counted_per_reason_with_examples(tmp_path, caplog):
    bad = [
        {"conversations": []},
        {"conversations": [{"from": "robot", "value": "x"}, {"from": "gpt", "value": "y"}]},
        {"conversations": [{"from": "human", "value": "only a question"}]},
        {
            "conversations": [
                {"from": "human", "value": ["not", "a", "string"]},
                {"from": "gpt", "value": "y"},
            ]
        },
        {"conversations": [{"from": "human"}, {"from": "gpt", "value": "y"}]},
        {"no_conversations": 1},
    ]
    lines = (
        [json.dumps(sharegpt(0))]
        + [json.dumps(b) for b in bad]
        + ["{this is not json", json.dumps(sharegpt(1))]
    )
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines))
    with caplog.at_level(logging.WARNING, logger="headstart.data"):
        rows, stats = read_rows(path)
    assert [r.row_id for r in rows] == [0, 8]
    skipped = stats["skipped"]
    assert skipped.pop("empty conversation") == 1
    assert skipped.pop("unknown role") == 1
    assert skipped.pop("no assistant turn") == 1
    assert skipped.pop("non-string content") == 1
    assert skipped.pop("malformed JSON line") == 1
    assert sum(n for reason, n in skipped.items() if reason.startswith("missing keys")) == 2
    assert "robot" in stats["skipped_examples"]["unknown role"]
    assert "line 8" in stats["skipped_examples"]["malformed JSON line"]
    for reason in stats["skipped_examples"]:
        assert any(reason in r.getMessage() for r in caplog.records), f"reason {reason!r} not logged"


def test_leading_assistant_turns_dropped(tmp_path):
    path = tmp_path / "d.json"
    rec = {
        "conversations": [{"from": "gpt", "value": "hello, how can I help?"}, *sharegpt(0)["conversations"]]
    }
    path.write_text(json.dumps([rec, {"conversations": [{"from": "gpt", "value": "alone"}]}]))
    rows, stats = read_rows(path)
    assert [m["role"] for m in rows[0].messages] == ["user", "assistant"]
    assert stats["skipped"] == {"no assistant turn": 1}


def test_no_usable_row_names_file_counts_and_fix(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"conversations": []}\nnot json\n')
    with pytest.raises(DataError) as e:
        read_rows(path)
    msg = str(e.value)
    assert str(path) in msg and "empty conversation: 1" in msg and "malformed JSON line: 1" in msg
    assert "Fix:" in msg


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(DataError, match="nope.json"), open_source(DataConfig(source=str(missing))):
        pass


def test_forced_format_mismatch_is_missing_keys(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(openai(0)) + "\n" + json.dumps(sharegpt(1)) + "\n")
    rows, stats = read_rows(path, "sharegpt")
    assert [r.row_id for r in rows] == [1]
    assert list(stats["skipped"]) == ["missing keys (no 'conversations' list)"]


@pytest.mark.parametrize("cut", [0.25, 0.5, 0.9, 0.999])
def test_truncated_json_array_recovers_complete_records(tmp_path, monkeypatch, cut):
    monkeypatch.setattr(
        jsonio, "CHUNK_CHARS", 97
    )  # many chunk boundaries, some inside multi-byte chars' records
    text = json.dumps([sharegpt(i) for i in range(40)], indent=2, ensure_ascii=False)
    cut_at = int(len(text) * cut)
    path = tmp_path / "cut.json"
    path.write_text(text[:cut_at], encoding="utf-8")
    complete = sum(1 for i in range(40) if text.index(f'"c{i}"') < cut_at and _record_end(text, i) <= cut_at)
    tally = jsonio.ReadTally()
    records = list(jsonio.iter_json_array(path, tally))
    assert len(records) == complete and records == [sharegpt(i) for i in range(complete)]
    last_end = _record_end(text, complete - 1) if complete else 1
    assert tally.partial_records_dropped == (1 if text[last_end:cut_at].strip(" \n,") else 0)
    rows, stats = read_rows(path)
    assert stats["partial_records_dropped"] == tally.partial_records_dropped


def _record_end(text: str, i: int) -> int:
    """Index just past record i's closing brace in the pretty-printed array."""
    start = text.rindex("{", 0, text.index(f'"c{i}"'))
    _, end = json.JSONDecoder().raw_decode(text, start)
    return end


def test_complete_json_array_drops_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonio, "CHUNK_CHARS", 64)
    path = tmp_path / "d.json"
    path.write_text(json.dumps([sharegpt(i) for i in range(10)]))
    rows, stats = read_rows(path)
    assert len(rows) == 10 and stats["partial_records_dropped"] == 0


def test_saved_hf_dataset_folder(tmp_path):
    import datasets

    folder = tmp_path / "hf"
    datasets.Dataset.from_list([openai(i) for i in range(5)]).save_to_disk(str(folder))
    rows, stats = read_rows(folder)
    assert stats["format"] == "openai" and len(rows) == 5
    assert rows[4].messages[1] == {"role": "assistant", "content": "a4"}


def test_folder_that_is_not_a_dataset(tmp_path):
    (tmp_path / "junk").mkdir()
    with pytest.raises(DataError, match="neither a saved HF dataset nor a folder of data files"):
        read_rows(tmp_path / "junk")
