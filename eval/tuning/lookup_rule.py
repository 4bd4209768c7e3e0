"""The hybrid's rule, tuned: how long a prompt-lookup match must be before its chain replaces the drafter's.

The hybrid (eval/engine/proposers/lookup_choice.py in headstart's decoder, eval/serving/vllm_plugin.py in vLLM)
verifies each step either the drafter's chain of K or the K tokens that followed the longest suffix n-gram seen
earlier, the latter when that n-gram has at least m tokens. Both chains have K tokens and the drafter runs every
step either way, so a step costs the same whichever is verified: the best m is the one with the highest tau.
This decodes the tuning prompts greedily once per m in 1..MAX_NGRAM and once with the drafter alone (m = None)
and keeps the best; prompts the figure is later scored on must not be among them (the caller's duty, checked in
eval/serve_check.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.proposers.prompt_lookup import MAX_NGRAM


@dataclass
class LookupRule:
    min_match: int | None  # None: the drafter alone was best (no lookup chain ever replaces its drafts)
    k: int
    tau_by_min_match: dict[str, float]  # "none" and "1".."MAX_NGRAM"
    prompts: int
    max_new_tokens: int

    def to_json(self) -> dict:
        return asdict(self)


def tune_lookup_rule(
    backbone, proposer: str, loaded, chain: dict, k: int, prompts: list[list[int]], max_new: int
) -> LookupRule:
    """Greedy tau of the drafter's chain of k (decoder options `chain`) with the lookup chain chosen at each
    m, and without; -> the rule with the highest tau (ties: the drafter alone, then the larger m: fewer drafts replaced)."""
    taus = {}
    for m in (None, *range(1, MAX_NGRAM + 1)):
        extra = {} if m is None else {"lookup_tokens": k, "lookup_min_match": m}
        decoder = build_decoder(proposer, backbone, loaded, **chain, **extra)
        accepted = forwards = 0
        for ids in prompts:
            stats = decoder.generate(list(ids), max_new, temperature=0.0).stats
            accepted, forwards = accepted + sum(stats.accepted_per_step), forwards + stats.target_forwards
        taus["none" if m is None else str(m)] = accepted / forwards if forwards else 1.0
    best = max(taus, key=lambda key: (taus[key], MAX_NGRAM + 1 if key == "none" else int(key)))
    return LookupRule(None if best == "none" else int(best), k, taus, len(prompts), max_new)
