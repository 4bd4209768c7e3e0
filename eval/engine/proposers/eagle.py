"""EAGLE-2's dynamic draft tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic
Draft Trees", Sec. 4) for EAGLE-1 and EAGLE-3 drafters.

Each step: (1) the drafter consumes the target features of the newly accepted positions (its own KV cache
holds every earlier row); (2) expansion: starting from the root, the `topk` nodes with the highest
cumulative draft log-probability (the "confidence" of the path) are each expanded into their `topk` best
children, for `depth` levels, in one drafter forward per level with a tree attention mask; (3) re-ranking:
the `total_tokens` candidates with the highest cumulative log-probability form the tree (a child never
outranks its parent, since log-probs are <= 0; ties are broken parent-first); (4) the decoder verifies the
tree in one target forward. The tree rows are then cropped from the drafter cache.

Lossless sampling: the candidates are deterministic functions of the accepted prefix (top-k of the draft
distribution, never sampled), and siblings are distinct tokens. They are therefore point-mass drafts, and the
decoder's `sample_tree` (recursive rejection sampling with point masses) emits tokens distributed exactly as
the target's; the draft distribution only decides *which* tokens are tried, never the acceptance test.
Greedy: `greedy_tree` accepts a node only when it equals the target's argmax, so output == vanilla greedy.

Target features come from forward hooks on the backbone (the final norm's output for EAGLE-1, the inputs of
the aux decoder layers for EAGLE-3), so the decoder's runner is unchanged; the hooks are removed when the
proposer is garbage-collected.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch

from headstart.eval.engine.proposers.base import Draft, ProposerConfig, Sampling, Setting, check_positive
from headstart.eval.engine.tree import Tree, chain_tree, tree_from_accuracy
from headstart.models.eagle import EagleDrafter


def _install_hooks(backbone, drafter: EagleDrafter, store: dict) -> list:
    body = backbone.model.model
    if not drafter.v3:  # EAGLE-1: the final normed hidden state (the lm_head's input) of every position

        def after_norm(module, args, output):
            store["feats"] = [output]

        return [body.norm.register_forward_hook(after_norm)]
    handles = []
    for slot, i in enumerate(drafter.aux_layers):  # EAGLE-3: the input of decoder layer i

        def before_layer(module, args, kwargs, slot=slot):
            store.setdefault("aux", {})[slot] = args[0] if args else kwargs["hidden_states"]

        handles.append(body.layers[i].register_forward_pre_hook(before_layer, with_kwargs=True))
    return handles


# EAGLE-2's dynamic tree as (depth, nodes, top-k): EAGLE-2's own defaults on GPUs. On a CPU each drafter level
# costs ~1/6 of a SmolLM2-135M forward, so deep trees lose: measured on the dev prompts (1 thread, bf16), the
# EAGLE-3 drafter went from 1.02x at (4, 8, 8) to 1.18x at (2, 6, 4), EAGLE-1 from 0.82x to 1.01x.
# The eval stage replaces both by the tuner's measured choice (eval/tuning/tuner.py) unless tuner.mode=off.
EAGLE_TREE, CPU_EAGLE_TREE = (5, 60, 10), (2, 6, 4)
# The tuner's probe (every candidate of depth x top-k kept, to measure acceptance by depth and rank) and the
# longest chain it considers for vLLM
PROBE, CPU_PROBE, MAX_CHAIN = (6, 8), (5, 4), 8


class EagleProposer:
    def __init__(
        self, drafter: EagleDrafter, backbone, device, depth: int = 5, total_tokens: int = 32, topk: int = 8
    ) -> None:
        if depth < 1 or total_tokens < 1:
            raise ValueError(f"eagle needs depth >= 1 and total_tokens >= 1, got {depth}, {total_tokens}")
        self.drafter, self.device = drafter, device
        self.depth, self.total, self.topk = depth, total_tokens, max(1, min(topk, total_tokens))
        self.width = total_tokens + 1
        self._store: dict = {}
        handles = _install_hooks(backbone, drafter, self._store)
        weakref.finalize(self, lambda: [h.remove() for h in handles])
        self.cache, self.cache_len, self.pending = None, 0, None

    def _captured(self, rows) -> torch.Tensor:
        """The features of the last target forward at `rows` -> (n, H) (fused for EAGLE-3)."""
        s = self._store
        feats = s["feats"] if not self.drafter.v3 else [s["aux"][k] for k in range(len(s["aux"]))]
        return self.drafter.fuse([f[0, rows].to(self.drafter.param_dtype) for f in feats])

    def start(self, prompt: list[int], hidden: torch.Tensor) -> None:
        self.cache, self.cache_len = self.drafter.new_cache(), 0
        self.pending = self._captured(slice(0, len(prompt)))  # (L, H) every prompt position

    def accepted(self, path: list[int], hidden: torch.Tensor) -> None:
        self.pending = self._captured(torch.tensor(path, device=hidden.device))  # root + accepted nodes

    def _run(self, feat, tokens, offset: int, ancestors: torch.Tensor) -> torch.Tensor:
        """Feed rows (feat (n, H), tokens (n,)) at position cache_len + offset after the committed prefix
        and the tree rows already cached; ancestors (n, tree rows + n) bool. -> output hidden (n, H)."""
        n = tokens.shape[0]
        prefix = torch.ones(n, self.cache_len, dtype=torch.bool, device=self.device)
        mask = torch.cat([prefix, ancestors], 1)[None, None]  # (1, 1, n, cache + tree)
        pos = torch.full((1, n), self.cache_len + offset, device=self.device)
        return self.drafter.body(feat[None], tokens[None], pos, mask, self.cache)[0]

    @torch.no_grad()
    def propose(self, context: list[int], sampling: Sampling) -> Draft:
        d, m = self.drafter, self.pending.shape[0]
        tokens = torch.tensor(context[self.cache_len + 1 : self.cache_len + 1 + m], device=self.device)
        causal = torch.ones(m, m, dtype=torch.bool, device=self.device).tril()
        pos = torch.arange(self.cache_len, self.cache_len + m, device=self.device)
        h = d.body(
            self.pending[None],
            tokens[None],
            pos[None],
            torch.cat([torch.ones(m, self.cache_len, dtype=torch.bool, device=self.device), causal], 1)[
                None, None
            ],
            self.cache,
        )[0]  # (m, H)
        self.cache_len += m
        score, tok = d.top_draft(h[-1], self.topk)  # (k,) after the root
        # candidates: cumulative score, token, parent candidate (-1 = root), depth
        scores, toks, parents, depths = score.tolist(), tok.tolist(), [-1] * self.topk, [1] * self.topk
        frontier = list(range(self.topk))
        feat = h[-1:].expand(self.topk, -1)  # each frontier node's input feature: its parent's output
        fed: list[int] = []  # candidates whose rows are in the drafter cache (tree rows), in order
        anc_rows = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # (fed, fed) ancestor-or-self
        for level in range(1, self.depth):
            n = len(frontier)
            par_rows = [fed.index(parents[c]) if parents[c] >= 0 else -1 for c in frontier]
            old = (
                torch.stack(
                    [
                        anc_rows[r] if r >= 0 else torch.zeros(len(fed), dtype=torch.bool, device=self.device)
                        for r in par_rows
                    ]
                )
                if fed
                else anc_rows.new_zeros(n, 0)
            )
            anc = torch.cat([old, torch.eye(n, dtype=torch.bool, device=self.device)], 1)  # (n, fed + n)
            out = self._run(
                feat, torch.tensor([toks[c] for c in frontier], device=self.device), level - 1, anc
            )
            anc_rows = torch.cat([torch.cat([anc_rows, anc_rows.new_zeros(len(fed), n)], 1), anc], 0)
            fed += frontier
            top_p, top_t = d.top_draft(out, self.topk)  # (n, k)
            cum = top_p + torch.tensor([scores[c] for c in frontier], device=self.device)[:, None]
            first = len(scores)
            for i, c in enumerate(frontier):
                scores += cum[i].tolist()
                toks += top_t[i].tolist()
                parents += [c] * self.topk
                depths += [level + 1] * self.topk
            best = cum.view(-1).topk(min(self.topk, cum.numel())).indices  # expand the most confident
            frontier = [first + int(b) for b in best]
            feat = out[best // self.topk]
        extra = self.cache.get_seq_length() - self.cache_len
        if extra:
            self.cache.crop(-extra)  # drop the tree rows: only the committed prefix stays cached
        return self._tree(scores, toks, parents, depths)

    def _tree(self, scores, toks, parents, depths) -> Draft:
        order = sorted(range(len(scores)), key=lambda c: (-scores[c], depths[c], c))
        chosen: set[int] = set()
        for c in order:  # re-rank: best total_tokens, each only after its parent
            if len(chosen) == self.total:
                break
            if parents[c] < 0 or parents[c] in chosen:
                chosen.add(c)
        nodes = sorted(chosen, key=lambda c: (depths[c], c))  # topological
        index = {c: i + 1 for i, c in enumerate(nodes)}
        tree = Tree(tuple([-1] + [index.get(parents[c], 0) for c in nodes]))
        return Draft(torch.tensor([toks[c] for c in nodes], device=self.device), tree)


@dataclass
class EagleOptions(ProposerConfig):
    """An EAGLE-1 or EAGLE-3 drafter on EAGLE-2's dynamic tree: `tree_nodes` nodes, `num_draft_tokens` levels
    deep, expanding the `topk` most confident nodes per level (None: EAGLE_TREE on CUDA, CPU_EAGLE_TREE on CPU)."""

    method: ClassVar[str] = "eagle"
    drafter: EagleDrafter | None = None
    num_draft_tokens: int | None = None
    tree_nodes: int | None = None
    topk: int | None = None

    def __post_init__(self) -> None:
        check_positive(self.method, num_draft_tokens=self.num_draft_tokens, tree_nodes=self.tree_nodes,
                       topk=self.topk)  # fmt: skip

    def make(self, decoder) -> EagleProposer:
        if self.drafter is None:
            raise ValueError(f"method {self.method!r} needs drafter= (an EagleDrafter), e.g. build_decoder()")
        self.drafter.to(decoder.device)
        decoder.runner.cuda_graphs = False  # target features are read through hooks, which graph replays skip
        decoder.runner.compiled = False  # and which a graph compiled (and shared) without them would not call
        depth, nodes, width = EAGLE_TREE if decoder.device.type == "cuda" else CPU_EAGLE_TREE
        return EagleProposer(
            self.drafter,
            decoder.backbone,
            decoder.device,
            depth if self.num_draft_tokens is None else self.num_draft_tokens,
            nodes if self.tree_nodes is None else self.tree_nodes,
            width if self.topk is None else self.topk,
        )


@dataclass
class Eagle3Options(EagleOptions):
    """The same dynamic tree for an EAGLE-3 drafter (the drafter, not the proposer, fuses three target layers)."""

    method: ClassVar[str] = "eagle3"


def chain_options(k: int, drafter) -> tuple[dict, int]:
    """Decoder options for a chain of k drafts (one node per level) -> (options, chain length)."""
    return {"num_draft_tokens": k, "tree_nodes": k, "topk": 1}, k


def _all_candidates(depth: int, topk: int) -> int:
    return topk + (depth - 1) * topk * topk


class EagleTuning:
    """What the tuner (eval/tuning/tuner.py) needs to choose (depth, nodes, top-k) and vLLM's K for this drafter. The
    dynamic tree is modelled by the static tree `tree_from_accuracy` builds from the measured acceptance by
    depth and rank cut to `depth` levels and `topk` ranks (EAGLE-2's premise: the drafter's confidence ranks
    candidates as acceptance does); its cost is `depth` drafter levels at `topk` rows."""

    max_chain = MAX_CHAIN

    def __init__(self, drafter: EagleDrafter, backbone) -> None:
        self.drafter, self.backbone = drafter, backbone

    def table(self) -> None:
        return None  # measured by decoding with the probe tree

    def probe(self, cuda: bool) -> dict:
        depth, topk = PROBE if cuda else CPU_PROBE
        return {"num_draft_tokens": depth, "topk": topk, "tree_nodes": _all_candidates(depth, topk)}

    def settings(self, acc: list[list[float]], max_width: int) -> list[Setting]:
        out = []
        for depth in range(1, len(acc) + 1):
            for topk in range(1, len(acc[0]) + 1):
                rows = [row[:topk] for row in acc[:depth]]
                for nodes in range(depth, min(max_width - 1, _all_candidates(depth, topk)) + 1):
                    opts = {"num_draft_tokens": depth, "tree_nodes": nodes, "topk": topk}
                    out.append(Setting(opts, tree_from_accuracy(rows, nodes), f"depth{depth}_topk{topk}"))
        return out

    def chain(self, k: int) -> Setting:
        return Setting(chain_options(k, self.drafter)[0], chain_tree(k), f"depth{k}_topk1")

    def draft_steps(self, backbone, keys: set[str], context: list[int], compile: bool = False) -> dict:
        """{key: a callable running one draft step of that key}: a proposer per key, started on one prefill of
        `context`, then proposing (one new row each time, as after a step that accepted nothing). Eager whatever
        `compile` says: EAGLE proposers draft eagerly in a compiled decoder too."""
        from headstart.eval.engine.runner import ModelRunner

        device, greedy = backbone.device, Sampling()
        proposers = {}
        for key in keys:
            depth, topk = (int(x) for x in key.removeprefix("depth").split("_topk"))
            proposers[key] = EagleProposer(
                self.drafter, backbone, device, depth, _all_candidates(depth, topk), topk
            )
        runner = ModelRunner(backbone, len(context) + 1)
        hidden, _ = runner.prefill(context)  # every proposer's hooks capture the prompt's features
        longer = context * 2  # room for the tokens each propose reads after the prompt

        def step(p: EagleProposer):
            def run():
                p.propose(longer, greedy)
                p.accepted([0], hidden[None])

            return run

        for p in proposers.values():
            p.start(context, hidden)
            step(p)()  # the first proposal feeds the whole prompt: untimed
        return {key: step(p) for key, p in proposers.items()}


def tuning(backbone, drafter=None) -> EagleTuning:
    return EagleTuning(drafter, backbone)
