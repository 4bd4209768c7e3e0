"""The hybrid's match length chosen per request by how well its drafter is doing there.

A drafter's acceptance varies with the request far more than a lookup's cost: on a translation or a summary of the
prompt, the trained drafter's chains are rarely accepted while the context's own n-grams are, and a 1-token match
(vLLM `ngram`'s own rule) beats waiting for a 2-token one; on an open answer the drafter's chain wins where only
a short match exists. So a request starts at the rule's min_match and drops to WEAK_MIN_MATCH once AFTER of its
drafter's verified chains have averaged fewer than `floor` accepted drafts a step. What a verified step accepted
is known before the next step drafts (the context grew by the accepted drafts and the bonus token), so the rule
reads nothing ahead of its step: lossless as any choice of drafts. The replayed effect on the tuning prompts is
in docs/results.md; the rule tuner (eval/tuning/lookup_rule.py) keeps a floor where it prices within 1% of the
rule without it, or faster.

One class serves headstart's decoder (proposers/lookup_choice.py) and the vLLM plugin (eval/serving/
vllm_plugin.py): both see each request's context length at every step, and that is all it reads.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

AFTER = 4  # verified drafter chains before a request's average is trusted
WEAK_MIN_MATCH = 1  # the match length a request whose drafter is weak takes (vLLM `ngram`'s)


class DrafterFloor:
    """Per request: how many of its drafter's chains were verified and how many of their drafts were accepted."""

    def __init__(self, floor: float, after: int = AFTER):
        if floor <= 0:
            raise ValueError(
                f"drafter_floor={floor}: must be > 0 (accepted drafts a step). Fix: e.g. 0.2, or leave it unset"
            )
        self.floor, self.after = floor, after
        # request -> [its drafter's chains verified, their drafts accepted, pending (context length, drafts)]
        self.requests: dict[Hashable, list] = {}

    def seen(self, request: Hashable, length: int) -> None:
        """The request's context is `length` tokens now: the drafter chain verified at its last step (if any)
        accepted length - (its length then) - 1 of its drafts (the bonus token is not a draft)."""
        state = self.requests.setdefault(request, [0, 0, None])
        if state[2] is not None:
            before, drafts = state[2]
            state[0] += 1
            state[1] += min(max(length - before - 1, 0), drafts)
            state[2] = None

    def drafted(self, request: Hashable, length: int, drafts: int) -> None:
        """The request verifies its drafter's chain of `drafts` tokens after a context of `length`."""
        if drafts:
            self.requests.setdefault(request, [0, 0, None])[2] = (length, drafts)

    def min_match(self, request: Hashable, m: int) -> int:
        """The match length the request takes now: `m`, or WEAK_MIN_MATCH once its drafter is weak."""
        steps, accepted, _ = self.requests.get(request, (0, 0, None))
        return min(m, WEAK_MIN_MATCH) if steps >= self.after and accepted < self.floor * steps else m

    def keep(self, requests: Iterable[Hashable]) -> None:
        """Forget every request not in `requests` (those that left the batch)."""
        live = set(requests)
        for request in [r for r in self.requests if r not in live]:
            del self.requests[request]
