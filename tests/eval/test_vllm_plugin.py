"""headstart's vLLM plugin without vLLM (eval/serving/vllm_plugin.py): its n-gram search is headstart's, the rule
is the decoder's LookupChoice, bad settings and engines it cannot serve are refused in one line, and a step's
drafts are rewritten per request. The plugin inside a real vLLM: tests/eval/test_serve_check_smollm.py (slow)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from headstart.eval.engine.ngram import chain_length
from headstart.eval.engine.proposers.prompt_lookup import find_match as ours
from headstart.eval.serving import vllm_plugin as plugin


def windows_search(context: np.ndarray, max_ngram: int, num_tokens: int) -> tuple[int, list[int]]:
    """The reference: every n from the longest down, its windows compared with the suffix, the earliest hit
    with a continuation (HF's `find_candidate_pred_tokens`)."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context, n)
        for start in np.flatnonzero((windows == context[-n:]).all(axis=1)):
            if start + n < len(context):
                return n, context[start + n : start + n + num_tokens].tolist()
    return 0, []


def test_the_search_is_the_reference_and_headstarts_prompt_lookup():
    rng = np.random.default_rng(0)
    for _ in range(600):  # a small alphabet: many repeats, long matches
        context = rng.integers(0, int(rng.integers(1, 5)), size=int(rng.integers(1, 60)))
        for max_ngram, k in ((3, 4), (2, 1), (1, 3), (8, 8), (16, 16)):
            found = plugin.find_match(context, max_ngram, k)
            assert found == windows_search(context, max_ngram, k) == ours(torch.tensor(context), max_ngram, k)
    for n in range(10):
        for base in (None, 1, 3, 8):
            assert plugin.chain_length(n, base, 8) == chain_length(n, base, 8)


def test_the_lookup_chain_replaces_the_drafts_only_when_long_enough():
    context = np.array([4, 5, 6, 7, 4, 5])  # "4 5" seen before, followed by 6 7 4 5
    assert plugin.choose(context, [1, 2], min_match=2) == (True, [6, 7])
    assert plugin.choose(context, [1, 2], min_match=3) == (False, [1, 2])  # a 2-gram match is not enough
    only_three = np.array([1, 4, 5, 6, 4, 5])  # 3 tokens follow the match, not 4: fewer drafts, as ngram's
    assert plugin.choose(only_three, [1, 2, 3, 8], min_match=1) == (True, [6, 4, 5])
    assert plugin.choose(np.array([4, 5, 6]), [1, 2], min_match=1) == (False, [1, 2])  # nothing seen before
    assert plugin.choose(context, [], min_match=1) == (False, [])


def test_a_lookup_chain_longer_than_the_drafters_own():
    """K = 4 drafts: the lookup chain takes all four; the drafter keeps only its first `drafter_tokens`."""
    context = np.array([4, 5, 6, 7, 8, 9, 4, 5])
    assert plugin.choose(context, [1, 2, 3, 8], 2, drafter_tokens=2) == (True, [6, 7, 8, 9])
    assert plugin.choose(context, [1, 2, 3, 8], 3, drafter_tokens=2) == (False, [1, 2])
    assert plugin.choose(context, [1, 2, 3, 8], 3, drafter_tokens=4) == (False, [1, 2, 3, 8])
    assert plugin.choose(context, [1, 2, 3, 8], 3, drafter_tokens=0) == (False, [])  # lookup only


def test_a_lookup_chain_grows_with_its_match():
    """lookup_tokens L < K: a match of n tokens verifies max(L, n) of what followed it, at most K."""
    copied = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3, 4, 5])  # a 5-gram match
    drafts = [0] * 8
    assert plugin.choose(copied, drafts, 2, max_ngram=8, lookup_tokens=2) == (True, [6, 7, 8, 9, 10])
    assert plugin.choose(copied, drafts, 2, max_ngram=3, lookup_tokens=2) == (
        True,
        [6, 7, 8],
    )  # n capped at 3
    assert plugin.choose(copied, drafts[:4], 2, max_ngram=8, lookup_tokens=2) == (True, [6, 7, 8, 9])  # K = 4
    short = np.array([4, 5, 6, 7, 8, 9, 4, 5])  # a 2-gram match: L tokens, not K
    assert plugin.choose(short, drafts, 2, max_ngram=8, lookup_tokens=3) == (True, [6, 7, 8])


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"headstart_lookup": {"min_match": 4}}, r"min_match=4: must be in 1..max_ngram \(3\)"),
        ({"headstart_lookup": {"min_mach": 2}}, r"unknown keys \['min_mach'\]. Fix"),
        ({"headstart_lookup": {"drafter_tokens": -1}}, r"drafter_tokens=-1: must be >= 0 \(0: lookup only\)"),
        ({"headstart_lookup": {"lookup_tokens": 0}}, r"lookup_tokens=0: must be >= 1"),
        ({"headstart_lookup": {"source": "trie"}}, r"source='trie': unknown. Fix: 'ngram'"),
        (
            {"headstart_lookup": {"source": "suffix", "min_match": 2}},
            r"\['min_match'\] do not apply to source 'suffix'",
        ),
        ({"headstart_lookup": {"source": "suffix", "min_score": -1}}, r"min_score=-1.0: must be >= 0"),
        ({"headstart_lookup": {"drafter_floor": 0}}, r"drafter_floor=0.0: must be > 0"),
        (
            {"headstart_lookup": {"source": "suffix", "drafter_floor": 0.2}},
            r"\['drafter_floor'\] do not apply to source 'suffix'",
        ),
    ],
)
def test_bad_settings_are_refused(config, match):
    with pytest.raises(ValueError, match=match):
        plugin.settings(config)


