"""Evaluation prompts in the Spec-Bench / MT-bench question format, one JSON object a line:
`{"question_id": str|int, "category": str, "turns": [str, ...]}` (extra keys such as `source` are kept aside).

Bad rows (not JSON, missing or mistyped fields, a repeated question_id) are skipped and counted, with a few
examples for the report; a file with no usable row is an error. Several files score as one set (their
categories side by side); `dev` and `spec_bench` name the sets shipped in headstart.data (data/PROMPTS.md).
Multi-turn prompts are rendered turn by turn with the tokenizer's chat template (`chat_ids`), each earlier answer
as the assistant message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import headstart.data
from headstart.eval.errors import EvalError

MAX_EXAMPLES = 5  # bad rows quoted in the report
_DATA = Path(headstart.data.__file__).parent
SHIPPED = {"dev": _DATA / "dev_prompts.jsonl", "spec_bench": _DATA / "spec_bench_dev.jsonl"}


@dataclass
class Prompt:
    question_id: str
    category: str
    turns: list[str]


@dataclass
class PromptSet:
    path: str
    prompts: list[Prompt]
    bad_rows: int = 0
    bad_examples: list[str] = field(default_factory=list)  # "line N: why"

    @property
    def categories(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self.prompts:
            counts[p.category] = counts.get(p.category, 0) + 1
        return counts


def parse_row(line: str) -> Prompt:
    """One jsonl line -> Prompt; raises ValueError saying what is wrong with it."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    qid, category, turns = row.get("question_id"), row.get("category"), row.get("turns")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or str(qid) == "":
        raise ValueError("question_id missing or not a string/int")
    if not isinstance(category, str) or not category:
        raise ValueError("category missing or not a non-empty string")
    if not isinstance(turns, list) or not turns:
        raise ValueError("turns missing or not a non-empty list")
    if not all(isinstance(t, str) and t.strip() for t in turns):
        raise ValueError("turns must all be non-empty strings")
    return Prompt(str(qid), category, list(turns))


def load_prompts(path: str | Path | list, limit_per_category: int = 0) -> PromptSet:
    """Read a prompt file (a path or a shipped set's name), or several as one set, skipping (and counting)
    bad rows; keep the first `limit_per_category` of each category."""
    if isinstance(path, (list, tuple)):
        return _merge([load_prompts(p, limit_per_category) for p in path])
    path = SHIPPED.get(str(path), Path(path))
    if not path.is_file():
        raise EvalError(
            f"prompt file {path} does not exist. Fix: prompts=<a .jsonl file, or one of {sorted(SHIPPED)}, or a "
            "list of them> (or leave the default)"
        )
    out = PromptSet(str(path), [])
    seen: set[str] = set()
    per_category: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                prompt = parse_row(line)
                if prompt.question_id in seen:
                    raise ValueError(f"question_id {prompt.question_id!r} repeats an earlier row")
            except ValueError as e:
                out.bad_rows += 1
                if len(out.bad_examples) < MAX_EXAMPLES:
                    out.bad_examples.append(f"line {line_no}: {e}")
                continue
            seen.add(prompt.question_id)
            n = per_category.get(prompt.category, 0)
            if limit_per_category and n >= limit_per_category:
                continue
            per_category[prompt.category] = n + 1
            out.prompts.append(prompt)
    if not out.prompts:
        why = "; ".join(out.bad_examples) or "the file is empty"
        raise EvalError(
            f"prompt file {path} has no usable row ({out.bad_rows} bad: {why}). Fix: one JSON object a line "
            'with "question_id", "category" and "turns": [str, ...]'
        )
    return out


def _merge(sets: list[PromptSet]) -> PromptSet:
    """One set of several files' prompts; a question_id in two files is refused (reports key prompts by it)."""
    out = PromptSet(", ".join(s.path for s in sets), [])
    where: dict[str, str] = {}
    for s in sets:
        for p in s.prompts:
            if p.question_id in where:
                raise EvalError(
                    f"question_id {p.question_id!r} is in both {where[p.question_id]} and {s.path}. Fix: give "
                    "each file's prompts their own ids"
                )
            where[p.question_id] = s.path
        out.prompts += s.prompts
        out.bad_rows += s.bad_rows
        out.bad_examples += [f"{s.path}: {e}" for e in s.bad_examples][: MAX_EXAMPLES - len(out.bad_examples)]
    return out


def chat_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a conversation ending with a user turn, ready for the assistant's answer.

    Rendered to text first and tokenized without extra special tokens: the template already places BOS (if any),
    and this works the same whether `apply_chat_template(tokenize=True)` returns a list or a BatchEncoding."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    # A base model without a template: plain "User:/Assistant:" turns.
    text = "".join(f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}\n" for m in messages)
    return tokenizer(text + "Assistant:")["input_ids"]


def spread(items: list, n: int) -> list:
    """n items evenly spaced over the list (the dev prompts are grouped by category)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]
