"""data.source=backbone: user prompts written by the backbone (Magpie), filtered, cached, resumed, answered."""

import json

import pytest
import torch

from headstart.data import DataConfig, build_datasets
from headstart.data.config import DataError, PromptsConfig, RegenConfig
from headstart.data.self_prompts import user_prefix

# what the scripted model "writes" as user prompts, in order: one cut (no end of turn), one too short, one
# repeated; the rest usable
WRITTEN = ["How do I sort a list?", "CUT", "hi", "Explain tides to a child.", "How do I sort a list?"]
WRITTEN += [f"Write a haiku about the number {k}." for k in range(40)]


class ScriptedModel:
    """Stands in for `model.generate`: after a bare user header it writes the next of WRITTEN (seeded calls are
    counted), after an assistant header it answers 'A:' + the question's first word."""

    def __init__(self, tokenizer):
        self.tok, self.written, self.answers = tokenizer, 0, 0

    def __call__(self, input_ids, attention_mask, pad_token_id, eos_token_id, **kw):
        end = self.tok.convert_tokens_to_ids("<|im_end|>")
        new = []
        for ids, mask in zip(input_ids, attention_mask):
            prompt = self.tok.decode(ids[mask.bool()].tolist())
            if prompt.endswith("<|im_start|>assistant\n"):
                self.answers += 1
                question = prompt.split("<|im_start|>user\n")[-1].split()[0]
                new.append(self.tok(f"A:{question}")["input_ids"] + [end])
            else:
                assert prompt.endswith("<|im_start|>user\n"), prompt
                text = WRITTEN[self.written]
                self.written += 1
                new.append(self.tok(text)["input_ids"] + ([] if text == "CUT" else [end]))
        width = max(len(n) for n in new)
        new = [n + [pad_token_id] * (width - len(n)) for n in new]
        return torch.cat([input_ids, torch.tensor(new, dtype=input_ids.dtype)], dim=1)


def config(**kw) -> DataConfig:
    base = dict(
        source="backbone",
        eval_rows=2,
        max_rows=6,
        max_length=128,
        responses="regenerated",
        regen=RegenConfig(engine="hf", batch_size=4),
    )
    return DataConfig(**(base | kw))


def test_user_prefix_ends_where_the_users_words_start(backbone):
    text = backbone.tokenizer.decode(user_prefix(backbone.tokenizer))
    assert text.endswith("<|im_start|>user\n") and "assistant" not in text


def test_prompts_filtered_answered_and_cached(backbone, tmp_path, monkeypatch):
    fake = ScriptedModel(backbone.tokenizer)
    monkeypatch.setattr(backbone.model, "generate", fake)
    train, evals, stats = build_datasets(config(), backbone.tokenizer, tmp_path, backbone)
    assert len(train) == 6 and len(evals) == 2
    assert stats["source_kind"] == "backbone"
    p = stats["prompts"]
    assert (
        p["used"] == 8 <= p["usable"]
        and p["cut_by_max_new_tokens"] == 1
        and p["too_short"] == 1
        and p["duplicate"] == 1
    )
    texts = [
        backbone.tokenizer.decode(ds[i]["input_ids"].tolist())
        for ds in (train, evals)
        for i in range(len(ds))
    ]
    assert sum("How do I sort a list?" in t for t in texts) == 1  # the repeat was dropped
    assert not any("<|im_start|>user\nhi<|im_end|>" in t for t in texts)
    for t in texts:  # the backbone's answer to its own prompt is the label
        question = t.split("<|im_start|>user\n")[-1].split()[0]
        assert f"A:{question}" in t
    # every prompt on disk, one per line: a second build samples nothing (and reuses the tokenized cache)
    lines = [json.loads(x) for x in next((tmp_path / "prompts").glob("*.jsonl")).read_text().splitlines()]
    assert len(lines) == fake.written and [r["i"] for r in lines] == list(range(len(lines)))
    written = fake.written
    _, _, again = build_datasets(config(), backbone.tokenizer, tmp_path, backbone)
    assert fake.written == written and again["cache_hit"]