def test_settings_absent_means_the_plugin_stays_out():
    assert plugin.settings({}) is None and plugin.settings({"other": 1}) is None
    default = {
        "source": "ngram",
        "min_match": 1,
        "max_ngram": 3,
        "drafter_tokens": None,
        "lookup_tokens": None,
        "drafter_floor": None,
    }
    assert plugin.settings({"headstart_lookup": {}}) == default


def engine(spec=True, async_=False, extra=None):
    return SimpleNamespace(
        additional_config={"headstart_lookup": {"min_match": 2}} if extra is None else extra,
        speculative_config=SimpleNamespace(num_speculative_tokens=4) if spec else None,
        scheduler_config=SimpleNamespace(async_scheduling=async_),
    )


def test_engines_it_cannot_serve_are_refused_at_start():
    assert plugin._check_engine(engine(), "0.32.0") == {
        "source": "ngram",
        "min_match": 2,
        "max_ngram": 3,
        "drafter_tokens": None,
        "lookup_tokens": None,
        "drafter_floor": None,
    }
    assert plugin._check_engine(engine(extra={}), "0.40.0") is None  # not asked for: any version
    with pytest.raises(RuntimeError, match="written for vLLM 0.32.x, found 0.33.1. Fix"):
        plugin._check_engine(engine(), "0.33.1")
    with pytest.raises(RuntimeError, match="needs a drafter. Fix: add --speculative-config"):
        plugin._check_engine(engine(spec=False), "0.32.0")
    with pytest.raises(RuntimeError, match="Fix: --no-async-scheduling"):
        plugin._check_engine(engine(async_=True), "0.32.0")
    too_long = {"headstart_lookup": {"drafter_tokens": 5}}
    with pytest.raises(RuntimeError, match="drafter_tokens=5 exceeds num_speculative_tokens=4"):
        plugin._check_engine(engine(extra=too_long), "0.32.0")
    with pytest.raises(RuntimeError, match="lookup_tokens=6 exceeds num_speculative_tokens=4"):
        plugin._check_engine(engine(extra={"headstart_lookup": {"lookup_tokens": 6}}), "0.32.0")


