"""Prompt files in the Spec-Bench / MT-bench format: good rows, bad rows counted, limits, multi-turn chat."""

from __future__ import annotations

import json

import pytest

from headstart.eval.errors import EvalError
from headstart.eval.stage.config import DEFAULT_PROMPTS
from headstart.eval.stage.prompts import chat_ids, load_prompts
from headstart.models.tiny import tiny_tokenizer


def write(tmp_path, lines: list) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_good_bad_and_duplicate_rows(tmp_path):
    path = write(
        tmp_path,
        [
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Make it rhyme."]},
            {"question_id": "q2", "category": "math", "turns": ["1+1?"], "source": "x"},
            "",  # blank lines are not rows
            "{broken json",
            {"question_id": 3, "category": "math", "turns": []},
            {"question_id": 4, "turns": ["no category"]},
            {"question_id": 5, "category": "math", "turns": ["ok", 7]},
            ["not", "an", "object"],
            {"question_id": "q2", "category": "math", "turns": ["duplicate id"]},
            {"question_id": True, "category": "math", "turns": ["bool id"]},
        ],
    )
    ps = load_prompts(path)
    assert [p.question_id for p in ps.prompts] == ["81", "q2"]
    assert ps.prompts[0].turns == ["Write a poem.", "Make it rhyme."]
    assert ps.bad_rows == 7
    assert len(ps.bad_examples) == 5  # a few examples, each naming its line and cause
    assert ps.bad_examples[0].startswith("line 4: not JSON")
    assert "turns" in ps.bad_examples[1] and "category" in ps.bad_examples[2]
    assert ps.categories == {"writing": 1, "math": 1}


def test_limit_per_category_keeps_the_first(tmp_path):
    rows = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"q{i}"]} for i in range(7)]
    ps = load_prompts(write(tmp_path, rows), limit_per_category=2)
    assert [p.question_id for p in ps.prompts] == ["0", "1", "2", "3"]
    assert ps.bad_rows == 0


def test_all_bad_or_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(EvalError, match="no usable row.*2 bad"):
        load_prompts(write(tmp_path, ["nope", {"question_id": 1}]))
    with pytest.raises(EvalError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")


def test_packaged_default_prompts():
    ps = load_prompts(DEFAULT_PROMPTS)
    assert len(ps.prompts) == 238 and ps.bad_rows == 0
    assert ps.categories["alpaca"] == 80 and ps.categories["coding_humaneval"] == 80


def test_multi_turn_chat_puts_the_answer_before_the_next_turn():
    tok = tiny_tokenizer()
    first = chat_ids(tok, [{"role": "user", "content": "Hi"}])
    second = chat_ids(
        tok,
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ],
    )
    text = tok.decode(second)
    assert text.index("Hi") < text.index("Hello!") < text.index("Bye")
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(first) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
