"""The hybrid's suffix-tree lookup: Arctic Inference's suffix decoding cache (what vLLM's `method: "suffix"` runs),
read per request and step by headstart's vLLM plugin and by headstart's decoder alike, so both engines choose the
same chains.

Suffix decoding matches the context's last tokens against a suffix tree of the request's prompt and one of every
earlier response (the engine's global tree), and drafts the most frequent continuation: as many tokens as its match
is long (times `max_spec_factor`), while each token's estimated probability stays above `min_token_prob`. Its
`score` sums those probabilities: the tokens it expects accepted. The hybrid takes that draft when the score is at
least `min_score`, else the trained drafter's chain (Arctic Inference's own rule beside its speculator, where
min_score is the speculator's draft length). numpy and the suffix tree only: the plugin imports this inside vLLM.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np

# vLLM's SpeculativeConfig defaults for `method: "suffix"` (suffix_decoding_*), so both engines read alike
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10000
MAX_SPEC_FACTOR = 1.0
MIN_TOKEN_PROB = 0.1


def suffix_cache_class():
    """Arctic Inference's SuffixDecodingCache, or one line that says how to get it."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as e:
        raise RuntimeError(
            f"the suffix-tree lookup needs Arctic Inference's suffix decoding ({e}). "
            "Fix: ./launch.sh suffix-setup (builds it into both venvs), or the n-gram lookup (source 'ngram')"
        ) from None
    return SuffixDecodingCache


class SuffixLookup:
    """One engine's suffix trees: `draft(req, prompt_len, context, k)` after each step of a request (`context`: its
    tokens so far, the first `prompt_len` its prompt) -> (score, up to k tokens); the tokens it gained since its last
    draft join its response. `finish(live)` stops the requests not in `live` (their responses stay in the global
    tree)."""

    def __init__(
        self,
        max_tree_depth: int = MAX_TREE_DEPTH,
        max_cached_requests: int = MAX_CACHED_REQUESTS,
        max_spec_factor: float = MAX_SPEC_FACTOR,
        min_token_prob: float = MIN_TOKEN_PROB,
    ):
        self.cache = suffix_cache_class()(
            max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests
        )
        self.depth, self.factor, self.min_prob = max_tree_depth, max_spec_factor, min_token_prob
        self.seen: dict[Hashable, int] = {}  # per active request: its tokens already in the trees

    def draft(self, req: Hashable, prompt_len: int, context, k: int) -> tuple[float, list[int]]:
        context = _int32(context)
        if req not in self.cache.active_requests:
            if req in self.cache.cached_requests:  # an id used again: its old response goes
                self.cache.evict_cached_response(req)
            self.cache.start_request(req, context[:prompt_len])
            self.seen[req] = prompt_len
        if len(context) > self.seen[req]:
            self.cache.add_active_response(req, context[self.seen[req] :])
            self.seen[req] = len(context)
        if k <= 0:
            return 0.0, []
        out = self.cache.speculate(
            req,
            context[-self.depth :],
            max_spec_tokens=k,
            max_spec_factor=self.factor,
            min_token_prob=self.min_prob,
        )
        return float(out.score), list(out.token_ids)[:k]

    def chain(self, req: Hashable, prompt_len: int, context, k: int, min_score: float) -> list[int] | None:
        """`draft`'s tokens when there are some and they score at least `min_score` (the hybrid takes them), else
        None (the drafter's chain)."""
        score, tokens = self.draft(req, prompt_len, context, k)
        return tokens if tokens and score >= min_score else None

    def finish(self, live: Iterable[Hashable] = ()) -> None:
        for req in set(self.cache.active_requests) - set(live):
            self.cache.stop_request(req)
            del self.seen[req]


def _int32(tokens) -> np.ndarray:
    """The suffix tree's zero-copy overload takes contiguous int32 arrays (slices of one stay contiguous)."""
    return np.ascontiguousarray(np.asarray(tokens), dtype=np.int32)
