"""Tokenize conversations with labels on assistant tokens only, for any chat template.

Nothing here knows ChatML or any other format. The template itself says where each assistant turn sits in the
rendered text: turn i spans the characters

    [len(render(messages[:i], add_generation_prompt=True)), len(render(messages[:i + 1])))

so the span holds the reply plus whatever end-of-turn text the template appends after it (labeling that teaches
the drafter to stop), and never the role header. This holds only for templates that render each prefix of a
conversation as a prefix of the whole ("prefix-consistent"); every render is checked and a template that is
not raises `DataError`. A default system prompt injected by the template (SmolLM2's) is part of every prefix
and so stays unlabeled. The full text is tokenized once; a token is labeled when its character span lies
inside an assistant span.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from jinja2.exceptions import TemplateError

from headstart.data.config import DataError
from headstart.data.sources import Row, Skips

IGNORE = -100  # label of tokens that are not trained on (torch cross_entropy's ignore_index)
HEAD_CHARS_PER_TOKEN = 8  # character budget per kept token when encoding only a long text's head
HEAD_MARGIN = 16  # tokens that must follow the kept head, so the cut cannot have changed it
_PROBE = "Zq7Xw"  # content unlikely to be changed by a template, to find the end-of-turn text


@dataclass
class Sample:
    row_id: int
    input_ids: np.ndarray  # (T,) int32
    labels: np.ndarray  # (T,) int32, IGNORE off-assistant
    truncated: bool


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _prefix_len(tokenizer, full: str, messages: list[dict], add_generation_prompt: bool) -> int:
    """Length of the rendered prefix, after checking that it is a prefix of the full render."""
    text = render(tokenizer, messages, add_generation_prompt)
    if not full.startswith(text):
        k = next((i for i, (a, b) in enumerate(zip(full, text)) if a != b), min(len(full), len(text)))
        what = "with the generation prompt" if add_generation_prompt else "alone"
        raise DataError(
            f"the chat template of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} is not "
            f"prefix-consistent: the first {len(messages)} messages rendered {what} are not a prefix of the "
            f"whole conversation (they differ at char {k}: {text[max(0, k - 30) : k + 30]!r} vs "
            f"{full[max(0, k - 30) : k + 30]!r}), so assistant turns cannot be located. Fix: use a tokenizer "
            "(or set tokenizer.chat_template to a template) that renders earlier turns the same whatever follows"
        )
    return len(text)


def assistant_spans(tokenizer, messages: list[dict], full: str, char_limit: int) -> list[tuple[int, int]]:
    """Character spans [start, end) of the assistant turns that start before `char_limit`."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = _prefix_len(tokenizer, full, messages[:i], add_generation_prompt=True)
        if start >= char_limit:  # this turn and all later ones lie beyond the truncation point
            break
        end = _prefix_len(tokenizer, full, messages[: i + 1], add_generation_prompt=False)
        spans.append((start, end))
    return spans


def _cut_open_end(tokenizer, messages: list[dict], full: str) -> str:
    """Text up to the end of the last reply's content, without the end-of-turn the template appends: that
    reply was cut by max_new_tokens, so the model did not stop there."""
    start = _prefix_len(tokenizer, full, messages[:-1], add_generation_prompt=True)
    content = messages[-1]["content"]
    for needle in (content, content.strip()):
        at = full.find(needle, start) if needle else -1
        if at >= 0:
            return full[: at + len(needle)]
    return full  # the template rewrote the content: keep its end-of-turn rather than guess


def end_of_turn_text(tokenizer) -> str:
    """The text the template appends after an assistant reply (e.g. '<|im_end|>\\n'), or '' if unknown."""
    user = [{"role": "user", "content": "hi"}]
    try:
        prompt = render(tokenizer, user, add_generation_prompt=True)
        full = render(tokenizer, [*user, {"role": "assistant", "content": _PROBE}])
    except TemplateError:
        return ""
    at = full.find(_PROBE, len(prompt)) if full.startswith(prompt) else -1
    return full[at + len(_PROBE) :] if at >= 0 else ""


def _batches(rows: list[Row], size: int) -> Iterator[list[Row]]:
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


def tokenize_rows(
    tokenizer, rows: list[Row], max_length: int, skips: Skips, batch_size: int = 64
) -> list[Sample]:
    """Render, tokenize and label each row, truncated to `max_length` tokens; unusable rows go to `skips`."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer, and labels need its offset "
            "mapping. Fix: load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "the tokenizer has no chat template. Fix: set tokenizer.chat_template (a Jinja string)"
        )
    samples = []
    for chunk in _batches(rows, batch_size):
        rendered = []  # (row, full render, text to tokenize)
        for row in chunk:
            try:
                full = render(tokenizer, row.messages)
            except TemplateError as e:
                skips.add(f"chat template error ({e})", f"row {row.row_id}: {row.messages!r}")
                continue
            text = _cut_open_end(tokenizer, row.messages, full) if row.open_end else full
            rendered.append((row, full, text))
        if not rendered:
            continue
        encoded = _encode_heads(tokenizer, [t for _, _, t in rendered], max_length)
        for (row, full, text), (ids, offsets) in zip(rendered, encoded):
            sample = _label(tokenizer, row, full, text, ids, offsets, max_length, skips)
            if sample is not None:
                samples.append(sample)
    return samples


def _encode_heads(tokenizer, texts: list[str], max_length: int) -> list[tuple[list[int], list]]:
    """(ids, offsets) of each text, exact in at least the first `max_length` tokens.

    Most of the cost is encoding text that truncation throws away, so a long text is first encoded only up to
    a generous character budget. Cutting a text changes only the tokens near the cut (pre-tokenized BPE
    merges within words), so the head is kept when at least `HEAD_MARGIN` tokens lie beyond `max_length`;
    otherwise the whole text is encoded.
    """
    budget = max_length * HEAD_CHARS_PER_TOKEN

    def encode(batch: list[str]) -> list[tuple[list[int], list]]:
        enc = tokenizer(batch, return_offsets_mapping=True, add_special_tokens=False)
        return list(zip(enc["input_ids"], enc["offset_mapping"]))

    out = encode([t[:budget] for t in texts])
    redo = [i for i, t in enumerate(texts) if len(t) > budget and len(out[i][0]) < max_length + HEAD_MARGIN]
    for i, pair in zip(redo, encode([texts[i] for i in redo]) if redo else []):
        out[i] = pair
    return out


def _label(tokenizer, row, full, text, ids, offsets, max_length, skips) -> Sample | None:
    ids = np.asarray(ids, dtype=np.int32)  # (T,)
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)  # (T, 2) char [start, end)
    char_limit = int(offsets[max_length - 1, 1]) if len(ids) > max_length else len(text)
    mask = np.zeros(len(ids), dtype=bool)
    for start, end in assistant_spans(tokenizer, row.messages, full, char_limit):
        mask |= (offsets[:, 0] >= start) & (offsets[:, 1] <= min(end, len(text)))
    labels = np.where(mask, ids, IGNORE).astype(np.int32)
    truncated = len(ids) > max_length
    ids, labels = ids[:max_length], labels[:max_length]
    if not (labels != IGNORE).any():
        reason = "no assistant tokens after truncation" if truncated else "no assistant tokens"
        skips.add(reason, f"row {row.row_id}: {text[:200]!r}")
        return None
    return Sample(row.row_id, ids, labels, truncated)
