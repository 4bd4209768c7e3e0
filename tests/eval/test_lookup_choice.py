"""Drafter chain OR lookup chain per step (eval/engine/proposers/lookup_choice.py, the rule the vLLM plugin serves):
the choice by match length by hand, greedy output == vanilla for Medusa and EAGLE-3 chains with lookup chosen on
some steps, and after every step the drafter's proposal equals a freshly started drafter's on the same context."""

import pytest
import torch
from test_lookup_branch import TEXTS, Fixed, fresh_proposal

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.base import Sampling
from headstart.eval.engine.proposers.eagle import Eagle3Options
from headstart.eval.engine.proposers.lookup_choice import LookupChoice
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.proposers.prompt_lookup import find_match
from headstart.eval.engine.tree import chain_tree
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_find_match_reports_the_matched_ngram_length():
    assert find_match(torch.tensor([1, 2, 3, 9, 1, 2, 3]), 3, 2) == (3, [9, 1])
    assert find_match(torch.tensor([5, 6, 7, 8, 6]), 3, 3) == (1, [7, 8, 6])
    assert find_match(torch.tensor([1, 2, 3]), 3, 2) == (0, [])


def test_the_lookup_chain_is_chosen_only_at_min_match_or_longer():
    inner = Fixed([10, 11], chain_tree(2))
    cpu = torch.device("cpu")
    for m, chosen in ((1, True), (2, True), (3, False)):
        choice = LookupChoice(inner, m, 3, cpu)
        draft = choice.propose([4, 5, 6, 7, 4, 5], Sampling())  # "4 5" seen before: a 2-gram match
        assert (draft.tokens.tolist() == [6, 7, 4]) is chosen and (draft is inner.draft) is not chosen
        assert choice.counts == {"steps": 1, "lookup": int(chosen)}
    assert LookupChoice(inner, 1, 3, cpu).width == 4
    short = LookupChoice(inner, 1, 4, cpu).propose([1, 4, 5, 6, 4, 5], Sampling())
    assert short.tokens.tolist() == [6, 4, 5]  # 3 follow, not 4: the shorter chain, as vLLM's ngram drafts
    choice.accepted([0, 1], None)
    assert inner.paths == [[0, 1]]
    with pytest.raises(ValueError, match="lookup_min_match=4: must be in 1..3"):
        LookupChoice(inner, 4, 3, cpu)


class Stateless(Fixed):
    """A drafter whose proposal changes nothing (Medusa's heads): counted, so skipping it shows."""

    stateless = True

    def __init__(self, tokens, tree):
        super().__init__(tokens, tree)
        self.calls = 0

    def propose(self, context, sampling):
        self.calls += 1
        return super().propose(context, sampling)


def test_a_stateless_drafter_is_run_only_when_the_lookup_chain_loses():
    inner = Stateless([10, 11], chain_tree(2))
    choice = LookupChoice(inner, 2, 3, torch.device("cpu"))
    assert choice.propose([4, 5, 6, 7, 4, 5], Sampling()).tokens.tolist() == [6, 7, 4]
    assert inner.calls == 0  # the lookup chain won: the heads were not run, as the plugin skips vLLM's
    assert choice.propose([4, 5, 6, 7, 8, 9], Sampling()) is inner.draft and inner.calls == 1


class Recorder:
    """Keeps each context with the drafter's own proposal (the drafter runs every step, chosen or not)."""

    def __init__(self, inner):
        self.inner, self.width, self.steps = inner, inner.width, []

    def start(self, prompt, hidden):
        self.inner.start(prompt, hidden)

    def propose(self, context, sampling):
        draft = self.inner.propose(context, sampling)
        self.steps.append((list(context), draft))
        return draft

    def accepted(self, path, hidden):
        self.inner.accepted(path, hidden)


def check_choice(backbone, make, max_new=40):
    vanilla, dec, reference = Decoder(backbone), make(), make()
    rec = Recorder(dec.proposer)
    dec.proposer = choice = LookupChoice(rec, 2, 3, dec.device)
    for text in TEXTS:
        prompt = backbone.tokenizer(text)["input_ids"]
        out = dec.generate(prompt, max_new, eos_token_ids=[])
        assert out.tokens == vanilla.generate(prompt, max_new, eos_token_ids=[]).tokens, text
    assert 0 < choice.counts["lookup"] < choice.counts["steps"], choice.counts
    for context, draft in rec.steps:  # the drafter's state followed the context, lookup steps included
        fresh = fresh_proposal(reference, context)
        assert draft.tokens.tolist() == fresh.tokens.tolist()


