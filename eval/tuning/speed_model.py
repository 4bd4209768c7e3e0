"""Predicted speed of a speculative decoding setting from measured costs and acceptance.

Expected tokens per step (Medusa, Cai et al. 2024, Sec. 2.1.2, the estimate behind its "optimized tree"): with
acc[d][r] the probability that the rank-r candidate at depth d+1 is accepted given that its parent was, a node
is accepted with the product of acc along its root-to-node path, and every step emits the accepted path plus
one bonus token from the target:

    E[tokens / step] = 1 + sum over non-root nodes v of  prod_{u on root -> v} acc[depth(u) - 1][rank(u)]

so a chain of top-1 drafts with per-position acceptance a1, a2 gives 1 + a1 + a1 a2, and adding the rank-1
sibling of the first draft adds acc[0][1]. A step costs one verify forward of the tree's width W (root
included), the drafter, and the decoder's bookkeeping (acceptance, cache compaction), all measured on the
device; vanilla decoding is the same loop at width 1 without a drafter:

    tokens/s = E / (c(W) + d(setting) + b(W))            speedup = tokens/s * (c(1) + b(1))

(Leviathan et al. 2023, Sec. 3.4, with the drafter's cost kept). Costs between measured widths are linear
interpolations, or for compiled steps the next measured width's (`Costs.between`).

A prompt-lookup branch merged into the tree (eval/engine/proposers/lookup_branch.py) is modelled from the
tuner's probe, step by step rather than by a table: each probe step records the ranks along the path the target
accepted, how many of the lookup chain's tokens it would have accepted, and where the chain ran inside the probe
tree. For a candidate tree, a step accepts the longer of its own path and the chain (both are root paths of one
trie), and the chain adds the nodes the tree does not already hold; the gain is its mean over the probe's
steps, the step cost the mean of the costs at the widths the steps had, and the search's cost is added. The
branch's length is a choice like the tree: a chain cut to n tokens accepts at most n and adds at most n nodes
(`up_to`), so `rank_with_branch` scores every length up to the eval's `lookup_tokens`, none included. Pure
functions: no timing happens here (eval/tuning/tuner.py measures).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from headstart.eval.engine.proposers.base import Setting
from headstart.eval.engine.tree import Tree, tree_paths


@dataclass
class Costs:
    """Seconds per step on one device: verify forward by width, drafter by key, bookkeeping by width, and one
    prefill of a typical prompt (for the speedup at a given answer length)."""

    verify: dict[int, float]  # width (root included) -> seconds of one target forward
    draft: dict[str, float]  # Setting.draft_key -> seconds of the drafter per step
    bookkeeping: dict[int, float]  # width -> seconds per step outside the forwards (interpolated)
    prefill: float = 0.0
    # a verify width between timed ones: "linear" (interpolated), or "next" (the next timed width's cost):
    # compiled, each width is its own graph and the cost is a step function of the width (micro-GEMM blocks:
    # SmolLM2 float32 AVX2, compiled, w4 26.0 ms, w8 34.5; a 7-wide verify decoded near w8's cost, not the
    # 32.4 ms a line between them gives), so a width not timed is priced at its bound
    between: str = "linear"

    @staticmethod
    def _at(table: dict[int, float], width: float, between: str = "linear") -> float:
        xs = sorted(table)
        if between == "next":
            return table[next((x for x in xs if x >= width), xs[-1])]
        return float(np.interp(width, xs, [table[x] for x in xs]))

    def step(self, setting: Setting, width: float = 0.0) -> float:
        w = width or setting.tree.size
        verify = self._at(self.verify, w, self.between)
        return verify + self.draft[setting.draft_key] + self._at(self.bookkeeping, w)

    def vanilla_step(self) -> float:
        return self._at(self.verify, 1) + self._at(self.bookkeeping, 1)

    def to_json(self) -> dict:
        return {
            k: {str(w): v for w, v in t.items()} if isinstance(t, dict) else t
            for k, t in asdict(self).items()
        }

    @classmethod
    def from_json(cls, d: dict) -> Costs:
        return cls(
            verify={int(w): v for w, v in d["verify"].items()},
            draft=dict(d["draft"]),
            bookkeeping={int(w): v for w, v in d["bookkeeping"].items()},
            prefill=d.get("prefill", 0.0),
            between=d.get("between", "linear"),
        )


def non_decreasing(table: dict[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of costs by width (pool adjacent violators): a forward of more
    tokens never costs less, so a narrower width timed slower than a wider one is noise, averaged out (a
    loaded CPU timed width 3 5% below width 1, which made the tuner 9% optimistic)."""
    blocks: list[list[float]] = []  # [mean, count] of pooled adjacent widths
    for w in sorted(table):
        blocks.append([table[w], 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    fitted = [m for m, n in blocks for _ in range(int(n))]
    return dict(zip(sorted(table), fitted))


def expected_tokens(tree: Tree, acc: list[list[float]]) -> float:
    """E[tokens emitted per step] for `tree` (with top-k ranks) under acceptance table acc[depth-1][rank]
    (0 beyond the table): 1 (the bonus token) + the sum of the path products."""
    if len(tree.ranks) != tree.size:
        raise ValueError(
            "expected_tokens needs a tree with top-k ranks (tree_from_paths / tree_from_accuracy)"
        )
    reach = [1.0] * tree.size  # P(node accepted); the root always is
    for i in range(1, tree.size):
        d, r = tree.depth[i] - 1, tree.ranks[i]
        a = acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
        reach[i] = reach[tree.parents[i]] * a
    return 1.0 + sum(reach[1:])


@dataclass(frozen=True)
class LookupStep:
    """One probe step as a prompt-lookup branch would have seen it: the ranks of the nodes on the path the
    target accepted (root excluded), how many of the lookup chain's tokens it would have accepted, the ranks of
    the chain's leading tokens that the probe tree also held (the trie they would share), the chain's length
    (0: no n-gram matched)."""

    accepted: tuple[int, ...]
    lookup_accepted: int
    chain_in_tree: tuple[int, ...]
    chain_len: int


@dataclass
class Branch:
    """A lookup branch to model: the probe's steps and the search's seconds per step. `padded` (0: not): the
    branch's length when verify steps run at fixed shapes (compiled, eval/engine/compiled.py), where a step the
    chain added nodes to is padded to the tree plus that many nodes, and the others verify the tree alone (the
    decoder's two widths, eval/engine/proposers/lookup_branch.py)."""

    steps: list[LookupStep]
    search_s: float
    padded: int = 0


def up_to(steps: list[LookupStep], n: int) -> list[LookupStep]:
    """The probe's steps as a branch of at most `n` lookup tokens would have seen them (the chain's first n)."""
    return [
        LookupStep(s.accepted, min(s.lookup_accepted, n), s.chain_in_tree[:n], min(s.chain_len, n))
        for s in steps
    ]


def branch_effect(tree: Tree, steps: list[LookupStep]) -> tuple[float, dict[int, float]]:
    """(extra tokens accepted per step, {verify nodes the branch adds: fraction of steps}) that a lookup branch
    gives `tree`, over the probe's steps. The nodes come as a distribution, not a mean: the branch adds its
    whole chain on some steps and nothing on others, and the verify cost is not linear in width (on this
    CPU it jumps between widths 5 and 6), so the mean cost of the widths is not the cost of the mean width."""
    if not steps:
        return 0.0, {}
    paths = {tuple(p) for p in tree_paths(tree)}

    def inside(ranks: tuple[int, ...]) -> int:  # how deep the rank sequence runs inside the tree
        n = 0
        while n < len(ranks) and ranks[: n + 1] in paths:
            n += 1
        return n

    gain, added = 0, {}
    for s in steps:
        own = inside(s.accepted)
        gain += max(own, s.lookup_accepted) - own
        k = s.chain_len - inside(s.chain_in_tree) if s.chain_len else 0
        added[k] = added.get(k, 0) + 1
    return gain / len(steps), {k: n / len(steps) for k, n in sorted(added.items())}


def predict(setting: Setting, acc: list[list[float]], costs: Costs, branch: Branch | None = None) -> dict:
    """The setting's expected tokens per step, seconds per step, tokens/s and speedup over vanilla (with a
    lookup branch on top when given: the step cost averaged over the widths the branch makes, or at the
    whole branch's width when steps are padded)."""
    e, extra, added, search = expected_tokens(setting.tree, acc), {}, {}, 0.0
    if branch is not None:
        gain, added = branch_effect(setting.tree, branch.steps)
        e, search = e + gain, branch.search_s
        extra = {"lookup_gain": gain, "lookup_nodes": sum(k * p for k, p in added.items())}
        if branch.padded:  # a step the chain added to verifies the tree plus the whole branch
            none = added.get(0, 0.0)
            added = {0: none, branch.padded: 1.0 - none} if none < 1.0 else {0: 1.0}
    width = setting.tree.size
    step = sum(p * costs.step(setting, width + k) for k, p in (added or {0: 1.0}).items()) + search
    return {
        "tokens_per_step": e,
        "step_ms": 1000 * step,
        "tokens_per_s": e / step,
        "speedup": e / step * costs.vanilla_step(),
        **extra,
    }


def _fastest_first(scored: list[tuple[Setting, dict]]) -> list[tuple[Setting, dict]]:
    """Ties: the smaller verify width, then the shorter lookup branch, then the listed order."""
    order = sorted(
        range(len(scored)),
        key=lambda i: (
            -scored[i][1]["tokens_per_s"],
            scored[i][0].tree.size,
            scored[i][1].get("branch_tokens", 0),
            i,
        ),
    )
    return [scored[i] for i in order]


def rank(
    settings: list[Setting], acc: list[list[float]], costs: Costs, branch: Branch | None = None
) -> list[tuple[Setting, dict]]:
    """(setting, prediction) pairs, fastest first; only settings whose width was measured (no extrapolation)."""
    return _fastest_first([(s, predict(s, acc, costs, branch)) for s in settings if _priced(s, 0, costs)])


def _priced(setting: Setting, branch_tokens: int, costs: Costs) -> bool:
    """Whether the setting's widest verify (its tree plus the whole branch) is within the measured widths: past
    the widest, interpolation would price it at the widest's cost."""
    return setting.tree.size + branch_tokens <= max(costs.verify)


def rank_with_branch(
    settings: list[Setting], acc: list[list[float]], costs: Costs, branch: Branch, max_tokens: int
) -> list[tuple[Setting, dict]]:
    """Like `rank`, over every setting with a lookup branch of 0 (none, no search) to `max_tokens` tokens; each
    prediction names its length (`branch_tokens`)."""
    scored = []
    for n in range(max_tokens + 1):
        cut = Branch(up_to(branch.steps, n), branch.search_s, n if branch.padded else 0) if n else None
        scored += [
            (s, predict(s, acc, costs, cut) | {"branch_tokens": n}) for s in settings if _priced(s, n, costs)
        ]
    return _fastest_first(scored)


def speedup_at(steady: float, prefill_steps: float, new_tokens: float) -> float:
    """The end-to-end speedup of a turn of `new_tokens` tokens whose prefill costs `prefill_steps` vanilla
    steps (the same on both sides), given the steady-state speedup: (p + n) / (p + n / steady)."""
    if steady <= 0 or new_tokens <= 0:
        return steady
    return (prefill_steps + new_tokens) / (prefill_steps + new_tokens / steady)
