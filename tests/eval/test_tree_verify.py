"""Tree construction, and one-forward tree verification against plain forwards of each root-to-leaf path."""

import os

import pytest
import torch

from headstart.eval.engine.kv_cache import CacheFullError, KVCache
from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import (
    MC_SIM_7B_63,
    TreeError,
    chain_tree,
    check_fits_heads,
    default_tree,
    tree_from_accuracy,
    tree_from_paths,
)
from headstart.models.backbone import BackboneConfig, load_backbone


@pytest.fixture(scope="module")
def varied():
    return load_backbone(
        BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2})
    )


def test_tree_from_paths_orders_by_depth_and_links_parents():
    tree = tree_from_paths([[0, 1], [1], [0], [0, 0], [0, 0, 0]])
    # sorted (len, path): (0,) (1,) (0,0) (0,1) (0,0,0); node 0 is the root
    assert tree.parents == (-1, 0, 0, 1, 1, 3)
    assert tree.ranks == (-1, 0, 1, 0, 1, 0)
    assert tree.depth == (0, 1, 1, 2, 2, 3)
    anc = tree.ancestors
    assert anc[5].tolist() == [True, True, False, True, False, True]
    with pytest.raises(TreeError, match="prefix"):
        tree_from_paths([[0], [1, 0]])
    with pytest.raises(TreeError, match="duplicates"):
        tree_from_paths([[0], [0]])


def test_mc_sim_prefixes_are_trees_and_default_respects_heads():
    for n in range(1, len(MC_SIM_7B_63) + 1):
        tree_from_paths(MC_SIM_7B_63[:n])  # greedy order: every prefix is closed under parents
    assert default_tree(4).size == 64
    three = default_tree(3)
    assert three.max_depth == 3 and three.size == 1 + sum(len(p) <= 3 for p in MC_SIM_7B_63)
    assert default_tree(5, num_nodes=20).size == 21
    check_fits_heads(three, 3)
    with pytest.raises(TreeError, match="depth 4 > 3"):
        check_fits_heads(default_tree(4), 3)


def test_tree_from_accuracy_is_greedy_on_path_products():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.3], [0.4]]
    tree = tree_from_accuracy(acc, 5)
    # values: (0)=.6 (0,0)=.3 (1)=.2 (0,1)=.18 (0,0,0)=.12 (2)=.1 ...
    paths = {(0,), (0, 0), (1,), (0, 1), (0, 0, 0)}
    got = set()
    for i in range(1, tree.size):
        path, node = [], i
        while node:
            path.append(tree.ranks[node])
            node = tree.parents[node]
        got.add(tuple(reversed(path)))
    assert got == paths
    assert tree_from_accuracy(acc, 100).size == 1 + 3 + 3 * 2 + 3 * 2 * 1  # capped by the full tree


def _plain_logits(backbone, ids):
    with torch.no_grad():
        return backbone.model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("paths", [MC_SIM_7B_63[:30], [[0], [1], [0, 0], [1, 0], [1, 1], [1, 0, 0]]])
def test_tree_forward_matches_plain_forward_on_every_path(varied, paths):
    tree = tree_from_paths(paths)
    runner = ModelRunner(varied, max_cache_len=128)
    prefix = list(range(40, 60))
    runner.prefill(prefix[:-1])
    g = torch.Generator().manual_seed(0)
    tokens = [prefix[-1]] + torch.randint(0, varied.vocab_size, (tree.size - 1,), generator=g).tolist()
    with torch.inference_mode():
        hidden, logits = runner.step(torch.tensor(tokens), tree)
    assert runner.length == len(prefix) - 1  # nothing committed
    children = {p for p in tree.parents}
    for leaf in (i for i in range(tree.size) if i not in children):
        path = [leaf]
        while path[-1]:
            path.append(tree.parents[path[-1]])
        path.reverse()
        ref = _plain_logits(varied, prefix[:-1] + [tokens[i] for i in path])[-len(path) :]
        torch.testing.assert_close(logits[path], ref, rtol=1e-4, atol=1e-4)


def test_grouped_sdpa_on_cpu_matches_copied_heads(varied, monkeypatch):
    """A CPU runner turns on transformers' grouped-head SDPA (no K/V copies under a mask); a tree verify gives the
    logits the copied-heads path gives. The tiny model has 4 query / 2 K/V heads."""
    from headstart.eval.engine.runner import GROUPED_SDPA

    assert varied.config.num_attention_heads > varied.config.num_key_value_heads
    tree = tree_from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    tokens = torch.tensor([59, 3, 4, 5, 6, 7])

    def verify() -> torch.Tensor:
        runner = ModelRunner(varied, max_cache_len=64)
        runner.prefill(list(range(40, 59)))
        with torch.inference_mode():
            return runner.step(tokens, tree)[1]

    monkeypatch.setenv(GROUPED_SDPA, "0")
    copied = verify()
    monkeypatch.delenv(GROUPED_SDPA)
    grouped = verify()
    assert os.environ[GROUPED_SDPA] == "1"  # set by the runner where nothing was
    torch.testing.assert_close(grouped, copied, rtol=1e-5, atol=1e-5)


def test_accept_compacts_cache_to_what_a_plain_forward_caches(varied):
    tree = tree_from_paths([[0], [1], [2], [1, 0], [1, 1], [1, 1, 0]])
    runner = ModelRunner(varied, max_cache_len=64)
    prefix = [5, 6, 7, 8]
    runner.prefill(prefix)
    tokens = [9, 10, 11, 12, 13, 14, 15]
    with torch.inference_mode():
        runner.step(torch.tensor(tokens), tree)
    path = [0, 2, 5, 6]  # root -> (1) -> (1,1) -> (1,1,0)
    runner.cache.accept(path)
    assert runner.length == len(prefix) + len(path)
    ref = KVCache(varied.config, 64, torch.float32)
    seq = prefix + [tokens[i] for i in path]
    with torch.no_grad():
        varied.model.model(input_ids=torch.tensor([seq]), cache=ref, use_cache=True)
    n = len(seq)
    torch.testing.assert_close(runner.cache.kv[..., :n, :], ref.kv[..., :n, :], rtol=1e-5, atol=1e-5)
    # and the next step sees the compacted prefix: same logits as a plain forward
    with torch.inference_mode():
        _, logits = runner.step(torch.tensor([3]), None)
    torch.testing.assert_close(logits[-1], _plain_logits(varied, seq + [3])[-1], rtol=1e-4, atol=1e-4)


def test_chain_tree_is_causal():
    tree = chain_tree(3)
    assert tree.parents == (-1, 0, 1, 2)
    assert torch.equal(tree.ancestors, torch.ones(4, 4, dtype=torch.bool).tril())


def test_cache_length_rules_and_overflow(varied):
    runner = ModelRunner(varied, max_cache_len=8)
    runner.prefill([1, 2, 3, 4, 5])
    cache = runner.cache
    cache.crop(-2)
    assert cache.length == cache.get_seq_length() == 3
    with pytest.raises(ValueError, match="negative"):
        cache.crop(1)
    with pytest.raises(ValueError, match="rollback"):
        cache.rollback(4)
    with pytest.raises(CacheFullError, match="max_cache_len=8"):
        runner.step(torch.arange(6), chain_tree(5))
