"""Acceptance rules on hand-made distributions: always/never accept, hand-computed residuals, and chi-square
checks that the sampling rules reproduce the target distribution exactly."""

import torch
from scipy.stats import chisquare

from headstart.eval.engine.acceptance import (
    greedy_tree,
    residual,
    sample_chain,
    sample_tree,
    target_probs,
    typical_tree,
)

# root -> a(1), b(2); a -> c(3); c -> d(4)
PARENTS = [-1, 0, 0, 1, 3]


def test_greedy_tree_takes_longest_matching_path():
    tokens = [7, 1, 2, 3, 4]
    assert greedy_tree(tokens, PARENTS, [1, 3, 0, 4, 9]) == ([0, 1, 3, 4], 9)  # all of a-c-d, bonus after d
    assert greedy_tree(tokens, PARENTS, [2, 3, 5, 4, 9]) == ([0, 2], 5)  # b matches, a's subtree unreachable
    assert greedy_tree(tokens, PARENTS, [1, 8, 0, 4, 9]) == ([0, 1], 8)  # a, then c rejected
    assert greedy_tree(tokens, PARENTS, [6, 3, 0, 4, 9]) == ([0], 6)  # nothing: the target's own token


def test_greedy_tree_prefers_deeper_branch_among_duplicates():
    # two children with the same token: the one with a matching grandchild wins
    parents, tokens = [-1, 0, 0, 2], [0, 5, 5, 6]
    assert greedy_tree(tokens, parents, [5, 1, 6, 2]) == ([0, 2, 3], 2)


def test_target_probs_temperature_and_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(target_probs(logits, 1.0), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(target_probs(logits, 1.0, top_p=0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(
        target_probs(logits, 1.0, top_p=0.81), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95
    )
    sharp = target_probs(logits, 0.5)
    torch.testing.assert_close(sharp, torch.tensor([0.25, 0.09, 0.0225, 0.0025]) / 0.365)


def test_residual_hand_computed():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.1, 0.2])
    torch.testing.assert_close(residual(p, q), torch.tensor([0.75, 0.0, 0.25, 0.0]))  # (.3, 0, .1, 0) / .4
    torch.testing.assert_close(residual(p, p), p)  # nothing left: p itself (never sampled in practice)


def test_sample_chain_always_and_never_accept():
    g = torch.Generator().manual_seed(0)
    V, K = 5, 3
    drafts = torch.tensor([1, 2, 3])
    q = torch.eye(V)[drafts]  # (K, V) point masses on the drafts
    p_all = torch.cat([q, torch.full((1, V), 0.2)])  # target agrees: all K accepted, bonus from p_{K+1}
    for _ in range(20):
        n, _ = sample_chain(drafts, q, p_all, g)
        assert n == K
    p_none = torch.zeros(K + 1, V)
    p_none[:, 0] = 1.0  # target never produces a draft: 0 accepted, bonus from residual = token 0
    assert sample_chain(drafts, q, p_none, g) == (0, 0)


def test_sample_chain_matches_target_distribution():
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])  # (K+1, V), K=1
    q = torch.tensor([[0.1, 0.6, 0.1, 0.2]])
    counts = torch.zeros(4)
    n_acc = 0
    for _ in range(6000):
        draft = torch.multinomial(q[0], 1, generator=g)
        n, bonus = sample_chain(draft, q, p, g)
        first = int(draft) if n else bonus
        counts[first] += 1
        n_acc += n
    assert chisquare(counts.numpy(), p[0].numpy() * counts.sum().item()).pvalue > 1e-3
    # acceptance rate = sum min(p, q) = .1 + .3 + .1 + .05
    assert abs(n_acc / 6000 - 0.55) < 0.03


def test_sample_tree_always_and_never_accept():
    g = torch.Generator().manual_seed(0)
    tokens = [0, 1, 2, 3, 4]  # tokens of a, b, c, d
    always = torch.zeros(5, 6)
    always[0, 1] = always[1, 3] = always[3, 4] = 1.0  # the target follows a-c-d surely
    always[4, 5] = 1.0
    assert sample_tree(tokens, PARENTS, always, g) == ([0, 1, 3, 4], 5)
    never = torch.zeros(5, 6)
    never[:, 5] = 1.0
    assert sample_tree(tokens, PARENTS, never, g) == ([0], 5)


