"""A prompt-lookup branch in a trained drafter's tree: the hybrid of Snowflake's Arctic Inference (suffix
decoding beside a trained speculator). Prompt lookup (Saxena 2023) copies the tokens that followed the last
n-gram earlier in the context, which trained heads cannot do; heads predict text the context does not hold.
Merged into one tree, ONE target forward verifies both, and the acceptance rule keeps the longer accepted path.

Merge (a trie): the drafter's nodes keep their indices 1..n; walking down from the root, a lookup token equal to
a child of the current node shares that child, and the rest of the chain hangs below the last shared node as
new nodes n+1, n+2, ... . Siblings stay distinct tokens, and both parts are deterministic functions of the
context (point-mass drafts, `Draft.probs` None), so `greedy_tree` and `sample_tree` stay lossless as they are.

accepted(): the path indexes the positions of the verify forward, which the drafter's nodes and the lookup nodes
share, so the drafter takes it unchanged, also when it ends below a lookup-only node: Medusa reads the target's
hidden state at path[-1] (the position that predicts the next root, whatever drafted it); EAGLE reads the
target features its hooks captured in that same forward at the path's positions, and its own draft cache holds
only the committed prefix (propose crops the tree rows), so next step it feeds the accepted rows, wherever they
came from, like any others (tests/eval/test_lookup_branch.py checks both against a freshly started drafter).
"""

from __future__ import annotations

import torch

from headstart.eval.engine.proposers.base import Draft, Proposer, Sampling
from headstart.eval.engine.proposers.prompt_lookup import MAX_NGRAM, find_candidates
from headstart.eval.engine.tree import Tree


def shared_prefix(tokens: list[int], parents: tuple[int, ...], chain: list[int]) -> list[int]:
    """The nodes of a tree (tokens of nodes 1..n, parents of nodes 0..n) that a chain below the root runs
    through, walking down from the root as a trie (the first of equal siblings), as far as they go."""
    children = {(parents[i], tokens[i - 1]): i for i in range(len(parents) - 1, 0, -1)}  # first child wins
    path, node = [], 0
    for token in chain:
        node = children.get((node, token))
        if node is None:
            break
        path.append(node)
    return path


def merge_chain(
    tokens: list[int], parents: tuple[int, ...], chain: list[int]
) -> tuple[list[int], tuple[int, ...]]:
    """A tree (tokens of nodes 1..n, parents of nodes 0..n) plus a chain below the root, merged as a trie ->
    (tokens, parents) of the merged tree; nodes 0..n unchanged, new nodes appended in chain order."""
    shared = shared_prefix(tokens, parents, chain)
    tokens, parents, node = list(tokens), list(parents), shared[-1] if shared else 0
    for token in chain[len(shared) :]:  # below a new node nothing is shared: the rest is a chain
        tokens.append(token)
        parents.append(node)
        node = len(parents) - 1
    return tokens, tuple(parents)


class LookupBranch:
    """Any proposer of deterministic trees (Medusa, EAGLE) plus up to `num_tokens` prompt-lookup tokens.
    `counts`: steps proposed, steps with a lookup match that added nodes, steps whose accepted path ended on one."""

    def __init__(self, inner: Proposer, num_tokens: int, device: torch.device, max_ngram: int = MAX_NGRAM):
        if num_tokens < 1:
            raise ValueError(f"lookup_tokens={num_tokens}: must be >= 1 (0 = no lookup branch)")
        self.inner, self.k, self.max_ngram, self.device = inner, num_tokens, max_ngram, device
        self.width = inner.width + num_tokens
        self.widths = (inner.width, self.width)  # steps the chain added nothing to, the rest
        self.counts = {"steps": 0, "added": 0, "won": 0}
        self._first = None  # the first lookup-only node of the last proposal (None: it added none)

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        self.inner.start(prompt, hidden)

    def propose(self, context: list[int], sampling: Sampling) -> Draft | None:
        draft, self._first = self.inner.propose(context, sampling), None
        self.counts["steps"] += 1
        chain = find_candidates(torch.tensor(context), self.max_ngram, self.k)
        if not chain:
            return draft
        if draft is not None and draft.probs is not None:
            raise ValueError("a lookup branch needs point-mass drafts (Draft.probs None), not sampled ones")
        tokens, parents = ([], (-1,)) if draft is None else (draft.tokens.tolist(), draft.tree.parents)
        merged, tree = merge_chain(tokens, parents, chain)
        if len(tree) == len(parents):  # the drafter proposed the whole chain already
            return draft
        self._first = len(parents)
        self.counts["added"] += 1
        return Draft(torch.tensor(merged, device=self.device), Tree(tree))

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        if self._first is not None and path[-1] >= self._first:
            self.counts["won"] += 1
        self.inner.accepted(path, hidden)  # verify positions: valid for the drafter as they are (docstring)
