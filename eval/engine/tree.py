"""Candidate trees for one-forward verification (Medusa, Cai et al. 2024, Sec. 2.1.2; SpecInfer, Miao et al. 2024).

A tree has N nodes in topological order: node 0 is the root (the last emitted token, whose K/V are not cached
yet) and `parents[i] < i`. Verifying it costs one target forward over the N tokens with

    position_ids[i] = prefix_len + depth[i]
    mask[i, j] = 0 if j < prefix_len or j - prefix_len is an ancestor-or-self of i, else -inf   (1, 1, N, prefix+N)

so every node sees the cached prefix plus its own root-to-node path, exactly what a plain forward of that path
would see. Any drafter that proposes tokens with parent indices (Medusa's fixed trees, chains, EAGLE's dynamic
trees) goes through the same verify/accept/compact step.

A Medusa tree is a list of paths of top-k ranks: path (r1, ..., rd) is the node whose token is the rank-rd
candidate of head d-1, below the node (r1, ..., r(d-1)).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import torch

# Medusa's mc_sim_7b_63 (FasterDecoding/Medusa, medusa/model/medusa_choices.py): built greedily from measured
# head accuracies of Vicuna-7B, so every prefix of it is itself a valid tree with the most useful nodes first.
MC_SIM_7B_63 = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
    [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9],
    [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1],
    [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0],
    [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0],
    [0, 0, 0, 1], [1, 6], [0, 7, 0],
]  # fmt: skip


class TreeError(ValueError):
    """A tree that cannot be built or does not fit the drafter."""


@dataclass(frozen=True, eq=False)
class Tree:
    parents: tuple[int, ...]  # parents[0] == -1 (root); parents[i] < i
    ranks: tuple[int, ...] = ()  # Medusa trees: top-k rank of node i within its head (root: -1)
    _device_cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.parents or self.parents[0] != -1:
            raise TreeError("node 0 must be the root (parent -1)")
        if any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise TreeError(f"parents must point to earlier nodes: {self.parents}")

    @property
    def size(self) -> int:
        """Nodes including the root: the width of the verify forward."""
        return len(self.parents)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        depth = [0] * self.size
        for i in range(1, self.size):
            depth[i] = depth[self.parents[i]] + 1
        return tuple(depth)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """(N, N) bool: [i, j] is True when node j is node i or one of its ancestors."""
        anc = torch.eye(self.size, dtype=torch.bool)
        for i in range(1, self.size):
            anc[i] |= anc[self.parents[i]]
        return anc

    def device_tensors(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(depth (N,) long, additive bias (N, N) in `dtype`: 0 on ancestors-or-self, dtype min elsewhere)."""
        key = (str(device), dtype)
        if key not in self._device_cache:
            depth = torch.tensor(self.depth, device=device)
            bias = torch.full((self.size, self.size), torch.finfo(dtype).min, dtype=dtype)
            bias.masked_fill_(self.ancestors, 0.0)
            self._device_cache[key] = (depth, bias.to(device))
        return self._device_cache[key]

    def medusa_index(self, device: torch.device) -> tuple[torch.Tensor, int]:
        """For the non-root nodes: flat indices into the heads' (K, topk) candidate table, and topk."""
        if len(self.ranks) != self.size:
            raise TreeError("this tree has no top-k ranks (it was not built from Medusa paths)")
        topk = max(self.ranks) + 1
        key = ("medusa", str(device))
        if key not in self._device_cache:
            flat = [(d - 1) * topk + r for d, r in zip(self.depth[1:], self.ranks[1:])]
            self._device_cache[key] = torch.tensor(flat, device=device)
        return self._device_cache[key], topk

    def padded(self, size: int) -> Tree:
        """The same tree plus dummy children of the root up to `size` nodes, for fixed-shape (CUDA graph)
        verification; acceptance only ever looks at the first `self.size` nodes."""
        if size < self.size:
            raise TreeError(f"cannot pad a {self.size}-node tree to {size}")
        return _padded(self, size) if size > self.size else self


@lru_cache(maxsize=64)
def _padded(tree: Tree, size: int) -> Tree:
    return Tree(tree.parents + (0,) * (size - tree.size))


def tree_from_paths(paths: list[list[int]] | list[tuple[int, ...]]) -> Tree:
    """Medusa-style sparse tree from paths of top-k ranks, e.g. [[0], [1], [0, 0], [0, 1], [2], [0, 0, 0]]."""
    ordered = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
    if len(ordered) != len(paths):
        raise TreeError("tree paths contain duplicates")
    index = {(): 0}
    parents, ranks = [-1], [-1]
    for path in ordered:
        if not path or min(path) < 0:
            raise TreeError(f"tree path {list(path)} must be a non-empty list of ranks >= 0")
        if path[:-1] not in index:
            raise TreeError(f"tree path {list(path)} needs its prefix {list(path[:-1])} in the tree too")
        index[path] = len(parents)
        parents.append(index[path[:-1]])
        ranks.append(path[-1])
    return Tree(tuple(parents), tuple(ranks))


@lru_cache(maxsize=64)
def chain_tree(n: int) -> Tree:
    """Root plus a chain of n drafts (draft model, prompt lookup, Medusa top-1 chain)."""
    return Tree(tuple(range(-1, n)), (-1,) + (0,) * n)


def tree_paths(tree: Tree) -> list[list[int]]:
    """The top-k rank paths of a tree that has ranks (the inverse of tree_from_paths), root excluded."""
    if len(tree.ranks) != tree.size:
        raise TreeError("this tree has no top-k ranks (it was not built from Medusa paths)")
    paths: list[list[int]] = [[]]
    for i in range(1, tree.size):
        paths.append(paths[tree.parents[i]] + [tree.ranks[i]])
    return paths[1:]


def tree_from_accuracy(head_accuracy: list[list[float]], num_nodes: int) -> Tree:
    """Medusa's construction (Cai et al. 2024, Sec. 2.1.2 "optimized tree"): with acc[k][r] the probability that
    head k's rank-r candidate is right, a node's expected acceptance is the product of acc along its path; add
    the best node whose parent is already in the tree until there are `num_nodes` (root excluded). Since the
    product only shrinks going down, this is the top-`num_nodes` paths by that product."""
    if num_nodes < 1:
        raise TreeError(f"num_nodes={num_nodes}: must be >= 1")
    frontier = [(-acc, (r,)) for r, acc in enumerate(head_accuracy[0])]
    heapq.heapify(frontier)
    paths = []
    while frontier and len(paths) < num_nodes:
        neg, path = heapq.heappop(frontier)
        paths.append(path)
        if len(path) < len(head_accuracy):
            for r, acc in enumerate(head_accuracy[len(path)]):
                heapq.heappush(frontier, (neg * acc, path + (r,)))
    return tree_from_paths(paths)


def default_tree(num_heads: int, num_nodes: int | None = None) -> Tree:
    """The first `num_nodes` nodes of Medusa's mc_sim_7b_63 (default all 63) no deeper than `num_heads`."""
    paths = [p for p in MC_SIM_7B_63 if len(p) <= num_heads]
    return tree_from_paths(paths[:num_nodes] if num_nodes else paths)


def check_fits_heads(tree: Tree, num_heads: int) -> None:
    if tree.max_depth > num_heads:
        raise TreeError(
            f"tree depth {tree.max_depth} > {num_heads} Medusa heads: a depth-d node needs head d-1. "
            "Fix: use a shallower tree or a drafter with more heads"
        )