def test_sample_tree_residual_after_rejecting_siblings():
    """p = (.4, .3, .2, .1) at the root, children tokens 0 and 1. Hand-computed:
    P(accept 0) = .4; P(reject 0, accept 1) = .6 * (.3/.6) = .3; else draw from norm(.2, .1) = (2/3, 1/3)."""
    g = torch.Generator().manual_seed(2)
    parents, tokens = [-1, 0, 0], [9, 0, 1]
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 3)
    counts = torch.zeros(4)
    paths = {1: 0, 2: 0}
    for _ in range(8000):
        path, bonus = sample_tree(tokens, parents, probs, g)
        counts[tokens[path[1]] if len(path) > 1 else bonus] += 1
        if len(path) > 1:
            paths[path[1]] += 1
        else:
            assert bonus in (2, 3)  # rejected tokens are never re-drawn
    assert chisquare(counts.numpy(), probs[0].numpy() * 8000).pvalue > 1e-3
    assert abs(paths[1] / 8000 - 0.4) < 0.03 and abs(paths[2] / 8000 - 0.3) < 0.03


def test_sample_tree_two_levels_matches_ancestral_sampling():
    """Root children tokens 0, 1; under token 0 children tokens 2, 0. The emitted first two tokens must be
    distributed as p_root(x1) * p_x1(x2)."""
    g = torch.Generator().manual_seed(3)
    V = 4
    parents, tokens = [-1, 0, 0, 1, 1], [9, 0, 1, 2, 0]
    p_root = torch.tensor([0.35, 0.25, 0.25, 0.15])
    p_after0 = torch.tensor([0.2, 0.1, 0.3, 0.4])
    p_after1 = torch.tensor([0.25, 0.25, 0.25, 0.25])
    probs = torch.stack([p_root, p_after0, p_after1, torch.full((V,), 0.25), torch.full((V,), 0.25)])
    counts = torch.zeros(V, V)  # (x1, x2) with x1 = 0 only (others end the step after one token)
    n = 10000
    first = torch.zeros(V)
    for _ in range(n):
        path, bonus = sample_tree(tokens, parents, probs, g)
        seq = [tokens[i] for i in path[1:]] + [bonus]
        first[seq[0]] += 1
        if seq[0] == 0:
            counts[0, seq[1]] += 1
    assert chisquare(first.numpy(), (p_root * n).numpy()).pvalue > 1e-3
    row = counts[0]
    assert chisquare(row.numpy(), (p_after0 * row.sum()).numpy()).pvalue > 1e-3


def test_typical_tree_thresholds():
    g = torch.Generator().manual_seed(0)
    parents, tokens = [-1, 0, 1], [9, 0, 1]
    peaked = torch.tensor([0.91, 0.03, 0.03, 0.03])  # H ~ .39: threshold min(.09, .3 e^-H) = .09
    probs = torch.stack([peaked, torch.tensor([0.05, 0.85, 0.05, 0.05]), peaked])
    assert typical_tree(tokens, parents, probs, g)[0] == [0, 1, 2]
    low = torch.stack([torch.tensor([0.08, 0.02, 0.45, 0.45]), peaked, peaked])  # .08 < .09: rejected
    path, bonus = typical_tree(tokens, parents, low, g)
    assert path == [0]


def test_sample_chain_never_accepts_outside_top_p():
    g = torch.Generator().manual_seed(0)
    p = target_probs(torch.log(torch.tensor([[0.6, 0.3, 0.08, 0.02]] * 2)), 1.0, top_p=0.9)  # keeps 0, 1
    q = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # the draft always proposes the truncated tail token
    for _ in range(50):
        assert sample_chain(torch.tensor([3]), q, p, g)[0] == 0
        assert sample_chain(torch.tensor([3]), q, p, g)[1] in (0, 1)
