"""Self-distillation: turn-by-turn regeneration, left padding, end-of-turn stripping, resumable cache."""

import json
import logging

import pytest
import torch

from headstart.data import DataConfig, RegenConfig, build_datasets
from headstart.data.chat import IGNORE, end_of_turn_text
from headstart.data.selfdistill import decode_reply


def conversation(i: int, turns: int) -> dict:
    conv = []
    for t in range(turns):
        question = f"q{i}.{t}" + "?" * (i % 3)  # prompts of different lengths, so batches need padding
        conv += [{"from": "human", "value": question}, {"from": "gpt", "value": f"original a{i}.{t}"}]
    return {"conversations": conv}


def write_source(path, n: int, turns: int = 1) -> None:
    path.write_text(json.dumps([conversation(i, turns) for i in range(n)]))


class ScriptedGenerate:
    """Stands in for `model.generate`: each prompt gets the reply 'R<n>' and then <|im_end|>; records prompts."""

    def __init__(self, tokenizer, fail_on_call: int | None = None):
        self.tok, self.fail_on_call = tokenizer, fail_on_call
        self.prompts: list[str] = []
        self.calls = 0

    def __call__(self, input_ids, attention_mask, pad_token_id, eos_token_id, **kw):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("simulated crash")
        width = input_ids.shape[1]
        for ids, mask in zip(input_ids, attention_mask):
            n = int(mask.sum())
            assert mask[width - n :].all() and (ids[: width - n] == pad_token_id).all(), "not left-padded"
            self.prompts.append(self.tok.decode(ids[width - n :].tolist()))
        end = self.tok.convert_tokens_to_ids("<|im_end|>")
        assert end in eos_token_id
        replies = [
            self.tok(f"R{len(self.prompts) - len(input_ids) + b}")["input_ids"] for b in range(len(input_ids))
        ]
        longest = max(len(r) for r in replies) + 1
        new = [r + [end] + [pad_token_id] * (longest - len(r) - 1) for r in replies]
        return torch.cat([input_ids, torch.tensor(new, dtype=input_ids.dtype)], dim=1)


def regen_cfg(source, **regen) -> DataConfig:
    return DataConfig(
        source=str(source), eval_rows=2, max_length=128, responses="regenerated", regen=RegenConfig(**regen)
    )


def test_turn_by_turn_regeneration(backbone, tmp_path, monkeypatch):
    source = tmp_path / "d.json"
    write_source(source, n=4, turns=3)
    fake = ScriptedGenerate(backbone.tokenizer)
    monkeypatch.setattr(backbone.model, "generate", fake)
    tok = backbone.tokenizer
    train, evals, stats = build_datasets(
        regen_cfg(source, max_turns=2, batch_size=3), tok, tmp_path, backbone
    )
    assert len(train) == 2 and len(evals) == 2 and stats["train_regen"]["generated"] == 2
    assert fake.calls == 4  # (eval, train) x (turn 1, turn 2)
    for prompt in fake.prompts:
        assert (
            prompt.endswith("<|im_start|>assistant\n") and "original" not in prompt
        )  # earlier turns rewritten
    for ds in (train, evals):
        for i in range(len(ds)):
            item = ds[i]
            text = tok.decode(item["input_ids"].tolist())
            n = item["row_id"]
            assert (
                f"q{n}.0" in text and f"q{n}.1" in text and f"q{n}.2" not in text
            )  # 2 turns kept, 3rd dropped
            labeled = tok.decode(item["input_ids"][item["labels"] != IGNORE].tolist())
            assert labeled.count("<|im_end|>\n") == 2 and labeled.startswith(
                "R"
            )  # stripped reply + one end-of-turn
    regen_files = list((tmp_path / "regen").glob("*.jsonl"))
    records = [json.loads(line) for line in regen_files[0].read_text().splitlines()]
    assert len(records) == 4 and all("<|im_end|>" not in m["content"] for r in records for m in r["messages"])
    assert all(not r["open_end"] and len(r["messages"]) == 4 for r in records)


