"""Drafter chain or prompt-lookup chain, chosen per step: the hybrid rule headstart's vLLM plugin serves
(eval/serving/vllm_plugin.py), so the eval stage predicts what the server does.

Suffix decoding beside a trained speculator (Snowflake's Arctic Inference) and SA_SPEC in TensorRT-LLM pick the
context's own continuation when its match is long enough, else the trained drafter. Here: each step the drafter
proposes its chain (a drafter with state always runs, as in the server, so its state follows the context; a
stateless one, Medusa's heads, only when the lookup chain loses, as the plugin runs vLLM's), and prompt lookup finds
the longest suffix n-gram (n <= max_ngram) seen earlier in the context (proposers/prompt_lookup.py). When
n >= min_match, the (up to) `num_tokens` tokens that followed it are verified instead of the drafter's chain
(vLLM, like its `ngram`, takes fewer drafts than num_speculative_tokens for a request; `num_tokens` may exceed the
drafter's chain: a longer chain behind the same match only adds tokens). With `max_tokens` the chain is as long as
the match when that is longer than `num_tokens`, up to `max_tokens`, and n-grams up to `max_tokens` are searched:
suffix decoding's rule (eval/engine/ngram.py `chain_length`; the plugin's `lookup_tokens`). With `min_score`
the lookup is suffix decoding's own (eval/engine/suffix_lookup.py: the prompt's suffix tree and every earlier
response's, as vLLM's `suffix` method): its draft of up to `num_tokens` is verified when its score (the tokens it
expects accepted) is at least `min_score`; the plugin's `source: "suffix"`. With `drafter_floor` a request's
min_match drops to 1 once its drafter's verified chains average under that many accepted drafts
(eval/engine/drafter_floor.py), as the plugin's `drafter_floor`.

Lossless as any chain: both candidates are deterministic functions of the context (`Draft.probs` None) and the
target verifies whichever is chosen. `accepted()` passes the path to the drafter unchanged: it indexes positions
of the verify forward whatever drafted them (the argument of lookup_branch.py's docstring).
"""

from __future__ import annotations

import torch

from headstart.eval.engine.drafter_floor import DrafterFloor
from headstart.eval.engine.ngram import chain_length
from headstart.eval.engine.proposers.base import Draft, Proposer, Sampling
from headstart.eval.engine.proposers.prompt_lookup import MAX_NGRAM, find_match
from headstart.eval.engine.suffix_lookup import SuffixLookup
from headstart.eval.engine.tree import chain_tree


class LookupChoice:
    """`inner` (a proposer of deterministic drafts, typically a chain of K) or up to `num_tokens` lookup tokens
    when the context's suffix n-gram match is at least `min_match` long (as many as the match, up to `max_tokens`,
    when that is longer), or with `min_score` suffix decoding's draft when it scores that much (`min_match`
    unused); with `drafter_floor` a request whose drafter's chains average under that many accepted drafts takes
    a 1-token match (DrafterFloor). `counts`: steps, steps that verified the lookup chain."""

    def __init__(
        self,
        inner: Proposer,
        min_match: int | None,
        num_tokens: int,
        device: torch.device,
        max_ngram: int = MAX_NGRAM,
        max_tokens: int | None = None,
        min_score: float | None = None,
        drafter_floor: float | None = None,
    ):
        if min_score is not None and (min_match is not None or max_tokens is not None):
            raise ValueError(
                f"lookup_min_score={min_score} chooses suffix decoding's draft (its own length rule, up to "
                "lookup_tokens). Fix: drop lookup_min_match and lookup_max_tokens, or lookup_min_score"
            )
        if min_score is None and not 1 <= (min_match or 0) <= max_ngram:
            raise ValueError(
                f"lookup_min_match={min_match}: must be in 1..{max_ngram} (the longest n-gram searched). "
                "Fix: lookup_min_match=1, 2 or 3, or leave it unset for the merged lookup branch"
            )
        if drafter_floor is not None and min_score is not None:
            raise ValueError(
                f"lookup_drafter_floor={drafter_floor} lowers the n-gram rule's lookup_min_match; suffix decoding's "
                "draft (lookup_min_score) has none. Fix: drop lookup_drafter_floor, or lookup_min_score"
            )
        if num_tokens < 1:
            raise ValueError(f"lookup_tokens={num_tokens}: must be >= 1 with lookup_min_match")
        if max_tokens is not None and max_tokens < num_tokens:
            raise ValueError(
                f"lookup_max_tokens={max_tokens} is under lookup_tokens={num_tokens}. "
                "Fix: lookup_max_tokens >= lookup_tokens, or leave it unset for chains of lookup_tokens"
            )
        self.inner, self.m, self.device = inner, min_match, device
        # base None: every chain `most` long (today's fixed rule); else suffix-style lengths up to `most`
        self.base, self.most = (None, num_tokens) if max_tokens is None else (num_tokens, max_tokens)
        self.max_ngram = max_ngram if max_tokens is None else max(max_ngram, max_tokens)
        self.width = max(inner.width, self.most + 1)
        self.widths = tuple(sorted({inner.width, self.most + 1}))  # the drafter's steps, the chain's
        self.counts = {"steps": 0, "lookup": 0}
        # the suffix trees live as long as the decoder: every earlier reply joins the global tree, as in vLLM
        self.suffix, self.min_score = (None, None) if min_score is None else (SuffixLookup(), min_score)
        self.requests, self.prompt_len = 0, 0
        self.floor = None if drafter_floor is None else DrafterFloor(drafter_floor)

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        self.inner.start(prompt, hidden)
        self.requests, self.prompt_len = self.requests + 1, len(prompt)
        if self.suffix is not None:
            self.suffix.finish()
        if self.floor is not None:
            self.floor.keep([])

    def _lookup(self, context: list[int]) -> list[int] | None:
        """The lookup chain when it qualifies, else None."""
        if self.suffix is not None:
            return self.suffix.chain(self.requests, self.prompt_len, context, self.most, self.min_score)
        n, chain = find_match(torch.tensor(context), self.max_ngram, self.most)
        chain = chain[: chain_length(n, self.base, self.most)]
        m = self.m
        if self.floor is not None:
            self.floor.seen(self.requests, len(context))
            m = self.floor.min_match(self.requests, m)
        return chain if n >= m and chain else None

    def propose(self, context: list[int], sampling: Sampling) -> Draft | None:
        self.counts["steps"] += 1
        chain = self._lookup(context)
        matched = chain is not None
        # a stateless drafter (its propose changes nothing) is skipped when the lookup chain wins, as the plugin
        # skips vLLM's Medusa heads; one with state (a draft KV cache) runs every step so that state follows
        draft = (
            None
            if matched and getattr(self.inner, "stateless", False)
            else self.inner.propose(context, sampling)
        )
        if not matched:
            if self.floor is not None and draft is not None:
                self.floor.drafted(self.requests, len(context), len(draft.tokens))
            return draft
        if draft is not None and draft.probs is not None:
            raise ValueError("a lookup choice needs point-mass drafts (Draft.probs None), not sampled ones")
        self.counts["lookup"] += 1
        return Draft(torch.tensor(chain, device=self.device), chain_tree(len(chain)))

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        self.inner.accepted(path, hidden)  # verify positions: valid for the drafter as they are (docstring)