def test_a_medusa_drafter_serves_lookup_chains_longer_than_its_heads_but_drafts_no_more_than_it_ships():
    """vLLM sets a Medusa config's num_heads to K; the plugin keeps the checkpoint's count beside it (and builds
    only those heads): its drafter may keep no more drafts than that."""
    medusa = SimpleNamespace(model_type="medusa", num_heads=8)
    medusa.__dict__[plugin.SHIPPED_HEADS] = 2  # as `register`'s setter leaves it after vLLM set K = 8
    spec = SimpleNamespace(num_speculative_tokens=8, draft_model_config=SimpleNamespace(hf_config=medusa))
    hybrid = engine(extra={"headstart_lookup": {"drafter_tokens": 2, "lookup_tokens": 4}})
    hybrid.speculative_config = spec
    assert (
        plugin.medusa_heads_shipped(spec) == 2
        and plugin._check_engine(hybrid, "0.32.0")["drafter_tokens"] == 2
    )
    hybrid.additional_config = {"headstart_lookup": {"drafter_tokens": 3}}
    with pytest.raises(RuntimeError, match="ships 2 heads and would draft 3. Fix: drafter_tokens <= 2"):
        plugin._check_engine(hybrid, "0.32.0")
    hybrid.additional_config = {"headstart_lookup": {}}  # every one of K = 8 drafts from the heads
    with pytest.raises(RuntimeError, match="ships 2 heads and would draft 8"):
        plugin._check_engine(hybrid, "0.32.0")
    eagle = SimpleNamespace(model_type="eagle", num_heads=0)
    assert (
        plugin.medusa_heads_shipped(SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=eagle)))
        is None
    )


def test_a_steps_drafts_are_rewritten_per_request():
    tokens = np.zeros((3, 16), dtype=np.int32)
    tokens[0, :6] = [4, 5, 6, 7, 4, 5]  # request a: a 2-gram match -> lookup
    tokens[1, :5] = [1, 2, 3, 8, 9]  # request b: no match -> its drafts
    batch = SimpleNamespace(
        token_ids_cpu=tokens, num_tokens_no_spec=[6, 5, 0], req_id_to_index={"a": 0, "b": 1}
    )
    rule = {"source": "ngram", "min_match": 2, "max_ngram": 3, "drafter_tokens": 1, "lookup_tokens": None}
    runner = SimpleNamespace(
        _headstart_lookup=rule,
        input_batch=batch,
        _headstart_counts=[0, 0],
        _headstart_suffix=None,
        _headstart_floor=None,
    )
    drafts = SimpleNamespace(req_ids=["b", "a", "gone"], draft_token_ids=[[7, 7], [9, 9], [1, 1]])
    plugin._apply(runner, drafts)
    assert drafts.draft_token_ids == [[7], [6, 7], [1, 1]]  # "gone" left the batch: untouched
    assert runner._headstart_counts == [1, 1]


