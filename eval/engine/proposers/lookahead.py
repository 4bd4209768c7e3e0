"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding"): no draft model, no training. Each step ONE target forward runs two branches beside the root:

- the lookahead branch, a 2-D window of N-1 levels x W columns kept from the last N-1 Jacobi iterations. Level l,
  column i guesses the token at depth i + l + 1 below the root. Level 0 is a causal row (L0[i] below L0[i-1],
  L0[0] below the root) and L_l[i] sits below L_{l-1}[i]: exactly the paper's mask (Fig. 2), where each token
  sees level 0 up to its own column and its own column below it. That mask is a tree, so it goes through the
  decoder's tree verify unchanged (`window_parents`). The target's argmax after each top-level token is the next
  Jacobi guess for that column: the window drops level 0 and gains that row; column i's trajectory
  (L0[i], L1[i], ..., L_{N-2}[i], output) is an n-gram for the pool.
- the verification branch: up to G n-grams from the pool whose first token is the root, their N-1 later tokens
  merged below the root as a trie (`lookup_branch.merge_chain`, shared with the lookahead branch where tokens
  agree).

Both branches are deterministic functions of the context and of earlier target outputs (argmax), i.e. point-mass
drafts (`Draft.probs` None), so `greedy_tree` and `sample_tree` stay lossless as they are; the acceptance rule
takes the longest accepted path whichever branch it runs through.

Where this differs from the reference implementation: the window starts full (all N-1 levels drawn from the
prompt with a fixed seed, so decoding is reproducible) instead of growing one level per step, and after a step
that accepts k > 1 tokens the window is kept as is (its guesses now sit k-1 positions early), as the reference
does. The pool lives for one generate() call and keeps the G most recent distinct n-grams per first token.
The Jacobi step reads the verify forward's own logits (the protocol's optional `verified` hook): applying the
lm_head again to the W newest-level hidden states cost about 10% of a 17-token SmolLM2-135M verify on a CPU.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import ClassVar

import torch

from headstart.eval.engine.proposers.base import Draft, ProposerConfig, Sampling
from headstart.eval.engine.proposers.lookup_branch import merge_chain
from headstart.eval.engine.tree import Tree

# The paper's GPU defaults (7B: W=15, N=5, G=15) verify 121 tokens a step. On a CPU a verify of ~16 tokens
# already costs ~1.5 plain steps (eval/engine/proposers/medusa.py), so the defaults keep the width at
# 1 + (W + G) * (N - 1) = 17.
WINDOW, NGRAM, GUESSES = 4, 3, 4
INIT_SEED = 0  # the window's first guesses: prompt tokens drawn with this seed (reproducible decodes)


