"""eval/bench/rule_bound.py: the rules it compares (the hybrid's, gated by the drafter's confidence, extended behind
the drafter, the oracle) on recorded decodes, and the bench end to end."""

import json

import pytest
from test_chain_tau import _drafter
from test_replay import TOKENS, heads

from headstart.eval.bench import rule_bound
from headstart.eval.engine.decoder import build_decoder
from headstart.eval.tuning.replay import Position, accepted

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_oracle_bounds_both_chains_and_the_first_draft_probability_is_read(tmp_path):
    backbone, loaded, chain, ids = heads(tmp_path)
    decodes = rule_bound.recorded(build_decoder("medusa", backbone, loaded, **chain), ids, TOKENS, 0)
    prompts = [rule_bound.Prompt(f"c{i % 2}", d) for i, d in enumerate(decodes)]
    alone = rule_bound.simulate(prompts, rule_bound.lookup_rule(rule_bound.MAX_CHAIN + 1, 2))
    hybrid = rule_bound.simulate(prompts, rule_bound.lookup_rule(1, 3))
    assert alone["lookup_share"] == 0 and 0 < hybrid["lookup_share"] < 1  # both sides chosen somewhere
    best = rule_bound.simulate(
        prompts, rule_bound.oracle(rule_bound.lookup_rule(1, 3), rule_bound.lookup_rule(9, 2))
    )
    assert best["tau"] >= max(alone["tau"], hybrid["tau"]) and set(hybrid["by_category"]) == {"c0", "c1"}
    assert all(0 < p.p1 <= 1 for d in decodes for p in d.positions.values())  # head 1's top probability


def position(n, lookup, p1=0.5):
    return Position(drafts=[7, 8], ngram={3: (n, lookup)}, suffix=None, p1=p1)


def test_the_extension_behind_the_drafts_and_the_confidence_gate():
    assert accepted([1, 2, 9], [0, 1, 2, 3], 1) == 2
    assert accepted([1, 2, 3, 4], [0, 1, 2, 3], 1) == 3  # the output ends: no more to accept
    tokens = [7, 8, 9, 4, 7]  # context [7, 8, 9, 4]: after drafting 7 8, "7 8" was followed by 9 4
    assert rule_bound.lookup_rule(1, 4, extend=2)(position(0, []), tokens, 4) == ([7, 8, 9, 4], "drafter")
    assert rule_bound.lookup_rule(1, 4)(position(0, []), tokens, 4) == ([7, 8], "drafter")
    confident = position(2, [1, 2, 3, 4, 5], p1=0.95)
    assert rule_bound.lookup_rule(1, 4, theta=0.9)(confident, tokens, 4) == ([7, 8], "drafter")
    assert rule_bound.lookup_rule(1, 4, theta=0.99)(confident, tokens, 4) == ([1, 2, 3, 4], "lookup")


def test_the_bench_prints_and_writes_every_rule(tmp_path, capsys):
    folder = _drafter(tmp_path / "d" / "drafter", 0)
    out = tmp_path / "rules.json"
    table = rule_bound.main([
        "--checkpoint", str(folder), "--prompts", "dev", "--per-category", "1", "--tokens", "8",
        "--dtype", "float32", "--out", str(out),
    ])  # fmt: skip
    assert json.loads(out.read_text())["prompts"] == 11
    assert len(table) == 10 and "oracle over m=1's two chains" in capsys.readouterr().out


def test_a_drafter_floor_turns_a_request_to_one_token_matches_once_its_drafter_does_poorly():
    """The hybrid's rule with a drafter floor as the tuner replays it: a 1-token match (short of m = 2) is taken
    only once the request's drafter chains averaged under the floor over AFTER of them."""
    p = Position(drafts=[5], ngram={3: (1, [99])}, suffix=None)
    rule = rule_bound.lookup_rule(2, 1, floor=0.2)
    wrong = [0] * 10  # the drafter's 5 is never the next token: each step emits the bonus token only
    assert [rule(p, wrong, t)[1] for t in range(1, 8)] == ["drafter"] * 4 + ["lookup"] * 3
    right = [5] * 12  # a new request, where every draft is accepted: steps 2 apart, the drafter kept
    assert {rule(p, right, t)[1] for t in range(1, 12, 2)} == {"drafter"}
