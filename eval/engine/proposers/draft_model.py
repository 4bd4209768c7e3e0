"""Speculative decoding with a separate draft model (Leviathan et al. 2023; Chen et al. 2023): a smaller LM with
the same tokenizer proposes a chain of K tokens autoregressively from its own preallocated KV cache.

Cache bookkeeping: a step forwards the last two context tokens, then drafts d_1..d_{K-1} (d_K is never
forwarded). After the target accepts n drafts and a bonus token, the draft cache holds the old context plus
d_1..d_min(n, K-1), which always covers the new context minus its last two tokens, so the next step just
rolls back to len(context) - 2 and forwards the last two again (a fixed width of 2, graph-friendly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from headstart.eval.engine.acceptance import target_probs
from headstart.eval.engine.proposers.base import Draft, ProposerConfig, Sampling, check_positive
from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import chain_tree
from headstart.models.backbone import Backbone

DRAFT_TOKENS = 4  # tokens proposed per step


def check_same_tokenizer(target, draft) -> None:
    a, b = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if a is not None and b is not None and a.get_vocab() != b.get_vocab():
        raise ValueError(
            f"draft model {draft.name!r} has another tokenizer than the target {target.name!r}. "
            "Fix: pick a draft model from the same family (same vocabulary)"
        )


class DraftModelProposer:
    def __init__(
        self,
        draft_backbone,
        num_draft_tokens: int,
        vocab_size: int,
        device: torch.device,
        max_cache_len: int,
        cuda_graphs: bool,
    ) -> None:
        if num_draft_tokens < 1:
            raise ValueError(f"draft needs num_draft_tokens >= 1, got {num_draft_tokens}")
        self.runner = ModelRunner(draft_backbone, max_cache_len, cuda_graphs)
        self.k, self.vocab_size, self.device = num_draft_tokens, vocab_size, device  # device: the target's
        self.width = num_draft_tokens + 1

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        self.runner.cache.reset()
        self.runner.prefill(prompt)

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits (V_d,) onto the target's vocabulary (V,): families often pad the vocab differently."""
        extra = self.vocab_size - logits.shape[-1]
        if extra <= 0:
            return logits[: self.vocab_size]
        return torch.cat([logits, logits.new_full((extra,), float("-inf"))])

    def propose(self, context: list[int], sampling: Sampling) -> Draft:
        runner = self.runner
        runner.cache.rollback(len(context) - 2)
        feed = torch.tensor(context[-2:], device=runner.device)
        tokens, probs = [], []
        for _ in range(self.k):
            _, logits = runner.step(feed, last_only=True)
            runner.cache.commit(feed.shape[0])
            logits = self._fit(logits[0])  # (V,)
            if sampling.greedy:
                token = logits.argmax().view(1)
            else:
                q = target_probs(logits, sampling.temperature, sampling.top_p)  # same warping as the target
                token = torch.multinomial(q, 1, generator=sampling.generator)
                probs.append(q)
            tokens.append(token)
            feed = token
        draft_probs = torch.stack(probs).to(self.device) if probs else None  # (K, V)
        return Draft(torch.cat(tokens).to(self.device), chain_tree(self.k), draft_probs)

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        pass  # the next propose() rolls the draft cache back to what is still valid


@dataclass
class DraftOptions(ProposerConfig):
    """`draft_backbone`: a Backbone with the target's tokenizer; proposes `num_draft_tokens` per step."""

    method: ClassVar[str] = "draft"
    draft_backbone: Backbone | None = None
    num_draft_tokens: int = DRAFT_TOKENS

    def __post_init__(self) -> None:
        check_positive(self.method, num_draft_tokens=self.num_draft_tokens)

    def make(self, decoder) -> DraftModelProposer:
        draft = self.draft_backbone
        if draft is None:
            raise ValueError("method 'draft' needs draft_backbone= (a Backbone with the same tokenizer)")
        check_same_tokenizer(decoder.backbone, draft)
        draft.to(decoder.device)
        vocab = decoder.backbone.vocab_size
        return DraftModelProposer(
            draft, self.num_draft_tokens, vocab, decoder.device, decoder.max_cache_len, decoder.cuda_graphs
        )


def chain_options(k: int, drafter) -> tuple[dict, int]:
    """Decoder options for a chain of k drafts -> (options, chain length)."""
    return {"num_draft_tokens": k}, k