def test_interrupted_run_resumes(backbone, tmp_path, monkeypatch):
    source = tmp_path / "d.json"
    write_source(source, n=8)
    cfg = regen_cfg(source, batch_size=2)  # eval: 1 batch of 2; train: 3 batches of 2
    crashing = ScriptedGenerate(backbone.tokenizer, fail_on_call=2)
    monkeypatch.setattr(backbone.model, "generate", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_datasets(cfg, backbone.tokenizer, tmp_path, backbone, show_progress=False)
    (regen_file,) = (tmp_path / "regen").glob("*.jsonl")
    assert len(regen_file.read_text().splitlines()) == 2  # the finished first batch was flushed
    assert not (tmp_path / "tokenized").exists() or not list((tmp_path / "tokenized").iterdir())

    resumed = ScriptedGenerate(backbone.tokenizer)
    monkeypatch.setattr(backbone.model, "generate", resumed)
    train, evals, stats = build_datasets(cfg, backbone.tokenizer, tmp_path, backbone, show_progress=False)
    assert len(resumed.prompts) == 6 and len(train) == 6 and len(evals) == 2  # only the rows not done before
    assert stats["eval_regen"] == {"generated": 0, "cached": 2, "cut_by_max_new_tokens": 0}
    assert len(regen_file.read_text().splitlines()) == 8


def test_real_tiny_model_greedy_is_deterministic_and_batch_independent(backbone, tmp_path):
    source = tmp_path / "d.json"
    write_source(source, n=6)
    outputs = []
    for batch_size in (4, 1):
        cfg = regen_cfg(source, max_new_tokens=5, batch_size=batch_size)
        cache = tmp_path / f"cache{batch_size}"
        build_datasets(cfg, backbone.tokenizer, cache, backbone, show_progress=False)
        (regen_file,) = (cache / "regen").glob("*.jsonl")
        recs = sorted(
            (json.loads(line) for line in regen_file.read_text().splitlines()), key=lambda r: r["row_id"]
        )
        outputs.append([r["messages"] for r in recs])
        assert all(r["open_end"] for r in recs)  # a random model does not stop within 5 tokens
    assert outputs[0] == outputs[1]  # left padding + attention mask: batching does not change greedy output


def test_cut_reply_gets_no_end_of_turn_label(backbone, tmp_path):
    source = tmp_path / "d.json"
    write_source(source, n=3)
    cfg = regen_cfg(source, max_new_tokens=3)
    train, _, stats = build_datasets(cfg, backbone.tokenizer, tmp_path, backbone, show_progress=False)
    item = train[0]
    assert stats["train_regen"]["cut_by_max_new_tokens"] == 1
    assert item["labels"][-1] != IGNORE and item["input_ids"][-1] != backbone.tokenizer.eos_token_id


def test_prompt_too_long_to_regenerate_is_skipped(backbone, tmp_path, monkeypatch):
    source = tmp_path / "d.json"
    rows = [conversation(i, 1) for i in range(4)]
    rows[1]["conversations"][0]["value"] = "long " * 40
    source.write_text(json.dumps(rows))
    monkeypatch.setattr(backbone.model, "generate", ScriptedGenerate(backbone.tokenizer))
    cfg = DataConfig(source=str(source), eval_rows=0, max_length=64, responses="regenerated")
    train, _, stats = build_datasets(cfg, backbone.tokenizer, tmp_path, backbone, show_progress=False)
    assert len(train) == 3 and 1 not in [train[i]["row_id"] for i in range(3)]
    assert list(stats["skipped"]) == ["prompt too long to regenerate (>= max_length tokens)"]


def test_decode_strips_end_of_turn(backbone):
    tok = backbone.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok("hi")["input_ids"]
    assert decode_reply(tok, ids + [end] + tok("junk")["input_ids"], {end}, "<|im_end|>\n") == ("hi", True)
    assert decode_reply(tok, ids, {end}, "<|im_end|>\n") == ("hi", False)
    assert decode_reply(tok, tok("ok</s>\nx")["input_ids"], {end}, "</s>\n") == (
        "ok",
        True,
    )  # spelled as text
    assert end_of_turn_text(tok) == "<|im_end|>\n"


@pytest.mark.parametrize("how", ["flipped", "edited"])
def test_damaged_cached_record_is_generated_again_naming_the_file(
    backbone, tmp_path, monkeypatch, caplog, how
):
    source = tmp_path / "d.json"
    write_source(source, n=6)
    cfg = regen_cfg(source, batch_size=2)
    monkeypatch.setattr(backbone.model, "generate", ScriptedGenerate(backbone.tokenizer))
    build_datasets(cfg, backbone.tokenizer, tmp_path, backbone, show_progress=False)
    (regen_file,) = (tmp_path / "regen").glob("*.jsonl")
    lines = regen_file.read_bytes().splitlines(keepends=True)
    line = lines[3]
    at = line.index(b'"content"') + 12
    if how == "flipped":  # undecodable bytes
        line = line[:at] + bytes(b ^ 0xFF for b in line[at : at + 4]) + line[at + 4 :]
    else:  # still valid JSON of the same size: only the digest tells
        line = line[:at] + (b"X" if line[at : at + 1] != b"X" else b"Y") + line[at + 1 :]
    regen_file.write_bytes(b"".join(lines[:3] + [line] + lines[4:]))
    for cache in (tmp_path / "tokenized").glob("*"):
        cache.unlink()  # so the regenerated text is read again
    again = ScriptedGenerate(backbone.tokenizer)
    monkeypatch.setattr(backbone.model, "generate", again)
    with caplog.at_level(logging.WARNING, logger="headstart.data"):
        build_datasets(cfg, backbone.tokenizer, tmp_path, backbone, show_progress=False)
    assert len(again.prompts) == 1  # only the damaged record
    assert f"{regen_file}: 1 records are not whole" in caplog.text
