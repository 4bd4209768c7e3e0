"""Medusa candidates (Cai et al. 2024, Sec. 2.1.2): the heads read the target's final hidden state h_t at the
last accepted position; head k's top-k tokens are the candidates for position t+k+2 (the root is t+1), and a
sparse tree of top-k ranks (`headstart.eval.engine.tree`) picks which combinations to verify."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from headstart.eval.engine import compiled
from headstart.eval.engine.proposers import TREE_NAMES
from headstart.eval.engine.proposers.base import Draft, ProposerConfig, Sampling, Setting, check_positive
from headstart.eval.engine.tree import (
    Tree,
    chain_tree,
    check_fits_heads,
    default_tree,
    tree_from_accuracy,
    tree_from_paths,
    tree_paths,
)
from headstart.models.medusa import MedusaHeads

DEFAULT_TREE_NODES = 63  # Medusa's default budget (mc_sim_7b_63), for GPUs
# On a CPU a verify forward of 4-8 tokens costs about one step, 16 already ~1.5 steps (SmolLM2-135M, bf16):
# measured speedup peaked at 3-6 nodes for the CPU-trained heads (tau ~1.4), so CPU runs default to 4. The
# eval stage replaces both by the tuner's measured choice (eval/tuning/tuner.py) unless tuner.mode=off.
CPU_TREE_NODES = 4
PROBE_RANKS = 4  # the tuner's probe tree: the top-1 chain plus the top-4 candidates below each of its nodes


class DraftStep(nn.Module):
    """One Medusa draft as one module: the heads' logits to the tree's depth, their top-k, and the candidates the
    tree verifies, in target ids. The vocabulary projections are its buffers (views of the heads' weights, no
    copies), so a compiled decoder freezes them into its graph like the backbone's weights (the shared lm_head's
    draft-vocabulary rows come from a cache the compiler cannot trace)."""

    def __init__(self, heads: MedusaHeads, tree: Tree, device: torch.device) -> None:
        super().__init__()
        self.heads, self.depth = heads, tree.max_depth  # heads beyond the tree's depth are never evaluated
        # (n,) into the flattened (depth, topk) table: the tree's, not a weight (no buffer: not drafter memory)
        self.index, self.topk = tree.medusa_index(device)
        self.count = 0
        for w in heads.projections(self.depth):
            self.register_buffer(f"projection{self.count}", w.detach(), persistent=False)
            self.count += 1

    def forward(self, hidden: torch.Tensor, root: torch.Tensor | None) -> torch.Tensor:
        """hidden (H,), root () or None -> the candidates (n,) of tree nodes 1..n."""
        weights = [getattr(self, f"projection{k}") for k in range(self.count)]
        logits = self.heads(hidden, depth=self.depth, root=root, projections=weights)  # (depth, Dv)
        # draft ids -> target ids (a truncated draft vocabulary): the decoder verifies target tokens
        candidates = self.heads.to_target(logits.topk(self.topk, dim=-1).indices).view(-1)  # (depth * topk,)
        return candidates[self.index]


def _draft(step: DraftStep, hidden: torch.Tensor, root: torch.Tensor | None) -> torch.Tensor:
    return step(hidden, root)


def draft_function(step: DraftStep, compile: bool, device: torch.device):
    """hidden, root -> candidates: `step` eagerly, or through torch.compile with the decoder's options (about
    10 s the first call on a CPU; the heads' projection then runs inductor's GEMM: SmolLM2's 8,192-row draft
    vocabulary, float32, AVX2, 2 threads: 1.1 -> 0.5 ms at depth 1, 2.1 -> 0.65 ms at depth 2). A step that
    fails to compile runs eagerly from then on, with a warning."""
    if not compile:
        return step
    run, state = compiled.compiled_function(_draft, device), {"eager": False}

    def draft(hidden, root):
        if not state["eager"]:
            try:
                return run(step, hidden, root)
            except Exception as e:  # noqa: BLE001 - any compile failure means: draft eagerly
                warnings.warn(f"compiling the Medusa draft step failed ({e}); drafting eagerly", stacklevel=2)
                state["eager"] = True
        return step(hidden, root)

    return draft


STATELESS = True  # propose() reads the kept hidden state and changes nothing (lookup_choice.py skips it)


class MedusaProposer:
    stateless = STATELESS

    def __init__(self, heads: MedusaHeads, tree: Tree, device: torch.device, compile: bool = False) -> None:
        check_fits_heads(tree, len(heads.blocks))
        self.heads, self.tree, self.width = heads, tree, tree.size
        self.draft = draft_function(DraftStep(heads, tree, device), compile, device)
        self.hidden: torch.Tensor | None = None

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        self.hidden = hidden.clone()

    def propose(self, context: list[int], sampling: Sampling) -> Draft:
        root = None if self.heads.root_proj is None else torch.tensor(context[-1], device=self.hidden.device)
        return Draft(self.draft(self.hidden, root), self.tree)

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        self.hidden = hidden[path[-1]].clone()  # (H,) the position that predicted the next root


def medusa_tree(tree, num_heads: int, tree_nodes: int, head_accuracy) -> Tree:
    if isinstance(tree, Tree):
        return tree
    if tree == "chain":
        return tree_from_paths([[0] * d for d in range(1, num_heads + 1)])
    if tree is None and head_accuracy is not None:
        return tree_from_accuracy(head_accuracy[:num_heads], tree_nodes)
    if tree is None or tree == "default":
        return default_tree(num_heads, tree_nodes)
    return tree_from_paths(tree)


@dataclass
class MedusaOptions(ProposerConfig):
    """Medusa heads on a static tree. `tree`: a Tree, a list of top-k rank paths, "chain" (top-1 of every head),
    "default" (Medusa's mc_sim_7b_63 cut to `tree_nodes` and to the heads' depth) or None (built from
    `head_accuracy` if given, else "default"). `tree_nodes`: None = 63 on CUDA, 4 on CPU."""

    method: ClassVar[str] = "medusa"
    drafter: MedusaHeads | None = None
    tree: Tree | list | str | None = None
    tree_nodes: int | None = None
    head_accuracy: list[list[float]] | None = None

    def __post_init__(self) -> None:
        check_positive(self.method, tree_nodes=self.tree_nodes)
        if isinstance(self.tree, str) and self.tree not in TREE_NAMES:
            raise ValueError(
                f"tree={self.tree!r}: expected a Tree, a list of paths, 'chain', 'default' or None"
            )

    def make(self, decoder) -> MedusaProposer:
        if self.drafter is None:
            raise ValueError("method 'medusa' needs drafter= (MedusaHeads), e.g. from build_decoder()")
        self.drafter.to(decoder.device)
        # root-token heads read from an export come without the backbone's embedding
        if self.drafter.root_proj is not None and not self.drafter.has_embeddings:
            self.drafter.attach_embeddings(decoder.backbone.embed_tokens)
        tree_nodes = self.tree_nodes
        if tree_nodes is None:
            tree_nodes = DEFAULT_TREE_NODES if decoder.device.type == "cuda" else CPU_TREE_NODES
        tree = medusa_tree(self.tree, len(self.drafter.blocks), tree_nodes, self.head_accuracy)
        return MedusaProposer(self.drafter, tree, decoder.device, decoder.runner.compiled)


def chain_options(k: int, drafter) -> tuple[dict, int]:
    """Decoder options for a chain of up to k drafts (the top-1 of the first k heads) -> (options, chain length)."""
    k = min(k, len(drafter.blocks))
    return {"tree": [[0] * d for d in range(1, k + 1)]}, k


class MedusaTuning:
    """What the tuner (eval/tuning/tuner.py) needs to choose a tree and vLLM's K for these heads. A setting is a tree
    built greedily from an acceptance table (`tree_from_accuracy`), passed to the decoder as its paths; its
    drafter cost is the heads' forward to the tree's depth."""

    def __init__(self, heads: MedusaHeads, head_accuracy=None) -> None:
        self.heads, self.head_accuracy = heads, head_accuracy
        self.max_chain = len(heads.blocks)  # vLLM's Medusa drafts one token per served head

    def table(self) -> list[list[float]] | None:
        """The checkpoint's per-head P(rank r) on held-out data (train/loop.py), if it has one."""
        return [list(a) for a in self.head_accuracy[: self.max_chain]] if self.head_accuracy else None

    def probe(self, cuda: bool) -> dict:
        comb = [[0] * d + [r] for d in range(self.max_chain) for r in range(PROBE_RANKS)]
        return {"tree": comb}

    def settings(self, acc: list[list[float]], max_width: int) -> list[Setting]:
        out, sizes = [], set()
        for n in range(1, max_width):
            tree = tree_from_accuracy(acc[: self.max_chain], n)
            if tree.size in sizes:  # the table has fewer candidates than n
                break
            sizes.add(tree.size)
            out.append(Setting({"tree": tree_paths(tree)}, tree, f"depth{tree.max_depth}"))
        return out

    def chain(self, k: int) -> Setting:
        return Setting(chain_options(k, self.heads)[0], chain_tree(k), f"depth{k}")

    def draft_steps(self, backbone, keys: set[str], context: list[int], compile: bool = False) -> dict:
        """{key: a callable running one draft step of that key} (the heads to that depth, their top-k), compiled
        when the decoder's steps are."""
        heads, device = self.heads.to(backbone.device), backbone.device
        hidden = torch.randn(heads.hidden_size, device=device, dtype=backbone.dtype)  # (H,)
        root = torch.tensor(0, device=device) if heads.root_proj is not None else None

        def step(depth: int):
            draft = draft_function(DraftStep(heads, chain_tree(depth), device), compile, device)
            return lambda: draft(hidden, root)

        return {key: step(int(key.removeprefix("depth"))) for key in keys}


def tuning(backbone, drafter=None, head_accuracy=None) -> MedusaTuning:
    return MedusaTuning(drafter, head_accuracy)