def test_medusa_chain_with_lookup_choice_is_lossless_and_keeps_its_state():
    backbone = load_backbone(
        BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, "initializer_range": 0.1})
    )
    heads = build_drafter("medusa", MedusaConfig(num_heads=3), backbone)
    check_choice(backbone, lambda: Decoder(backbone, MedusaOptions(heads, tree="chain")))


def test_eagle3_chain_with_lookup_choice_is_lossless_and_keeps_its_state(backbone):
    torch.manual_seed(0)
    drafter = build_drafter("eagle3", Eagle3Config(draft_vocab_size=259, ttt_steps=2), backbone).eval()
    check_choice(
        backbone, lambda: Decoder(backbone, Eagle3Options(drafter, tree_nodes=3, topk=1, num_draft_tokens=3))
    )


def test_the_decoder_builds_the_choice_and_refuses_it_alone(backbone):
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    dec = Decoder(backbone, MedusaOptions(heads, tree="chain"), lookup_tokens=3, lookup_min_match=2)
    assert isinstance(dec.proposer, LookupChoice) and dec.proposer.width == 4
    with pytest.raises(ValueError, match="lookup_min_match=2 needs lookup_tokens"):
        Decoder(backbone, MedusaOptions(heads, tree="chain"), lookup_min_match=2)
    with pytest.raises(ValueError, match="lookup_drafter_floor=0.2 lowers lookup_min_match per request. Fix"):
        Decoder(backbone, MedusaOptions(heads, tree="chain"), lookup_tokens=3, lookup_drafter_floor=0.2)
    with pytest.raises(ValueError, match="suffix decoding's draft .lookup_min_score. has none. Fix"):
        LookupChoice(dec.proposer.inner, None, 3, backbone.device, min_score=1.0, drafter_floor=0.2)


def test_a_lookup_chain_grows_with_its_match_up_to_max_tokens():
    inner, cpu = Fixed([10, 11], chain_tree(2)), torch.device("cpu")
    copied = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3, 4, 5]  # a 5-gram match
    grows = LookupChoice(inner, 2, 2, cpu, max_tokens=8)
    assert grows.width == 9 and grows.max_ngram == 8
    assert grows.propose(copied, Sampling()).tokens.tolist() == [6, 7, 8, 9, 10]
    assert LookupChoice(inner, 2, 2, cpu, max_tokens=4).propose(copied, Sampling()).tokens.tolist() == [
        6,
        7,
        8,
        9,
    ]
    assert LookupChoice(inner, 2, 2, cpu).propose(copied, Sampling()).tokens.tolist() == [6, 7]  # fixed L
    short = grows.propose([4, 5, 6, 7, 8, 9, 4, 5], Sampling())  # a 2-gram match: L tokens
    assert short.tokens.tolist() == [6, 7]
    with pytest.raises(ValueError, match="lookup_max_tokens=1 is under lookup_tokens=2"):
        LookupChoice(inner, 2, 2, cpu, max_tokens=1)


def test_growing_lookup_chains_are_lossless(backbone):
    torch.manual_seed(0)
    drafter = build_drafter("eagle3", Eagle3Config(draft_vocab_size=259, ttt_steps=2), backbone).eval()
    options = Eagle3Options(drafter, tree_nodes=2, topk=1, num_draft_tokens=2)
    vanilla = Decoder(backbone)
    dec = Decoder(backbone, options, lookup_tokens=2, lookup_min_match=1, lookup_max_tokens=8)
    for text in TEXTS:
        prompt = backbone.tokenizer(text)["input_ids"]
        out = dec.generate(prompt, 40, eos_token_ids=[])
        assert out.tokens == vanilla.generate(prompt, 40, eos_token_ids=[]).tokens, text
    assert max(out.stats.accepted_per_step) > 3  # some step accepted more than the base chain of 2 could
    with pytest.raises(ValueError, match="lookup_max_tokens=8 applies to the lookup chain choice only"):
        Decoder(backbone, options, lookup_tokens=2, lookup_max_tokens=8)
