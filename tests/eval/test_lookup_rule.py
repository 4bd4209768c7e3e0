"""The hybrid's rule, tuned (eval/tuning/lookup_rule.py): which (lookup chain L, min_match m) wins on greedy tau,
the lengths searched, and a real tune on a tiny backbone whose record the serve check and the cards read back."""

import pytest

from headstart.eval.tuning.lookup_rule import TAU_SLACK, lookup_lengths, pick_rule, tune_lookup_rule
from headstart.models.decoding import plugin_serving, served_rule

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_best_tau_wins_and_near_ties_go_to_the_narrower_rule():
    assert pick_rule({None: 1.2, (2, 1): 1.3, (2, 2): 1.35, (4, 1): 1.5, (4, 2): 1.45}) == (4, 1)
    near = 1.5 * (1 - TAU_SLACK / 2)  # within the slack of the best: the shorter chain, then the larger m
    assert pick_rule({None: 1.2, (2, 1): near, (2, 2): near, (4, 1): 1.5}) == (2, 2)
    assert pick_rule({None: 1.5, (2, 1): 1.5, (4, 1): 1.49}) is None  # the drafter alone is in the tie


def test_lookup_lengths_run_from_the_drafters_chain_to_ngrams():
    assert lookup_lengths(2, reachable=16) == [2, 3, 4]
    assert lookup_lengths(2, reachable=3) == [2, 3]  # a Medusa export cannot serve more heads than it has
    assert lookup_lengths(5, reachable=16) == [5]  # never shorter than the drafter's chain


def test_a_rule_is_served_as_the_longer_chain_with_the_drafter_cut():
    rule = served_rule({"lookup_rule": {"min_match": 2, "k": 2, "lookup_tokens": 4}}, 2)
    assert plugin_serving(rule) == (4, {"headstart_lookup": {"min_match": 2, "drafter_tokens": 2}})
    same = served_rule({"lookup_rule": {"min_match": 1, "k": 3}}, 3)  # written before L was tuned: L = k
    assert plugin_serving(same) == (3, {"headstart_lookup": {"min_match": 1}})
    assert served_rule({"lookup_rule": {"min_match": 2, "k": 2, "lookup_tokens": 4}}, 3) is None  # another K
    assert served_rule({"lookup_rule": {"min_match": None, "k": 2, "lookup_tokens": 2}}, 2) is None
    grows = served_rule({"lookup_rule": {"min_match": 2, "k": 2, "lookup_tokens": 3, "max_tokens": 8}}, 2)
    assert plugin_serving(grows) == (
        8,
        {"headstart_lookup": {"min_match": 2, "drafter_tokens": 2, "lookup_tokens": 3, "max_ngram": 8}},
    )


def test_tuning_decodes_every_rule_and_records_the_choice(backbone):
    """A repetitive prompt on random heads: lookup chains are accepted where the heads' drafts are not, so
    some rule beats the heads alone, and every (L, m) searched has its tau."""
    import torch

    from headstart.eval.engine.proposers import chain_options
    from headstart.models.checkpoint import LoadedDrafter, build_drafter
    from headstart.models.medusa import MedusaConfig

    torch.manual_seed(0)
    heads = build_drafter("medusa", MedusaConfig(num_heads=3), backbone).eval()
    loaded = LoadedDrafter(heads, {"method": "medusa"})
    chain, _ = chain_options("medusa", 1, heads)
    prompt = [5, 6, 7, 8, 9, 10] * 4
    rule = tune_lookup_rule(backbone, "medusa", loaded, chain, 1, [prompt], 12, lookup_lengths(1, 3))
    grown = (
        f"L={rule.lookup_tokens},m={rule.min_match},max=8"  # the chosen rule, tried growing with its match
    )
    fixed = {f"L={L},m={m}" for L in (1, 2, 3) for m in (1, 2, 3)}
    assert set(rule.tau_by_rule) == {"none", grown} | fixed
    assert rule.min_match is not None and rule.k == 1 and rule.lookup_tokens in (1, 2, 3)
    kept = rule.tau_by_rule[grown] > rule.tau_by_rule[grown.rsplit(",", 1)[0]] * (1 + TAU_SLACK)
    assert rule.max_tokens == (8 if kept else None) and rule.served_k == (8 if kept else rule.lookup_tokens)


def test_recorded_taus_are_not_decoded_again(backbone, monkeypatch):
    """An older record's fixed-chain taus (same prompts) are reused: only the growing chain is decoded."""
    import headstart.eval.tuning.lookup_rule as lookup_rule

    built = []
    real = lookup_rule.build_decoder
    monkeypatch.setattr(lookup_rule, "build_decoder", lambda *a, **kw: built.append(kw) or real(*a, **kw))
    import torch

    from headstart.eval.engine.proposers import chain_options
    from headstart.models.checkpoint import LoadedDrafter, build_drafter
    from headstart.models.medusa import MedusaConfig

    torch.manual_seed(0)
    heads = build_drafter("medusa", MedusaConfig(num_heads=3), backbone).eval()
    chain, _ = chain_options("medusa", 1, heads)
    known = {"none": 1.0, "L=1,m=1": 1.2, "L=1,m=2": 1.5, "L=1,m=3": 1.1}
    rule = tune_lookup_rule(
        backbone, "medusa", LoadedDrafter(heads, {"method": "medusa"}), chain, 1, [[5, 6, 7, 8] * 4], 8,
        [1], long_chain=3, known=known,
    )  # fmt: skip
    assert built == [chain | {"lookup_tokens": 1, "lookup_min_match": 2, "lookup_max_tokens": 3}]
    assert {k: rule.tau_by_rule[k] for k in known} == known and (rule.lookup_tokens, rule.min_match) == (1, 2)
