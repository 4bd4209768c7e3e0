"""The cache lengths an eval's decode steps attend over, so the tuner prices its steps where the eval runs them.

A step's cost grows with the cache it attends over, and faster for a wide verify than for a plain step (CPU SDPA,
SmolLM2 float32 AVX2: 4 queries over 1,024 keys 215 us a layer, 1 query 99 us). Priced at the probe's short
prompts, a wide setting looked as cheap as a narrow one and lost where the eval's long RAG and summarization
prompts put its steps (docs/results.md). So the eval describes its prompts by length alone: every decode position a
turn will run at (the turn's prompt, its earlier turns and answers counted at max_new_tokens each, then each new
token), grouped by power-of-two length classes (eval/engine/runner.py `bucket`); each group holding at least
MIN_SHARE of them is priced at its mean position and weighted by its share. The finalists the tuner decodes
(eval/tuning/confirm.py) are decoded after the largest group's length alone (see MIN_SHARE). Lengths only:
the tuner never reads a scored prompt's text or answer, and the probe's prompts (eval/tuning/prompts.py) still
give acceptance.

A workload is a tuple of (context tokens, share) pairs, shares summing to 1, lengths rounded to 16 tokens and
shares to 0.05 so evals of similar prompts reuse one record; () is the probe's own median sequence.
"""

from __future__ import annotations

from collections import defaultdict

from headstart.eval.engine.runner import bucket
from headstart.eval.stage.prompts import Prompt, chat_ids

Workload = tuple[tuple[int, float], ...]
ROUND_TOKENS, ROUND_SHARE = 16, 0.05
# a length class holding fewer of the steps is left out (the rest renormalised): each length priced costs the
# tuner a timing of every width there (and, while compiled graphs were specialized to their length, a graph per
# width, each with a copy of the weights: 3 lengths grew an eval past 20 GB of a 24 GB machine)
MIN_SHARE = 0.2


def turn_lengths(tokenizer, prompts: list[Prompt], max_new_tokens: int) -> list[int]:
    """Each turn's prompt length in tokens: its user turns so far rendered with the chat template, plus
    `max_new_tokens` for each earlier answer (the eval's answers are at most that long)."""
    out = []
    for p in prompts:
        messages = []
        for t, turn in enumerate(p.turns):
            messages.append({"role": "user", "content": turn})
            out.append(len(chat_ids(tokenizer, messages)) + t * max_new_tokens)
    return out


def profile(lengths: list[int], max_new_tokens: int, max_cache_len: int) -> Workload:
    """The decode positions of turns starting at `lengths`, each running `max_new_tokens` steps, grouped by
    length class -> ((mean position, share), ...), smallest first; groups under MIN_SHARE dropped and the rest
    renormalised."""
    groups: dict[int, list[int]] = defaultdict(list)
    for n in lengths:
        for pos in range(n, min(n + max_new_tokens, max_cache_len)):
            groups[bucket(pos + 1, max_cache_len)].append(pos)
    total = sum(map(len, groups.values()))
    if not total:
        return ()
    raw = {b: (sum(p) / len(p), len(p) / total) for b, p in groups.items() if len(p) / total >= MIN_SHARE}
    norm = sum(s for _, s in raw.values())
    return tuple(
        (max(ROUND_TOKENS, round(mean / ROUND_TOKENS) * ROUND_TOKENS), _share(s / norm))
        for _, (mean, s) in sorted(raw.items())
    )


def _share(s: float) -> float:
    return round(max(1, round(s / ROUND_SHARE)) * ROUND_SHARE, 2)


def of_prompts(tokenizer, prompts: list[Prompt], max_new_tokens: int, max_cache_len: int) -> Workload:
    """The workload of an eval scoring `prompts` (their lengths only)."""
    return profile(turn_lengths(tokenizer, prompts, max_new_tokens), max_new_tokens, max_cache_len)


def contexts(sequences: list[list[int]], workload: Workload) -> list[list[int]]:
    """For each workload length, a context of that many tokens ending with the probe's first sequence: the
    other probe sequences (tuning prompts and their answers) before it, repeated only when they run out."""
    last, others = sequences[0], [t for s in sequences[1:] for t in s] or sequences[0]
    out = []
    for n, _ in workload:
        fill = max(0, n - len(last))
        pad = (others * (fill // len(others) + 1))[:fill]
        out.append((pad + last)[-n:])
    return out


def weighted(costs: list[dict], workload: Workload) -> dict:
    """Per key, the share-weighted mean of `costs` (one dict per workload length, the same keys); no workload:
    the one dict, priced at the probe's median sequence."""
    if not workload:
        return costs[0]
    total = sum(s for _, s in workload)
    return {k: sum(c[k] * s for c, (_, s) in zip(costs, workload, strict=True)) / total for k in costs[0]}
