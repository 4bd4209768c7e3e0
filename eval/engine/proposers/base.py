"""What a drafting method hands the decoder, and what the decoder tells it back.

Every method is a `Proposer`: each step it proposes candidate tokens arranged in a `Tree` (node 0 is the
root = the last emitted token; a chain is a tree too), the decoder verifies them in one target forward,
accepts a root-to-node path, compacts the KV cache, and reports the path back. A new method (e.g. EAGLE's
dynamic tree: draft tokens plus parent indices) only implements this protocol; verification, acceptance,
cache compaction, EOS/length handling and statistics are shared.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Protocol

import torch

from headstart.eval.engine.tree import Tree


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Draft:
    tokens: torch.Tensor  # (n,) long on the target's device: the tokens of tree nodes 1..n
    tree: Tree  # root + n nodes
    # (n, V) float: the distribution each token was *sampled* from (draft-model chains, temperature > 0);
    # None when the candidates are deterministic (top-k, lookup), i.e. point masses.
    probs: torch.Tensor | None = None


@dataclass(frozen=True)
class Setting:
    """One decoding setting the tuner (eval/tuning/tuner.py) can pick for a proposer: the decoder options that select
    it, the static tree whose expected accepted length models it (the verify width is `tree.size`), and the
    name of what the drafter's cost per step depends on (e.g. "depth3": Medusa heads evaluated)."""

    options: dict
    tree: Tree
    draft_key: str


class Proposer(Protocol):
    width: (
        int  # most nodes (root included) it ever proposes: the verify width, for cache room and CUDA graphs
    )

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        """After the target's prefill; hidden (H,) = final normed hidden state at the last prompt position."""

    def propose(self, context: list[int], sampling: Sampling) -> Draft | None:
        """context = prompt + emitted tokens (context[-1] is the root). None: nothing to propose this step."""

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        """path = accepted node indices of the last proposal (root first; [0] after a plain step);
        hidden (q, H) = the target's final hidden states of that verify forward (a buffer: copy what you keep)."""

    # Optional: `widths`, the verify widths its steps fall into, increasing, the last = `width` (default: `width`
    # alone). Where steps run at fixed shapes (compiled, CUDA graphs) the decoder pads a tree to the smallest of
    # them that holds it: one graph each.
    # Optional: `verified(logits)`, called after a verify forward and before `accepted`, with that forward's
    # logits (q, V) (a buffer: take what you need now). Lookahead decoding reads its Jacobi step there instead of
    # applying the lm_head to `hidden` a second time.


@dataclass
class ProposerConfig:
    """What the decoder builds a proposer from: the model it drafts with (a drafter, a draft LM) and its options,
    None meaning the proposer's default (which may depend on the device). Each proposer module declares its own
    subclass, range checks in `__post_init__`, and `make` builds the proposer for a decoder (its device, its
    runner, its cache length). An option a proposer does not declare cannot be passed: the dataclass refuses it."""

    method: ClassVar[str]  # the decoding method's name (eval/engine/proposers/__init__.py: PROPOSERS)

    def make(self, decoder) -> Proposer:
        raise NotImplementedError

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def check_positive(method: str, **options: int | None) -> None:
    """Each option that is set (not None) must be >= 1: 0 is not "the default" here, None is."""
    for name, value in options.items():
        if value is not None and value < 1:
            raise ValueError(f"{method}: {name}={value} must be >= 1. Fix: {name}=None for the default")