def lookup_first_runner(drafter_tokens, rows, max_model_len=64):
    tokens = np.zeros((len(rows), 16), dtype=np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    batch = SimpleNamespace(
        token_ids_cpu=tokens,
        num_tokens_no_spec=np.array([len(r) for r in rows]),
        req_ids=[f"r{i}" for i in range(len(rows))],
    )
    rule = {
        "source": "ngram",
        "min_match": 2,
        "max_ngram": 3,
        "drafter_tokens": drafter_tokens,
        "lookup_tokens": None,
        "drafter_floor": None,
    }
    return SimpleNamespace(
        _headstart_lookup=rule,
        input_batch=batch,
        _headstart_counts=[0, 0],
        max_model_len=max_model_len,
        _headstart_suffix=None,
        _headstart_floor=None,
    )


class Drafter:
    """A stand-in for the runner's own propose: rows of `heads` drafts, its calls recorded."""

    def __init__(self, rows):
        self.rows, self.calls = rows, []

    def __call__(self, heads):
        self.calls.append(heads)
        return [[10 + i] * heads for i in range(self.rows)]


def test_a_stateless_drafter_runs_only_when_some_request_needs_it():
    matched, unmatched = [4, 5, 6, 7, 8, 4, 5], [1, 2, 3, 8, 9]
    runner = lookup_first_runner(2, [matched, matched])
    drafter = Drafter(2)
    assert plugin._lookup_first(runner, 4, [[5], [5]], drafter) == [[6, 7, 8, 4], [6, 7, 8, 4]]
    assert drafter.calls == [] and runner._headstart_counts == [0, 2]  # every request matched: no heads run

    runner = lookup_first_runner(2, [unmatched, matched, unmatched])
    drafter = Drafter(3)
    sampled = [[9], [5], []]  # the third request sampled nothing (mid-prefill): no drafts, as ngram
    assert plugin._lookup_first(runner, 4, sampled, drafter) == [[10, 10], [6, 7, 8, 4], []]
    assert drafter.calls == [2] and runner._headstart_counts == [1, 1]  # only the kept heads run

    runner = lookup_first_runner(0, [unmatched, matched])
    drafter = Drafter(2)
    assert plugin._lookup_first(runner, 4, [[9], [5]], drafter) == [[], [6, 7, 8, 4]]
    assert drafter.calls == []  # drafter_tokens 0: lookup only, the heads never run


def test_a_stateful_drafter_makes_one_pass_where_the_lookup_serves_every_request():
    """EAGLE (a KV cache that follows every step) always runs, but only its first pass, sampling nothing, when
    every request took its lookup chain, and only `drafter_tokens` passes when some request needs its drafts."""
    matched, unmatched = [4, 5, 6, 7, 8, 4, 5], [1, 2, 3, 8, 9]
    runner, drafter = lookup_first_runner(2, [matched, matched]), Drafter(2)
    assert plugin._lookup_first(runner, 4, [[5], [5]], drafter, stateful=True) == [[6, 7, 8, 4], [6, 7, 8, 4]]
    assert drafter.calls == [0]  # the pass that reads the accepted tokens (vLLM's K = 0), no draft sampled
    runner, drafter = lookup_first_runner(2, [unmatched, matched]), Drafter(2)
    assert plugin._lookup_first(runner, 4, [[9], [5]], drafter, stateful=True) == [[10, 10], [6, 7, 8, 4]]
    assert drafter.calls == [2]  # 2 passes for the kept drafts, not the 4 of the lookup chain's length
    runner, drafter = lookup_first_runner(0, [unmatched, matched]), Drafter(2)
    assert plugin._lookup_first(runner, 4, [[9], [5]], drafter, stateful=True) == [[], [6, 7, 8, 4]]
    assert drafter.calls == [0]  # lookup only: still the one pass
    runner, drafter = lookup_first_runner(None, [unmatched]), Drafter(1)
    assert plugin._lookup_first(runner, 4, [[9]], drafter, stateful=True) == [[10, 10, 10, 10]]
    assert drafter.calls == [4]  # drafter_tokens unset: all K


def test_before_bookkeeping_the_steps_sampled_tokens_join_the_context():
    """vLLM drafts with EAGLE before its bookkeeping appends the step's tokens to the batch's rows: the lookup
    searches the row plus the accepted tokens (a match that only they complete is found; a stale row's is not)."""
    row = [4, 5, 6, 7, 8, 1, 2]  # the row as the previous step left it
    runner, drafter = lookup_first_runner(2, [row]), Drafter(1)
    assert plugin._lookup_first(runner, 4, [[4, 5]], drafter, stateful=True, pending=True) == [[6, 7, 8, 1]]
    assert drafter.calls == [0] and runner._headstart_counts == [0, 1]
    runner, drafter = lookup_first_runner(2, [row]), Drafter(1)  # already appended (Medusa's order): no match
    assert plugin._lookup_first(runner, 4, [[4, 5]], drafter, stateful=True) == [[10, 10]]


def test_probabilistic_drafts_are_refused_at_start():
    spec = SimpleNamespace(num_speculative_tokens=4, draft_sample_method="probabilistic")
    config = SimpleNamespace(
        additional_config={"headstart_lookup": {}},
        speculative_config=spec,
        scheduler_config=SimpleNamespace(async_scheduling=False),
    )
    with pytest.raises(
        RuntimeError, match="draft_sample_method='probabilistic'.*Fix: draft_sample_method 'greedy'"
    ):
        plugin._check_engine(config, "0.32.0")
    spec.draft_sample_method = "greedy"
    assert plugin._check_engine(config, "0.32.0")["min_match"] == 1


def test_lookup_chains_stop_at_the_models_length():
    runner = lookup_first_runner(None, [[4, 5, 6, 7, 8, 4, 5]], max_model_len=9)
    assert plugin._lookup_first(runner, 4, [[5]], Drafter(1)) == [[6, 7]]
    full = lookup_first_runner(None, [[4, 5, 6, 7, 8, 4, 5]], max_model_len=7)
    assert plugin._lookup_first(full, 4, [[5]], Drafter(1)) == [[]]


def test_lookup_first_chains_grow_with_their_match():
    copied = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]  # a 4-gram match
    runner = lookup_first_runner(2, [copied, [4, 5, 6, 7, 8, 4, 5]])  # and a 2-gram one
    runner._headstart_lookup |= {"lookup_tokens": 2, "max_ngram": 8}
    assert plugin._lookup_first(runner, 8, [[4], [5]], Drafter(2)) == [[5, 6, 7, 8], [6, 7]]


