"""Lookahead decoding's pieces on hand-worked cases: the 2-D window as a tree (the paper's mask), the n-gram
pool, the Jacobi update and pool collection, guesses merged into the verify tree, and option checks."""

import pytest
import torch

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers import proposer_config
from headstart.eval.engine.proposers.base import Sampling
from headstart.eval.engine.proposers.lookahead import (
    LookaheadOptions,
    LookaheadProposer,
    NgramPool,
    window_parents,
)
from headstart.eval.engine.tree import Tree
from headstart.models.backbone import BackboneConfig, load_backbone


def test_window_is_the_papers_mask_as_a_tree():
    # W=3, N=3: level 0 = nodes 1,2,3 (a chain below the root), level 1 = nodes 4,5,6 below 1,2,3
    parents = window_parents(3, 3)
    assert parents == (-1, 0, 1, 2, 1, 2, 3)
    tree = Tree(parents)
    assert tree.depth == (0, 1, 2, 3, 2, 3, 4)  # level l, column i at depth i + l + 1
    anc = tree.ancestors.int().tolist()
    # level 1, column 1 (node 5) sees the root, level 0 up to its column (nodes 1, 2) and itself, nothing else
    assert anc[5] == [1, 1, 1, 0, 0, 1, 0]
    assert anc[3] == [1, 1, 1, 1, 0, 0, 0]  # level 0 is causal
    assert anc[4] == [1, 1, 0, 0, 1, 0, 0]
    assert window_parents(2, 2) == (-1, 0, 1)  # N=2: level 0 alone


def test_pool_keeps_the_newest_distinct_ngrams_per_first_token():
    pool = NgramPool(size=2)
    pool.add(7, (1, 2))
    pool.add(7, (3, 4))
    pool.add(7, (1, 2))  # re-added: newest again, not twice
    assert pool.get(7) == [(1, 2), (3, 4)]
    pool.add(7, (5, 6))  # over the size: the oldest (3, 4) goes
    assert pool.get(7) == [(5, 6), (1, 2)] and pool.get(8) == []
    assert pool.nbytes() > NgramPool(2).nbytes()


def proposer(window=2, ngram=3, guesses=2) -> LookaheadProposer:
    opts = LookaheadOptions(window=window, ngram=ngram, guesses=guesses)
    return LookaheadProposer(opts, torch.device("cpu"))


def logits_with_argmax(tokens: list[int]) -> torch.Tensor:
    """(len(tokens), 50) verify logits whose argmax after node i is tokens[i]."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), 50).float()


def test_jacobi_step_shifts_the_window_and_collects_ngrams():
    p = proposer()  # W=2, N=3: nodes 1,2 level 0; 3,4 level 1 (the newest)
    p.start([5], torch.zeros(4))
    p.levels = [[10, 11], [20, 21]]
    p.verified(logits_with_argmax([1, 2, 3, 30, 31]))  # the target's argmax after the newest level: 30, 31
    p.accepted([0], torch.zeros(5, 4))
    assert p.levels == [[20, 21], [30, 31]]
    assert p.pool.get(10) == [(20, 30)] and p.pool.get(11) == [(21, 31)]  # column trajectories


def test_guesses_for_the_root_join_the_window_as_a_trie():
    p = proposer()
    p.start([5], torch.zeros(4))
    p.levels = [[10, 11], [20, 21]]
    p.pool.add(9, (10, 12))  # shares node 1 (token 10 below the root), then a new node 12 below it
    p.pool.add(9, (13, 14))  # a new chain below the root
    p.pool.add(8, (1, 1))  # another first token: not proposed after root 9
    draft = p.propose([1, 9], Sampling())
    assert draft.tokens.tolist() == [10, 11, 20, 21, 13, 14, 12]
    assert draft.tree.parents == (-1, 0, 1, 1, 2, 0, 5, 1)
    assert draft.probs is None and p.width == 1 + (2 + 2) * 2
    assert p.counts["steps"] == p.counts["guessed"] == 1
    p.verified(logits_with_argmax([0] * 8))
    p.accepted([0, 5, 6], torch.zeros(8, 4))  # the accepted path ended on a guess
    p.verified(logits_with_argmax([0] * 8))
    p.accepted([0, 1], torch.zeros(8, 4))  # ... on the window
    assert p.counts["won_guess"] == p.counts["won_window"] == 1


@pytest.mark.parametrize("field,value", [("window", 0), ("ngram", 1), ("guesses", 0), ("window", 2.5)])
def test_bad_options_fail_naming_the_option(field, value):
    with pytest.raises(ValueError, match=rf"lookahead\.{field}={value}: must be an integer >= \d+\. Fix"):
        LookaheadOptions(**{field: value})


def test_options_go_only_to_lookahead():
    backbone = load_backbone(BackboneConfig(name="tiny", path="tiny", dtype="float32"))
    with pytest.raises(ValueError, match="window do.*not apply to method 'prompt_lookup'"):
        build_decoder("prompt_lookup", backbone, None, window=2)
    with pytest.raises(ValueError, match="max_ngram do.*not apply to method 'lookahead'"):
        proposer_config("lookahead", max_ngram=2)
    config = proposer_config("lookahead", window=5, ngram=4)  # by name, as the eval stage passes them
    assert isinstance(config, LookaheadOptions) and config.set() == {"window": 5, "ngram": 4}
    dec = build_decoder("lookahead", backbone, None, window=5, ngram=4)
    assert (dec.proposer.W, dec.proposer.N, dec.proposer.G) == (5, 4, 4) and dec.proposer.width == 1 + 9 * 3
    assert Decoder(backbone, "lookahead").proposer.width == 1 + (4 + 4) * 2  # the CPU defaults W=4, N=3, G=4