def test_more_rows_resume_the_same_prompts(backbone, tmp_path, monkeypatch):
    fake = ScriptedModel(backbone.tokenizer)
    monkeypatch.setattr(backbone.model, "generate", fake)
    _, _, first = build_datasets(config(max_rows=3), backbone.tokenizer, tmp_path, backbone)
    file = next((tmp_path / "prompts").glob("*.jsonl"))
    # killed while writing its last prompt: that one is sampled again
    file.write_bytes(file.read_bytes()[:-9])
    calls, written = fake.written, fake.written - 1  # prompts on disk: all but the broken one
    train, held_out, second = build_datasets(config(max_rows=9), backbone.tokenizer, tmp_path, backbone)
    assert len(train) == 9 and second["prompts"]["sampled"] > written  # sampled on from where it stopped
    assert fake.written - calls == second["prompts"]["sampled"] - written
    lines = file.read_text().splitlines()
    assert lines[written].startswith("{") and not lines[written].endswith("}")  # the broken line, ended
    assert [json.loads(x)["i"] for x in lines[written + 1 :]] == list(
        range(written, second["prompts"]["sampled"])
    )
    # the smaller run's rows, held-out ones included, are the larger run's first rows
    assert second["eval"]["rows"] == first["eval"]["rows"] == 2
    small, small_held_out, _ = build_datasets(config(max_rows=3), backbone.tokenizer, tmp_path, backbone)
    assert [small[i]["row_id"] for i in range(3)] == [train[i]["row_id"] for i in range(3)]
    assert [small_held_out[i]["row_id"] for i in range(2)] == [held_out[i]["row_id"] for i in range(2)]


def test_too_few_usable_prompts_is_one_clear_error(backbone, tmp_path, monkeypatch):
    fake = ScriptedModel(backbone.tokenizer)
    monkeypatch.setattr(backbone.model, "generate", fake)
    with pytest.raises(DataError, match="only .* usable") as e:  # every prompt shorter than min_chars
        build_datasets(config(prompts=PromptsConfig(min_chars=1000)), backbone.tokenizer, tmp_path, backbone)
    assert "Fix:" in str(e.value)


def test_backbone_prompts_join_another_sources_training_rows(backbone, tmp_path, monkeypatch):
    fake = ScriptedModel(backbone.tokenizer)
    monkeypatch.setattr(backbone.model, "generate", fake)
    src = tmp_path / "chats.jsonl"
    src.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"Question{k} here?"}, {"role": "assistant", "content": "-"}]}) + "\n"
            for k in range(6)
        )
    )  # fmt: skip
    kw = dict(source=str(src), eval_rows=2, max_rows=4)
    plain_train, plain_eval, _ = build_datasets(config(**kw), backbone.tokenizer, tmp_path / "a", backbone)
    train, evals, stats = build_datasets(
        config(**kw, backbone_prompts=5), backbone.tokenizer, tmp_path, backbone
    )
    ids = sorted(train[i]["row_id"] for i in range(len(train)))
    # the source's 4 rows + 5 of the backbone's, numbered -1 - (the prompt's index; unusable ones skipped)
    assert len(train) == 9 and ids[:5] == [-8, -7, -6, -4, -1]
    assert ids[5:] == sorted(plain_train[i]["row_id"] for i in range(4))
    assert [evals[i]["row_id"] for i in range(2)] == [
        plain_eval[i]["row_id"] for i in range(2)
    ]  # held out: the source's
    assert stats["backbone_prompts"]["used"] == 5
    texts = [backbone.tokenizer.decode(train[i]["input_ids"].tolist()) for i in range(len(train))]
    assert sum("Write a haiku" in t or "Explain tides" in t or "How do I sort" in t for t in texts) == 5
    for t in texts:  # every row answered by the backbone
        question = t.split("<|im_start|>user\n")[-1].split()[0]
        assert f"A:{question}" in t
    # the same prompts file as source=backbone with those settings: that run samples nothing new
    written = fake.written
    build_datasets(config(eval_rows=0, max_rows=5), backbone.tokenizer, tmp_path, backbone)
    assert fake.written == written


@pytest.mark.parametrize(
    "kw",
    [
        dict(responses="original"),
        dict(max_rows=None),
        dict(prompts=dict(temperature=0.0)),
        dict(backbone_prompts=3),  # source=backbone already: max_rows is the count
        dict(source="chats.jsonl", responses="original", backbone_prompts=3),  # nothing would answer them
        dict(source="chats.jsonl", backbone_prompts=-1),
    ],
)
def test_bad_settings_fail_at_config_time(kw):
    with pytest.raises(DataError, match="Fix:"):
        config(**kw)