@dataclass
class LookaheadOptions(ProposerConfig):
    """Lookahead decoding's knobs; None = the CPU default above. No model: the target alone drafts."""

    method: ClassVar[str] = "lookahead"
    window: int | None = None  # W: columns of the Jacobi window (tokens guessed ahead per level)
    ngram: int | None = None  # N: n-gram size; the window keeps N-1 levels, a guess is N-1 tokens
    guesses: int | None = None  # G: most pool n-grams verified per step (and kept per first token)

    def __post_init__(self) -> None:
        for name, low in (("window", 1), ("ngram", 2), ("guesses", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < low):
                raise ValueError(
                    f"lookahead.{name}={value!r}: must be an integer >= {low}. Fix: lookahead.{name}={low} "
                    "or leave it unset for the default"
                )

    def resolved(self) -> tuple[int, int, int]:
        """(W, N, G) with the defaults filled in."""
        return self.window or WINDOW, self.ngram or NGRAM, self.guesses or GUESSES

    def set(self) -> dict:
        """The options the user set (for reports, and for `build_decoder` by name)."""
        return {k: v for k, v in ((n, getattr(self, n)) for n in self.option_names()) if v is not None}

    def make(self, decoder) -> LookaheadProposer:
        return LookaheadProposer(self, decoder.device)


def window_parents(window: int, ngram: int) -> tuple[int, ...]:
    """Parents of root + the lookahead window in level-major order: node 1 + l*W + i is level l, column i. Level 0
    is a chain below the root; level l >= 1, column i hangs below level l-1, column i (module docstring)."""
    parents = [-1]
    for level in range(ngram - 1):
        for col in range(window):
            parents.append(col if level == 0 else 1 + (level - 1) * window + col)
    return tuple(parents)


class NgramPool:
    """n-grams by first token, the `size` most recently added distinct ones per token, newest last."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.grams: dict[int, dict[tuple[int, ...], None]] = {}  # ordered dict as an ordered set

    def add(self, first: int, rest: tuple[int, ...]) -> None:
        grams = self.grams.setdefault(first, {})
        grams.pop(rest, None)  # re-adding moves it to the newest end
        grams[rest] = None
        if len(grams) > self.size:
            del grams[next(iter(grams))]

    def get(self, first: int) -> list[tuple[int, ...]]:
        """Newest first."""
        return list(reversed(self.grams.get(first, {})))

    def nbytes(self) -> int:
        """Bytes the pool's Python objects hold (dicts, tuples, int objects): its real state, not a tensor
        estimate."""
        total = sys.getsizeof(self.grams)
        for first, grams in self.grams.items():
            total += sys.getsizeof(first) + sys.getsizeof(grams)
            total += sum(sys.getsizeof(g) + sum(sys.getsizeof(t) for t in g) for g in grams)
        return total


class LookaheadProposer:
    """`counts`: steps, steps whose pool held n-grams for the root (guesses verified), steps whose accepted path
    ended on a verification-branch node / on a lookahead-window node."""

    def __init__(self, options: LookaheadOptions, device: torch.device) -> None:
        self.options = options
        self.W, self.N, self.G = options.resolved()
        self.device = device
        self.parents = window_parents(self.W, self.N)
        self.width = 1 + (self.W + self.G) * (self.N - 1)
        top = 1 + (self.N - 2) * self.W
        self.top = torch.arange(top, top + self.W, device=device)  # (W,) nodes of the newest level
        self.counts = {"steps": 0, "guessed": 0, "won_guess": 0, "won_window": 0}
        self.levels: list[list[int]] = []
        self.new: list[int] = []  # the last verify's Jacobi outputs (`verified`)
        self.pool = NgramPool(self.G)

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        rng = random.Random(INIT_SEED)
        self.levels = [[rng.choice(prompt) for _ in range(self.W)] for _ in range(self.N - 1)]
        self.pool = NgramPool(self.G)

    def propose(self, context: list[int], sampling: Sampling) -> Draft:
        tokens = [t for level in self.levels for t in level]  # nodes 1..W(N-1), level-major
        parents = self.parents
        guesses = self.pool.get(context[-1])
        for gram in guesses:
            tokens, parents = merge_chain(tokens, parents, list(gram))
        self.counts["steps"] += 1
        self.counts["guessed"] += bool(guesses)
        return Draft(torch.tensor(tokens, device=self.device), Tree(parents))

    def verified(self, logits: torch.Tensor) -> None:
        """The Jacobi step: the target's greedy token after each newest-level guess; logits (q, V)."""
        self.new = logits[self.top].argmax(-1).tolist()  # (W,)

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        window_end = len(self.parents)
        if len(path) > 1:
            self.counts["won_guess" if path[-1] >= window_end else "won_window"] += 1
        new = self.new
        for col in range(self.W):
            rest = tuple(self.levels[level][col] for level in range(1, self.N - 1)) + (new[col],)
            self.pool.add(self.levels[0][col], rest)
        self.levels = self.levels[1:] + [new]

    def state_bytes(self) -> int:
        """Host memory of what it keeps between steps: the n-gram pool and the window."""
        window = sys.getsizeof(self.levels) + sum(
            sys.getsizeof(level) + sum(sys.getsizeof(t) for t in level) for level in self.levels
        )
        return self.pool.nbytes() + window
