"""The hybrid's suffix-decoding lookup (eval/engine/suffix_lookup.py) on Arctic Inference's real suffix tree: its
draft read per request in headstart's decoder (LookupChoice with min_score) and in the vLLM plugin's step (a
batch of requests), the score threshold, earlier replies drafting for later requests, and lossless decoding."""

import numpy as np
import pytest
import torch
from test_lookup_branch import Fixed

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.base import Sampling
from headstart.eval.engine.proposers.lookup_choice import LookupChoice
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.tree import chain_tree
from headstart.eval.serving import vllm_plugin as plugin
from headstart.models.checkpoint import build_drafter
from headstart.models.medusa import MedusaConfig

pytest.importorskip("arctic_inference.suffix_decoding", reason="./launch.sh suffix-setup builds it")
from headstart.eval.engine.suffix_lookup import SuffixLookup  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def test_a_request_drafts_from_its_prompt_and_later_requests_from_earlier_replies():
    trees = SuffixLookup()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    score, chain = trees.draft("a", len(prompt), prompt + [1, 2, 3], 8)  # the reply starts copying the prompt
    assert chain == [4, 5, 6] and score > 0  # as many tokens as the match is long (max_spec_factor 1)
    assert trees.draft("a", len(prompt), prompt + [1, 2, 3], 2)[1] == [4, 5]  # at most k
    trees.draft("a", len(prompt), prompt + [1, 2, 3, 30, 31, 32, 33, 34], 4)  # the reply goes on: its own
    trees.finish(live=[])  # "a" done: its reply stays in the global tree
    assert set(trees.cache.active_requests) == set() and trees.seen == {}
    _, chain = trees.draft("b", 2, [50, 51, 3, 30, 31], 8)  # a new prompt, a reply that starts like a's
    assert chain == [32, 33, 34]  # matched "3 30 31" in a's reply
    assert trees.draft("b", 2, [50, 51, 30, 31, 99], 3)[1] == []  # nothing seen after 99


def test_the_choice_takes_the_suffix_draft_only_when_it_scores_enough():
    inner, prompt = Fixed([10, 11], chain_tree(2)), [4, 5, 6, 7, 8, 4, 5]
    for min_score, chosen in ((0.0, True), (1.0, True), (50.0, False)):
        choice = LookupChoice(inner, None, 3, CPU, min_score=min_score)
        choice.start(prompt, torch.zeros(1))
        draft = choice.propose(prompt + [6], Sampling())
        assert (draft.tokens.tolist() == [7, 8, 4]) is chosen and (draft is inner.draft) is not chosen
        assert choice.counts == {"steps": 1, "lookup": int(chosen)}
    with pytest.raises(ValueError, match="lookup_min_score=1.0 chooses suffix decoding's draft"):
        LookupChoice(inner, 2, 3, CPU, min_score=1.0)


def test_medusa_heads_with_the_suffix_lookup_decode_as_plain_greedy(backbone):
    torch.manual_seed(0)
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone).eval()
    plain = Decoder(backbone)
    hybrid = Decoder(backbone, MedusaOptions(heads, tree="chain"), lookup_tokens=6, lookup_min_score=0.0)
    for prompt in (
        [5, 6, 7, 8, 9, 10] * 4,
        [11, 12, 13, 5, 6, 7, 8] * 2,
    ):  # the second meets the first's reply
        want = plain.generate(prompt, 24, temperature=0.0).tokens
        assert hybrid.generate(prompt, 24, temperature=0.0).tokens == want
    assert hybrid.proposer.counts["lookup"] > 0 and hybrid.proposer.requests == 2


def suffix_runner(rows, prompt_lens, req_ids, min_score=0.0):
    tokens = np.zeros((len(rows), 32), dtype=np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    batch = SimpleBatch(tokens, [len(r) for r in rows], prompt_lens, req_ids)
    rule = {"source": "suffix", "min_score": min_score, "drafter_tokens": 2, "lookup_tokens": None}
    return Runner(rule, batch, SuffixLookup())


class SimpleBatch:
    def __init__(self, tokens, lengths, prompt_lens, req_ids):
        self.token_ids_cpu, self.num_tokens_no_spec = tokens, np.array(lengths)
        self.num_prompt_tokens, self.req_ids = np.array(prompt_lens), list(req_ids)
        self.req_id_to_index = {r: i for i, r in enumerate(req_ids)}


class Runner:
    def __init__(self, rule, batch, trees):
        self._headstart_lookup, self.input_batch, self._headstart_suffix = rule, batch, trees
        self._headstart_counts, self.max_model_len = [0, 0], 64
        self._headstart_floor = None


def test_the_plugin_step_reads_each_requests_suffix_draft_and_stops_those_that_left():
    copying, fresh = [1, 2, 3, 4, 5, 6, 1, 2], [20, 21, 22, 23]
    runner = suffix_runner([copying, fresh], [6, 3], ["a", "b"])
    calls = []
    drafter = lambda d: calls.append(d) or [[90, 91], [92, 93]]  # noqa: E731
    assert plugin._lookup_first(runner, 4, [[2], [23]], drafter) == [[3, 4], [92, 93]]  # "1 2": 2 tokens
    assert calls == [2] and runner._headstart_counts == [1, 1]
    assert set(runner._headstart_suffix.cache.active_requests) == {"a", "b"}
    runner.input_batch = SimpleBatch(runner.input_batch.token_ids_cpu[1:], [5], [3], ["b"])  # "a" finished
    runner.input_batch.token_ids_cpu[0, 4] = 20
    assert plugin._lookup_first(runner, 4, [[20]], drafter) == [[21]]  # "b" meets its prompt's first token
    assert set(runner._headstart_suffix.cache.active_requests) == {"b"}
    strict = suffix_runner([copying], [6], ["a"], min_score=100.0)
    assert plugin._lookup_first(strict, 4, [[2]], drafter) == [[90, 91]]  # scores too low: the drafter's 2
