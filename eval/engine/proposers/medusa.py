"""Medusa candidates (Cai et al. 2024, Sec. 2.1.2): the heads read the target's final hidden state h_t at the
last accepted position; head k's top-k tokens are the candidates for position t+k+2 (the root is t+1), and a
sparse tree of top-k ranks (`headstart.eval.engine.tree`) picks which combinations to verify."""

from __future__ import annotations

import torch

from headstart.eval.engine.proposers.base import Draft, Sampling
from headstart.eval.engine.tree import Tree, check_fits_heads
from headstart.models.medusa import MedusaHeads


class MedusaProposer:
    def __init__(self, heads: MedusaHeads, tree: Tree, device: torch.device) -> None:
        check_fits_heads(tree, len(heads.blocks))
        self.heads, self.tree, self.width = heads, tree, tree.size
        self.index, self.topk = tree.medusa_index(device)  # (n,) into the flattened (depth, topk) table
        self.depth = tree.max_depth  # heads beyond the tree's depth are never evaluated
        self.hidden: torch.Tensor | None = None

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        self.hidden = hidden.clone()

    def propose(self, context: list[int], sampling: Sampling) -> Draft:
        logits = self.heads(self.hidden, depth=self.depth)  # (depth, V)
        candidates = logits.topk(self.topk, dim=-1).indices.view(-1)  # (depth * topk,)
        return Draft(candidates[self.index], self.tree)

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        self.hidden = hidden[path[-1]].clone()  # (H,) the position that predicted the next root
