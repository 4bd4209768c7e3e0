"""The prompts the tuner's probe decodes, kept apart from the prompts an eval scores.

A tree chosen on some of the scored prompts and then scored on all of them flatters the figure by an unknown
amount, so the probe reads its own file (`tuner.prompts`; default `data/tuning_prompts.jsonl`, written for the
tuner and sharing no prompt with the dev prompts the eval scores by default), and the eval refuses a tuning
set whose prompts it also scores (compared by text, whitespace-normalised).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import headstart.data
from headstart.eval.errors import EvalError
from headstart.eval.stage.prompts import PromptSet, chat_ids, load_prompts, spread

DEFAULT_TUNING_PROMPTS = str(Path(headstart.data.__file__).parent / "tuning_prompts.jsonl")


@dataclass
class ProbePrompts:
    """The first turns the probe decodes: their text, token ids, and the file they came from."""

    file: str
    texts: list[str]
    ids: list[list[int]]


def normalise(text: str) -> str:
    return " ".join(text.split())


def probe_prompts(path: str, backbone, n: int) -> ProbePrompts:
    """The first turns of `n` prompts of the file at `path`, spread over it (its categories are listed
    together), rendered with the backbone's chat template."""
    rows = spread(load_prompts(path).prompts, n)
    texts = [p.turns[0] for p in rows]
    ids = [chat_ids(backbone.tokenizer, [{"role": "user", "content": t}]) for t in texts]
    return ProbePrompts(str(path), texts, ids)


def shared_texts(texts: list[str], scored: PromptSet) -> list[str]:
    """The `texts` that are also a turn of a scored prompt."""
    turns = {normalise(t) for p in scored.prompts for t in p.turns}
    return [t for t in texts if normalise(t) in turns]


def refuse_overlap(probe: ProbePrompts, scored: PromptSet) -> None:
    """One line, before any decoding, when the probe would tune on prompts the eval scores."""
    shared = shared_texts(probe.texts, scored)
    if shared:
        raise EvalError(
            f"tuner.prompts={probe.file} shares {len(shared)} of its {len(probe.texts)} probe prompts with "
            f"prompts={scored.path} (e.g. {shared[0][:60]!r}): the tuner would choose on what the eval scores. "
            f"Fix: tuner.prompts=<a file of other prompts> (default {Path(DEFAULT_TUNING_PROMPTS).name})"
        )