def test_a_request_whose_drafter_is_weak_takes_one_token_matches():
    """drafter_floor: once AFTER of a request's drafter chains averaged under the floor (read from how its context
    grew: accepted drafts + the bonus token), its lookup takes a 1-token match; another request keeps min_match 2,
    and a request that left the batch is forgotten."""
    from headstart.eval.engine.drafter_floor import AFTER, DrafterFloor

    weak = [9, 4, 5, 1, 2, 3]  # its last token has no earlier match: both requests draft
    runner = lookup_first_runner(2, [weak, weak])
    runner._headstart_floor = DrafterFloor(0.5)
    drafter = Drafter(2)
    rows = [list(weak), list(weak)]
    for step in range(AFTER):
        assert plugin._lookup_first(runner, 4, [[3], [3]], drafter) == [[10, 10], [11, 11]]
        # request r0 accepts none of its 2 drafts (the context grows by the bonus token alone), r1 both; the
        # last step's bonus token is one seen once before ("4"): a 1-token match, short of min_match 2
        bonus = [30 + step, 40 + step] if step < AFTER - 1 else [4, 4]
        rows = [rows[0] + [bonus[0]], rows[1] + [11, 11, bonus[1]]]
        runner.input_batch.token_ids_cpu = np.zeros((2, 32), dtype=np.int32)
        for i, row in enumerate(rows):
            runner.input_batch.token_ids_cpu[i, : len(row)] = row
        runner.input_batch.num_tokens_no_spec = np.array([len(r) for r in rows])
    assert plugin._lookup_first(runner, 4, [[4], [4]], drafter) == [[5, 1, 2, 3], [11, 11]]
    assert runner._headstart_floor.requests["r0"][:2] == [AFTER, 0]  # r0: weak; r1: 2 accepted a step
    runner.input_batch.req_ids = ["r1"]
    plugin._finish(runner)
    assert set(runner._headstart_floor.requests) == {"r1"}


def test_medusa_drafts_are_each_heads_argmax_mapped_to_the_target_vocabulary():
    """The plugin's Medusa drafts: the argmax over each head's truncated vocabulary through token_map, the token
    vLLM's full-vocabulary scatter picks (random logits: no ties), without the scatter."""
    torch.manual_seed(0)
    heads = [torch.nn.Linear(8, 5, bias=False) for _ in range(3)]
    token_map = torch.tensor([7, 2, 11, 0, 4])
    model = SimpleNamespace(lm_heads=heads, token_map=token_map, logits_processor=lambda head, h: head(h))
    blocks = [torch.randn(2, 8) for _ in heads]
    drafts = plugin.medusa_drafts(model, blocks)
    for h, (head, hidden) in enumerate(zip(heads, blocks)):
        full = torch.full((2, 12), float("-inf"))
        full[:, token_map] = head(hidden)
        assert torch.equal(drafts[:, h], full.argmax(dim=-1))
    model.token_map = None  # the full vocabulary: the argmax itself
    assert torch.equal(plugin.medusa_drafts(model, blocks)[:, 0], heads[0](blocks[0]).argmax(dim=-1))
