"""Prompt lookup decoding (Saxena 2023; HF `prompt_lookup_num_tokens`): the training-free baseline. Find the
last n tokens (n = max_ngram down to 1) earlier in the context and propose the tokens that followed them,
verified as a chain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from headstart.eval.engine.ngram import MAX_NGRAM
from headstart.eval.engine.ngram import find_match as search
from headstart.eval.engine.proposers.base import Draft, ProposerConfig, Sampling, check_positive
from headstart.eval.engine.tree import chain_tree

DRAFT_TOKENS = 4


def find_match(context: torch.Tensor, max_ngram: int, num_tokens: int) -> tuple[int, list[int]]:
    """context (T,) long on CPU -> (n, tokens): up to `num_tokens` tokens that followed the earliest earlier
    occurrence of the longest matching suffix n-gram (HF's `find_candidate_pred_tokens`), and that n;
    (0, []) when none matches (eval/engine/ngram.py, the vLLM plugin's search too)."""
    return search(context.numpy(), max_ngram, num_tokens)


def find_candidates(context: torch.Tensor, max_ngram: int, num_tokens: int) -> list[int]:
    """The tokens of `find_match`, or [] when no suffix n-gram matches."""
    return find_match(context, max_ngram, num_tokens)[1]


class PromptLookupProposer:
    def __init__(self, num_draft_tokens: int, device: torch.device, max_ngram: int = 3) -> None:
        if num_draft_tokens < 1 or max_ngram < 1:
            raise ValueError(
                f"prompt_lookup needs num_draft_tokens >= 1 and max_ngram >= 1, got "
                f"{num_draft_tokens}, {max_ngram}"
            )
        self.k, self.max_ngram, self.device = num_draft_tokens, max_ngram, device
        self.width = num_draft_tokens + 1

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        pass

    def propose(self, context: list[int], sampling: Sampling) -> Draft | None:
        tokens = find_candidates(torch.tensor(context), self.max_ngram, self.k)
        if not tokens:
            return None
        return Draft(torch.tensor(tokens, device=self.device), chain_tree(len(tokens)))

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        pass


@dataclass
class PromptLookupOptions(ProposerConfig):
    """Up to `num_draft_tokens` tokens from n-grams of up to `max_ngram` tokens; no model."""

    method: ClassVar[str] = "prompt_lookup"
    num_draft_tokens: int = DRAFT_TOKENS
    max_ngram: int = MAX_NGRAM

    def __post_init__(self) -> None:
        check_positive(self.method, num_draft_tokens=self.num_draft_tokens, max_ngram=self.max_ngram)

    def make(self, decoder) -> PromptLookupProposer:
        return PromptLookupProposer(self.num_draft_tokens, decoder.device, self.max_ngram)
