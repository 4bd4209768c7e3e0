"""A truncated draft vocabulary: the Dv most frequent labelled tokens of the training data (FR-Spec, Zhao et al.
2025; EAGLE-3's d2t/t2d), one selection for every drafter that drafts over fewer ids than the target's V.

A drafter with one projects its features onto Dv rows instead of V (the vocabulary projection is most of a
small drafter's decode step and of its training loss) and maps a draft id i back to the target id
token_map[i]. Decoding stays lossless: the target verifies target ids, a token outside the map is simply
never proposed. Training (hard labels, Medusa): a target outside the map has no class to train; it adds no
loss and counts as a miss in every accuracy metric (`head{k}/oov` reports its share), so the reported
accuracy is what the drafter can propose, not the accuracy on the tokens it kept.

    token_map (Dv,) long  draft id -> target id, sorted ascending (vLLM's Medusa `token_map`)
    d2t (Dv,) long        token_map - arange(Dv) (EAGLE-3 / SpecForge convention)
    t2d (V,) bool         target id is in the draft vocabulary
"""

from __future__ import annotations

import torch


def label_counts(dataset, vocab_size: int) -> torch.Tensor:
    """(V,) long: how often each id is a label (!= -100) in `dataset` (rows with a "labels" tensor)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i in range(len(dataset)):
        labels = dataset[i]["labels"]
        counts += torch.bincount(labels[labels != -100], minlength=vocab_size)
    return counts


def most_frequent(counts: torch.Tensor, size: int) -> torch.Tensor:
    """counts (V,) -> token_map (size,) long: the `size` most frequent ids (ties: the lower id), sorted."""
    order = torch.argsort(-counts.double() + torch.arange(len(counts)) * 1e-9 / len(counts), stable=True)
    return order[:size].sort().values


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """counts (V,) of labelled tokens -> d2t (Dv,) long, t2d (V,) bool: the Dv most frequent ids (ties: lower
    id), sorted by id, so draft id i is target id i + d2t[i] (EAGLE-3 / SpecForge convention)."""
    kept = most_frequent(counts, draft_vocab_size)  # (Dv,)
    t2d = torch.zeros(len(counts), dtype=torch.bool)
    t2d[kept] = True
    return kept - torch.arange(len(kept)), t2d


def vocab_coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """The share of labelled tokens whose id is kept (t2d: (V,) bool, or a (Dv,) long token_map)."""
    return float(counts[t2d].sum() / counts.sum().clamp_min(1))


def check_coverage(coverage: float, size: int, min_coverage: float) -> None:
    if coverage < min_coverage:
        raise ValueError(
            f"the draft vocabulary of {size} tokens covers {coverage:.1%} of the labelled training "
            f"tokens (method.min_coverage={min_coverage}); the drafter could never propose the "
            "rest. Fix: raise method.draft_vocab_size or lower method.min_coverage"
        )


def select_from_data(dataset, vocab_size: int, size: int, min_coverage: float) -> tuple[torch.Tensor, dict]:
    """The draft vocabulary of `dataset`'s labels -> (token_map (size,) long, stats for the run's data_stats,
    which the checkpoint's config.json keeps). Raises when it covers less than `min_coverage`."""
    counts = label_counts(dataset, vocab_size)
    token_map = most_frequent(counts, size)
    coverage = vocab_coverage(counts, token_map)
    check_coverage(coverage, size, min_coverage)
    distinct = int((counts > 0).sum())
    return token_map, {
        "draft_vocab_size": size,
        "draft_vocab_coverage": coverage,
        "labelled_distinct": distinct,
    }


def target_to_draft(token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """token_map (Dv,) -> (V,) long: the draft id of each target id, -1 outside the draft vocabulary."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=token_map.device)
    return t2d.index_copy_(0, token_map, torch.arange(len(token_map), device=token_map.device))


class RowCache:
    """The frozen lm_head's rows of the draft vocabulary, gathered once and reused while neither the weight
    nor the map changes (a (Dv, H) gather per decode step would cost as much as the projection it saves).
    Held outside the module's state: never saved, never a duplicate of the frozen weight in a checkpoint, and
    never trained (the gather runs under no_grad)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.rows: torch.Tensor | None = None

    def get(self, weight: torch.Tensor, token_map: torch.Tensor) -> torch.Tensor:
        key = (weight.data_ptr(), weight.dtype, weight.device, weight._version)
        key += (token_map.data_ptr(), token_map.device, token_map._version, len(token_map))
        if key != self.key:
            with torch.no_grad():
                self.rows = weight.index_select(0, token_map.to(weight.device))  # (Dv, H)
            self.key = key
        return self.rows


def check_draft_vocab(draft_vocab_size: int, vocab_size: int) -> None:
    """A draft vocabulary larger than the backbone's would silently train over the full one while config.json
    recorded the larger number: refused."""
    if draft_vocab_size > vocab_size:
        raise ValueError(
            f"method.draft_vocab_size={draft_vocab_size} is more than the backbone's vocabulary "
            f"({vocab_size} ids). Fix: method.draft_vocab_size=0 (the full vocabulary) or at most {vocab_size}"
        )
