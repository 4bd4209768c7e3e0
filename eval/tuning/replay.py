"""The hybrid's rules replayed on one recorded greedy decode instead of each decoded.

Greedy output does not depend on the drafts (the target verifies them: lossless), so a rule that chooses, step by
step, between the drafter's chain and a lookup chain only decides where each step starts and how much of the
output it accepts. One plain greedy decode per prompt that records, at every position, what each side would
propose there (the drafter's chain of K, the longest earlier n-gram match for each n-gram limit a rule searches,
suffix decoding's scored draft) therefore gives any such rule's steps: a step at position t verifies the chosen
chain, accepts its prefix equal to the output from t, and the next step starts after the bonus token. The rule
tuner (eval/tuning/lookup_rule.py) replays its ~20 rules on one decode where it decoded each.

Exact for a stateless drafter (Medusa's heads) in float32 (tested against the decoder). Elsewhere a drafter reads
hidden states that a plain step and a multi-token verify round differently (bf16, an EAGLE drafter's cache after a
longer acceptance), so a draft at a near-tie can differ from the decoded rule's: a replayed tau is an estimate of
the decoded one, the same for every rule it compares.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from headstart.eval.engine.ngram import find_match
from headstart.eval.engine.proposers.base import Sampling


@dataclass
class Position:
    drafts: list[int]  # the drafter's chain
    ngram: dict[int, tuple[int, list[int]]]  # n-gram limit -> (longest match n, up to `most` tokens after it)
    # suffix decoding's (score, draft of up to `most`); None: not recorded
    suffix: tuple[float, list[int]] | None
    p1: float = 0.0  # the drafter's first draft's probability, where recorded (eval/bench/rule_bound.py)


@dataclass
class Decoded:
    tokens: list[int]  # prompt + greedy output
    start: int  # the first position a step drafts for (after the prefill's token)
    positions: dict[int, Position] = field(default_factory=dict)  # context length -> what each side proposes


class Recorder:
    """A proposer that drafts nothing (plain decoding) and records, each step, the drafter's chain (`inner`'s
    proposal), the n-gram match at each limit in `ngram_limits` with up to `most` tokens after it, and with
    `suffix` suffix decoding's draft of up to `most` (its trees follow the requests as in LookupChoice)."""

    def __init__(self, inner, ngram_limits: Sequence[int], most: int, suffix: bool = False):
        self.inner, self.width = inner, 1
        self.limits, self.most = sorted(set(ngram_limits)), most
        self.positions: dict[int, Position] = {}
        self.trees, self.request, self.prompt_len = None, 0, 0
        if suffix:
            from headstart.eval.engine.suffix_lookup import SuffixLookup

            self.trees = SuffixLookup()
        self.probability: Callable[[], float] = lambda: 0.0

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        self.positions = {}
        self.inner.start(prompt, hidden)
        if self.trees is not None:
            self.trees.finish()
            self.request, self.prompt_len = self.request + 1, len(prompt)

    def propose(self, context: list[int], sampling: Sampling):
        tokens = np.asarray(context)
        ngram = {n: find_match(tokens, n, self.most) for n in self.limits}
        suffix = None
        if self.trees is not None:
            suffix = self.trees.draft(self.request, self.prompt_len, context, self.most)
        drafts = self.inner.propose(context, sampling).tokens.tolist()
        self.positions[len(context)] = Position(drafts, ngram, suffix, self.probability())
        return None

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        self.inner.accepted(path, hidden)


def record(decoder, prompts: list[list[int]], max_new: int, recorder: Recorder) -> list[Decoded]:
    """Plain greedy decodes of `prompts` through `decoder` (a decoder of the drafter's chain) with `recorder`
    (wrapping its proposer) in the proposer's place; the decoder keeps it afterwards."""
    decoder.proposer = recorder
    out = []
    for ids in prompts:
        generated = decoder.generate(list(ids), max_new, temperature=0.0).tokens
        out.append(Decoded(list(ids) + generated, len(ids) + 1, recorder.positions))
    return out


def accepted(chain: list[int], tokens: list[int], t: int) -> int:
    """How many leading tokens of `chain` equal the output from position t."""
    a = 0
    while a < len(chain) and t + a < len(tokens) and chain[a] == tokens[t + a]:
        a += 1
    return a


# (position, the decode's tokens, t) -> the chain verified there (empty: a plain step); the position's own
# `drafts` list itself where the drafter's chain is chosen (a step the drafter's cost is paid on). A rule reads
# only tokens[:t], the context; an oracle may read further
Choice = Callable[[Position, list[int], int], list[int]]


def replay(decoded: Decoded, choose: Choice) -> tuple[int, Counter, int]:
    """One prompt's (tokens emitted by its steps, steps by verify width, steps that verified the drafter's chain)
    under `choose`."""
    t, emitted, widths, drafted = decoded.start, 0, Counter(), 0
    end = len(decoded.tokens)
    while t < end:
        position = decoded.positions[t]
        chain = choose(position, decoded.tokens, t)
        a = accepted(chain, decoded.tokens, t)
        emitted += min(a + 1, end - t)
        widths[len(chain) + 1] += 1
        drafted += chain is position.drafts
        t += a + 1
    return emitted, widths, drafted
