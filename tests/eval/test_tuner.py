"""The decoding tuner (eval/tuning/tuner.py, eval/tuning/speed_model.py): the expected-length model on hand-worked tables, the
choice under injected costs, acceptance counting, decoding.json, the eval stage's use of it, and the exports'
K. Its records, tuning prompts, thread count and plain choice: tests/eval/test_tuner_records.py."""

from __future__ import annotations

import json
import os

import pytest

from headstart.eval.engine.proposers.base import Setting
from headstart.eval.engine.proposers.medusa import MedusaTuning
from headstart.eval.engine.tree import Tree, chain_tree, tree_from_paths
from headstart.eval.tuning.speed_model import (
    Branch,
    Costs,
    LookupStep,
    branch_effect,
    expected_tokens,
    non_decreasing,
    predict,
    rank,
    rank_with_branch,
    speedup_at,
    up_to,
)
from headstart.eval.tuning.tuner import ProbeStep, acceptance_table, count_path, lookup_steps
from headstart.models.decoding import DECODING_NAME, read_decoding, write_decoding
from headstart.models.medusa import MedusaConfig, MedusaHeads

pytestmark = pytest.mark.usefixtures("one_thread")


def test_chain_expects_one_plus_the_path_products():
    a1, a2 = 0.6, 0.5
    assert expected_tokens(chain_tree(2), [[a1], [a2]]) == pytest.approx(1 + a1 + a1 * a2)


def test_a_rank_one_sibling_adds_its_probability():
    acc = [[0.6, 0.2], [0.5, 0.1]]
    tree = tree_from_paths([[0], [1], [0, 0]])
    assert expected_tokens(tree, acc) == pytest.approx(1 + 0.6 + 0.6 * 0.5 + 0.2)
    assert expected_tokens(tree_from_paths([[0], [0, 0], [0, 0, 0]]), acc) == pytest.approx(
        1 + 0.6 + 0.3
    )  # no row 3


def test_speedup_is_tokens_per_step_over_relative_step_cost():
    costs = Costs(verify={1: 1.0, 3: 1.0}, draft={"d": 0.0}, bookkeeping={1: 0.0})
    p = predict(Setting({}, chain_tree(2), "d"), [[0.5], [0.5]], costs)
    assert p["tokens_per_step"] == pytest.approx(1.75) and p["speedup"] == pytest.approx(1.75)
    assert speedup_at(2.0, prefill_steps=0, new_tokens=10) == pytest.approx(2.0)
    assert speedup_at(2.0, prefill_steps=10, new_tokens=10) == pytest.approx(20 / 15)


def test_verify_costs_are_fitted_non_decreasing():
    assert non_decreasing({1: 1.0, 2: 2.0, 3: 3.0}) == {1: 1.0, 2: 2.0, 3: 3.0}
    assert non_decreasing({1: 104.0, 3: 100.0, 4: 117.0}) == {1: 102.0, 3: 102.0, 4: 117.0}
    assert non_decreasing({1: 3.0, 2: 1.0, 3: 2.0, 4: 5.0}) == {1: 2.0, 2: 2.0, 3: 2.0, 4: 5.0}


def _heads(k: int = 3) -> MedusaHeads:
    return MedusaHeads(MedusaConfig(num_heads=k), 8, 16)


ACC = [[0.5, 0.2, 0.1, 0.05], [0.4, 0.15, 0.1, 0.05], [0.3, 0.1, 0.05, 0.05]]


def _costs(slope: float) -> Costs:
    verify = {w: 1.0 + slope * (w - 1) for w in (1, 2, 4, 8, 16, 32)}
    return Costs(verify=verify, draft={f"depth{d}": 0.01 for d in (1, 2, 3)}, bookkeeping={1: 0.0})


def test_flat_verify_cost_picks_a_large_tree_and_steep_cost_a_small_one():
    settings = MedusaTuning(_heads(), ACC).settings(ACC, 32)
    flat = rank(settings, ACC, _costs(0.001))[0][0]
    steep = rank(settings, ACC, _costs(0.2))[0][0]
    assert flat.tree.size > 16 and steep.tree.size <= 3
    assert steep.options == {"tree": [[0]]} or steep.options == {"tree": [[0], [0, 0]]}
    # the chain for vLLM: cheap steps want every head, costly ones one
    chains = [MedusaTuning(_heads(), ACC).chain(k) for k in (1, 2, 3)]
    assert rank(chains, ACC, _costs(0.001))[0][0].tree.size == 4
    assert rank(chains, ACC, _costs(0.5))[0][0].tree.size == 2


def test_count_path_records_rank_by_depth():
    # root -> [a (rank 0), b (rank 1)]; a -> [c (rank 0), d (rank 1)]  (an EAGLE tree: ranks = sibling order)
    tree = Tree((-1, 0, 0, 1, 1))
    hits, trials = [], []
    count_path(tree, [0, 2], hits, trials)  # b accepted (rank 1); b has no children: depth 2 not tried
    count_path(tree, [0, 1, 4], hits, trials)  # a then d (rank 1 at depth 2)
    count_path(tree, [0], hits, trials)  # nothing accepted
    assert trials == [3, 1] and hits == [[1, 1], [0, 1]]
    assert acceptance_table(hits, trials, min_trials=1, ranks=2) == [[1 / 3, 1 / 3], [0.0, 1.0]]
    assert acceptance_table(hits, trials, min_trials=2, ranks=2) == [[1 / 3, 1 / 3]]  # depth 2: too few
    medusa = tree_from_paths([[0], [2], [0, 0]])  # Medusa: the node's own top-k rank
    hits, trials = [], []
    count_path(medusa, [0, 2], hits, trials)
    assert hits == [[0, 0, 1]] and trials == [1]


# a step whose accepted path ran (0, 0) while lookup would have given 1 token, its 3-token chain sharing the
# rank-0 first node; one where the drafter's rank-1 first node won and lookup would have given all 3 (sharing
# nothing); one with no n-gram match
STEPS = [LookupStep((0, 0), 1, (0,), 3), LookupStep((1,), 3, (), 3), LookupStep((), 0, (), 0)]


def test_a_lookup_branch_adds_the_longer_path_and_the_nodes_a_tree_lacks():
    chain2, siblings = tree_from_paths([[0], [0, 0]]), tree_from_paths([[0], [1]])
    # chain2 holds (0, 0) but not (1,): +0 and +3 tokens; adds 3 - 1 and 3 nodes
    gain, added = branch_effect(chain2, STEPS)
    assert gain == pytest.approx(1.0) and added == pytest.approx({0: 1 / 3, 2: 1 / 3, 3: 1 / 3})
    # siblings holds (0,) and (1,): its own paths are 1 and 1 long -> +0 and +2
    gain, added = branch_effect(siblings, STEPS)
    assert gain == pytest.approx(2 / 3) and added == pytest.approx({0: 1 / 3, 2: 1 / 3, 3: 1 / 3})
    assert branch_effect(chain2, []) == (0.0, {})
    costs = Costs(verify={1: 1.0, 3: 1.0, 8: 2.0}, draft={"d": 0.0}, bookkeeping={1: 0.0})
    plain = predict(Setting({}, chain2, "d"), [[0.5], [0.5]], costs)
    with_branch = predict(Setting({}, chain2, "d"), [[0.5], [0.5]], costs, Branch(STEPS, search_s=0.1))
    assert with_branch["tokens_per_step"] == pytest.approx(plain["tokens_per_step"] + 1.0)
    # verify at widths 3, 5 and 6 (a third of the steps each; interpolated between 3 and 8) plus the search
    assert with_branch["step_ms"] == pytest.approx(1000 * ((1.0 + 1.4 + 1.6) / 3 + 0.1))
    assert with_branch["lookup_gain"] == pytest.approx(1.0) and "lookup_gain" not in plain
    assert with_branch["lookup_nodes"] == pytest.approx(5 / 3)


def test_a_branch_costs_the_mean_of_its_widths_not_the_width_of_its_mean():
    # half the steps the 4-token chain matches (sharing nothing: +4 nodes), half nothing matches; the verify
    # cost jumps between widths 5 and 6 (as it does on this CPU): c(3) = c(5) = 1, c(7) = 2
    steps = [LookupStep((), 0, (), 4), LookupStep((), 0, (), 0)]
    costs = Costs(verify={1: 1.0, 5: 1.0, 6: 2.0, 8: 2.0}, draft={"d": 0.0}, bookkeeping={1: 0.0})
    chain2 = tree_from_paths([[0], [0, 0]])
    pred = predict(Setting({}, chain2, "d"), [[0.5], [0.5]], costs, Branch(steps, search_s=0.0))
    assert pred["step_ms"] == pytest.approx(1000 * (1.0 + 2.0) / 2)  # not c(3 + 2) = 1.0


def test_compiled_steps_pay_the_whole_branch_when_it_adds_nodes():
    """Compiled, the decoder pads a verify the chain added nodes to up to the tree plus the whole branch (fixed
    shapes), and verifies the others at the tree's own width (its second graph): the branch costs c(tree + n)
    on the steps it adds to, c(tree) on the rest; its gain is the same as eager."""
    steps = [LookupStep((), 0, (), 2), LookupStep((), 0, (), 0)]  # the chain adds 2 nodes on half the steps
    costs = Costs(verify={1: 1.0, 5: 1.0, 6: 2.0, 8: 2.0}, draft={"d": 0.0}, bookkeeping={1: 0.0})
    chain2, acc = tree_from_paths([[0], [0, 0]]), [[0.5], [0.5]]
    eager = predict(Setting({}, chain2, "d"), acc, costs, Branch(steps, search_s=0.0))
    padded = predict(Setting({}, chain2, "d"), acc, costs, Branch(steps, search_s=0.0, padded=4))
    assert eager["step_ms"] == pytest.approx(1000.0)  # (c(3 + 2) + c(3)) / 2
    assert padded["step_ms"] == pytest.approx(1500.0)  # (c(3 + 4) + c(3)) / 2: padded to 7, not 5
    assert padded["tokens_per_step"] == eager["tokens_per_step"]
    never = predict(Setting({}, chain2, "d"), acc, costs, Branch(steps[1:], search_s=0.0, padded=4))
    assert never["step_ms"] == pytest.approx(1000.0)  # no step matched: all at the tree's width
    # each length the tuner weighs is padded to itself: a 1-token branch to width 4, 3 tokens to width 6
    ranked = rank_with_branch([Setting({}, chain2, "d")], acc, costs, Branch(steps, 0.0, padded=4), 4)
    assert {p["branch_tokens"]: p["step_ms"] for _, p in ranked} == pytest.approx(
        {0: 1000.0, 1: 1000.0, 2: 1000.0, 3: 1500.0, 4: 1500.0}
    )
    # past the widest measured width a cost would be the widest's: such settings are not ranked
    wide = Setting({}, tree_from_paths([[0], [1], [2], [0, 0], [0, 1]]), "d")  # width 6: with 3 tokens, 9 > 8
    ranked = rank_with_branch([wide], acc, costs, Branch(steps, 0.0, padded=4), 4)
    assert sorted(p["branch_tokens"] for _, p in ranked) == [0, 1, 2]


def test_the_branch_length_is_chosen_from_what_each_length_gains_and_costs():
    chain2, acc = tree_from_paths([[0], [0, 0]]), [[0.5], [0.5]]  # 1.75 tokens a step on its own
    assert up_to(STEPS, 1) == [
        LookupStep((0, 0), 1, (0,), 1),
        LookupStep((1,), 1, (), 1),
        LookupStep((), 0, (), 0),
    ]
    assert up_to(STEPS, 5) == STEPS
    # verify costs 1 up to width 4, 3 from width 5: a 1-token branch keeps every step at width <= 4 (+1/3 token
    # for 1 step in 1), 2 tokens reach width 5 on a third of the steps (+2/3 for 5/3), 3 on two thirds (+1 for 7/3)
    steep = Costs(verify={1: 1.0, 4: 1.0, 5: 3.0, 8: 3.0}, draft={"d": 0.0}, bookkeeping={1: 0.0})
    ranked = rank_with_branch([Setting({}, chain2, "d")], acc, steep, Branch(STEPS, search_s=0.0), 3)
    by_length = {p["branch_tokens"]: p["tokens_per_s"] for _, p in ranked}
    assert by_length == pytest.approx(
        {0: 1.75, 1: 1.75 + 1 / 3, 2: (1.75 + 2 / 3) / (5 / 3), 3: 2.75 / (7 / 3)}
    )
    assert ranked[0][1]["branch_tokens"] == 1
    assert "lookup_gain" not in next(p for _, p in ranked if p["branch_tokens"] == 0)
    # flat costs: every token of the chain is worth its node, the whole branch wins; a search that costs more
    # than the branch gains leaves no branch at all
    flat = Costs(verify={1: 1.0, 8: 1.0}, draft={"d": 0.0}, bookkeeping={1: 0.0})
    assert (
        rank_with_branch([Setting({}, chain2, "d")], acc, flat, Branch(STEPS, 0.0), 3)[0][1]["branch_tokens"]
        == 3
    )
    assert (
        rank_with_branch([Setting({}, chain2, "d")], acc, flat, Branch(STEPS, 1.0), 3)[0][1]["branch_tokens"]
        == 0
    )


def test_lookup_steps_read_the_probe_as_a_branch_would():
    # an EAGLE-style probe tree: root -> a (10), b (11); a -> c (12); the answer continues 10, 12, 7
    tree, tokens = Tree((-1, 0, 0, 1)), [10, 11, 12]
    groups = [[ProbeStep(tree, [0, 1, 3], tokens, [10, 12, 99], 2), ProbeStep(tree, [0], tokens, [], 5)]]
    sequences = [[1, 2, 10, 12, 7, 8, 9]]
    first, second = lookup_steps(groups, sequences)
    assert first == LookupStep(accepted=(0, 0), lookup_accepted=2, chain_in_tree=(0, 0), chain_len=3)
    assert second == LookupStep(accepted=(), lookup_accepted=0, chain_in_tree=(), chain_len=0)


def test_decoding_json_round_trip_and_atomic_write(tmp_path, monkeypatch):
    record = {"decoder": {"tree": [[0], [1]]}, "vllm": {"num_speculative_tokens": 2}}
    write_decoding(tmp_path, record)
    assert read_decoding(tmp_path) == record
    assert [p.name for p in tmp_path.iterdir()] == [DECODING_NAME]

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_decoding(tmp_path, {"decoder": {"tree": [[0]]}})
    assert read_decoding(tmp_path) == record  # the old file stays whole; no temporary is left behind
    assert [p.name for p in tmp_path.iterdir()] == [DECODING_NAME]
    (tmp_path / DECODING_NAME).write_text("{half")
    assert read_decoding(tmp_path) is None


# ---------------------------------------------------------------- the eval stage and the exports


@pytest.fixture
def ckpt(tmp_path):
    """A fresh 2-head Medusa checkpoint on a tiny backbone whose drafts are sometimes accepted."""
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import build_drafter, save_drafter

    cfg = BackboneConfig(
        name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2}
    )
    bb, mcfg = load_backbone(cfg), MedusaConfig(num_heads=2)
    return save_drafter(tmp_path / "drafter", build_drafter("medusa", mcfg, bb), "medusa", mcfg, cfg, bb)


@pytest.fixture
def speculation_pays(monkeypatch):
    """The tuner's timings as on a device where a verify forward of any width costs one step, drafting (and
    the lookup branch's search) is nearly free and bookkeeping costs what plain decoding's does, so that it speculates on the tiny model whatever the host's load (on this CPU's real costs it rightly chooses plain
    decoding: tests/eval/test_tuner_records.py)."""
    from headstart.eval.tuning import tuner

    real_steps, real_calls = tuner.step_costs, tuner.time_calls

    def flat(*args, **kw):
        costs = real_steps(*args, **kw)
        return {w: costs["1"] for w in costs}

    def cheap(calls, reps, device):  # measured (so each call runs), then priced nearly free: the lookup
        return {
            k: min(t, 1e-6) for k, t in real_calls(calls, reps, device).items()
        }  # search too, or load decides

    real_probe = tuner._probe

    def even_bookkeeping(*args, **kw):  # a loaded host timed the tree's bookkeeping above plain's: plain won
        run = real_probe(*args, **kw)
        run.bookkeeping = dict.fromkeys(run.bookkeeping, run.bookkeeping[1])
        return run

    from headstart.eval.tuning import confirm

    real_decoded = confirm.decoded_costs

    def as_plain(decoders, *args, **kw):  # the finalists decoded (so each runs), priced at plain's step
        costs = real_decoded(decoders, *args, **kw)
        return dict.fromkeys(costs, costs["plain"])

    monkeypatch.setattr(tuner, "step_costs", flat)
    monkeypatch.setattr(tuner, "time_calls", cheap)
    monkeypatch.setattr(tuner, "_probe", even_bookkeeping)
    monkeypatch.setattr(confirm, "decoded_costs", as_plain)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"question_id": i, "category": "c", "turns": [t]} for i, t in enumerate(["Say hi.", "def f(x):"])]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _eval(ckpt, prompts, out, tuner: dict | None = None, **kw):
    """One eval of the tiny checkpoint; the tuner plans for one thread unless `tuner` says otherwise."""
    from headstart.eval.stage.config import EvalConfig
    from headstart.eval.stage.evaluate import run
    from headstart.eval.timing.harness import TimingConfig
    from headstart.eval.tuning.tuner import TunerConfig

    tuner = {"reps": 3, "probe_tokens": 16, "threads": 1} | (tuner or {})
    cfg = EvalConfig(checkpoint=str(ckpt), prompts=str(prompts), out_dir=str(out), max_new_tokens=8, device="cpu",
                     dtype="float32", timing=TimingConfig(budget_s=0, cost_reps=3, threads=1),
                     tuner=TunerConfig(**tuner), **kw)  # fmt: skip
    return run(cfg)


@pytest.mark.usefixtures("speculation_pays")
def test_eval_uses_the_tuned_settings_and_user_options_win(ckpt, prompts, tmp_path):
    report = _eval(ckpt, prompts, tmp_path / "a")
    saved = read_decoding(ckpt)
    d = report["decoding"]
    assert d["source"] == "tuner" and d["reused"] is False and saved is not None
    assert d["choice"] == saved["choice"] == "speculate" and d["predicted_speedup_steady"] > 1
    ((length, share),) = saved["conditions"]["workload"]  # one cache bucket: the prompts are a few tokens
    assert 0 < length < 64 and share == 1.0
    assert report["timing"]["verify_width"] == saved["decoder_summary"]["verify_width"]
    assert d["predicted_speedup"] > 0 and d["ratio"] == pytest.approx(
        d["measured_speedup"] / d["predicted_speedup"]
    )
    assert "## Decoding settings" in (tmp_path / "a" / "report.md").read_text()
    # a decoding.json measured here is reused as it is: a hand-edited tree is what the decoder gets
    write_decoding(ckpt, {**saved, "choice": "speculate", "decoder": {"tree": [[0], [1], [2]]}})
    report = _eval(ckpt, prompts, tmp_path / "b")
    assert report["decoding"]["reused"] is True and report["timing"]["verify_width"] == 4
    # the user's option wins and is recorded as the user's
    report = _eval(ckpt, prompts, tmp_path / "c", tree_nodes=1)
    assert report["decoding"] == {"source": "user", "options": {"tree_nodes": 1}, "draft_weights": "native"}
    assert report["timing"]["verify_width"] == 2
    # tuner.mode=off: the hand-set defaults
    from headstart.eval.tuning.tuner import TunerConfig

    assert TunerConfig(mode="off").mode == "off"
    with pytest.raises(ValueError, match="tuner.mode"):
        TunerConfig(mode="sometimes")


@pytest.fixture
def lookup_pays(monkeypatch):
    """The probe's steps as if a 3-token lookup chain had matched and been accepted at every one (the tiny
    model's probe rarely repeats itself), so that the tuner keeps the whole branch."""
    from headstart.eval.tuning import tuner

    real = tuner.lookup_steps

    def every_step_matches(groups, sequences):
        return [LookupStep(s.accepted, 3, (), 3) for s in real(groups, sequences)]

    monkeypatch.setattr(tuner, "lookup_steps", every_step_matches)


@pytest.mark.usefixtures("speculation_pays", "lookup_pays")
def test_a_lookup_branch_rides_on_the_tuned_tree(ckpt, prompts, tmp_path):
    """lookup_tokens does not turn the tuner off: the tree is the tuner's, the branch (of the length the tuner
    chose, at most lookup_tokens) is added on top, and the report's decoding section says so; a method without
    a tree refuses it in one line."""
    from headstart.eval.errors import EvalError
    from headstart.eval.stage.config import EvalConfig

    report = _eval(ckpt, prompts, tmp_path / "a", lookup_tokens=3)
    d, saved = report["decoding"], read_decoding(ckpt)
    assert d["source"] == "tuner" and d["options"] == saved["decoder_summary"]
    assert report["timing"]["verify_width"] == saved["decoder_summary"]["verify_width"] + 3
    branch = d["lookup_branch"]
    assert branch["tokens"] == 3 and branch["steps"] >= branch["added"] >= branch["won"] >= 0
    assert branch["steps"] > 0 and report["greedy_matches_vanilla"] == 1.0
    # the tree was chosen for the branch: the prediction counts its gain, its nodes and its search
    assert saved["lookup_tokens"] == 3 and d["tuned_for_lookup"] == 3
    assert saved["acceptance"]["lookup_steps"] > 0 and saved["costs_s"]["lookup_search"] > 0
    assert {"lookup_gain", "lookup_nodes"} <= set(saved["predicted"])
    md = (tmp_path / "a" / "report.md").read_text()
    assert "prompt-lookup branch: up to 3 tokens merged into the tree (lookup_tokens; in the tuner's" in md
    assert saved["branch_tokens"] == 3  # every step gains its whole chain and widths cost the same
    # a shorter length in the record is what the decoder gets, and the report says whose it is
    write_decoding(ckpt, {**saved, "branch_tokens": 1})
    short = _eval(ckpt, prompts, tmp_path / "short", lookup_tokens=3)
    assert short["decoding"]["reused"] is True and short["decoding"]["lookup_branch"]["tokens"] == 1
    assert short["timing"]["verify_width"] == saved["decoder_summary"]["verify_width"] + 1
    md = (tmp_path / "short" / "report.md").read_text()
    assert "up to 1 tokens merged into the tree (the tuner's length, of lookup_tokens=3)" in md
    write_decoding(ckpt, {**saved, "branch_tokens": 0})  # none pays: no branch, no section
    none = _eval(ckpt, prompts, tmp_path / "none", lookup_tokens=3)
    assert "lookup_branch" not in none["decoding"]
    assert none["timing"]["verify_width"] == saved["decoder_summary"]["verify_width"]
    write_decoding(ckpt, saved)
    # a choice made for the branch is not reused without it (and the other way round)
    plain = _eval(ckpt, prompts, tmp_path / "b")["decoding"]
    assert "lookup_branch" not in plain and plain["reused"] is False  # off by default
    assert read_decoding(ckpt)["lookup_tokens"] == 0
    # each keeps its own record: the branch's choice is still there for the next eval with the branch
    again = _eval(ckpt, prompts, tmp_path / "c", lookup_tokens=3)["decoding"]
    assert again["reused"] is True and again["options"] == d["options"]
    for kw, match in [
        ({"draft_weights": "int4"}, "draft_weights='int4'"),
        ({"draft_weights": "int8", "device": "cuda"}, "draft_weights=int8 with device=cuda.*Fix"),
        ({"lookup_tokens": -1}, "lookup_tokens=-1"),
        ({"lookup_tokens": 2, "method": "prompt_lookup"}, "lookup_tokens=2 with method=prompt_lookup"),
    ]:
        with pytest.raises(EvalError, match=match):
            EvalConfig(checkpoint=str(ckpt), **kw)


def test_exports_write_the_tuned_k(ckpt, tmp_path):
    from headstart.models.export import export

    saved = {"decoder": {"tree": [[0]]}, "decoder_summary": {"verify_width": 2}, "conditions": {"device": "cpu"},
             "vllm": {"num_speculative_tokens": 1, "tokens_per_step": 1.3, "speedup": 1.2}}  # fmt: skip
    write_decoding(ckpt, saved)
    (folder,) = export(ckpt, tmp_path / "out", ["vllm"])
    config = json.loads((folder / "config.json").read_text())
    assert config["num_heads"] == 1  # the 2-head checkpoint ships its first head: vLLM drafts one per head
    card = (folder / "README.md").read_text()
    assert '"num_speculative_tokens": 1' in card and "first 1 of the 2 trained heads" in card
    # exports are served on a GPU by default: with only a CPU record the card says it used the nearest
    assert (
        "no decoding.json record for greedy on cuda; using the nearest: temperature not recorded, cpu" in card
    )
    from safetensors.torch import load_file

    assert not any(k.startswith("blocks.1.") for k in load_file(folder / "model.safetensors"))


def test_a_hybrid_rule_with_a_longer_lookup_chain_ships_that_many_heads(ckpt, tmp_path):
    """vLLM drafts one token per Medusa head it loads: the plugin's lookup chain of 2 needs the 2 heads although
    the heads alone are served as a chain of 1."""
    from headstart.models.export import export

    rule = {"min_match": 2, "k": 1, "lookup_tokens": 2}
    saved = {"decoder": {"tree": [[0]]}, "decoder_summary": {"verify_width": 2}, "conditions": {"device": "cuda"},
             "vllm": {"num_speculative_tokens": 1, "tokens_per_step": 1.3, "speedup": 1.2}, "lookup_rule": rule}  # fmt: skip
    write_decoding(ckpt, saved)
    (folder,) = export(ckpt, tmp_path / "out", ["vllm"])
    assert json.loads((folder / "config.json").read_text())["num_heads"] == 2
    card = (folder / "README.md").read_text()
    assert '"num_speculative_tokens": 1}\'`' in card  # the heads alone: their own chain
    assert '"num_speculative_tokens": 2}\' \\' in card and '"drafter_tokens": 1' in card


def test_a_rule_kept_without_a_tuner_record_sets_the_cards_k_and_plugin_command(ckpt, tmp_path):
    """A drafter the tuner never ran on, whose serve check kept a rule record: the export serves the rule's
    chain (here 1 of the 2 heads, not every head) with the plugin's command beside it, although no record says
    how to decode (pick never returns a rule record); a rule record of other weights is not used."""
    from headstart.models.checkpoint import weights_signature
    from headstart.models.decoding import pick, read_decodings, rule_record
    from headstart.models.export import export

    rule = {"min_match": 2, "k": 1, "lookup_tokens": 2, "drafter_floor": 0.2}
    write_decoding(ckpt, rule_record(rule, "cpu", "some CPU, AVX512", "float32", "other weights"))
    (folder,) = export(ckpt, tmp_path / "stale", ["vllm"])
    assert json.loads((folder / "config.json").read_text())["num_heads"] == 2  # no rule: every head
    assert "headstart_lookup" not in (folder / "README.md").read_text()

    write_decoding(ckpt, rule_record(rule, "cpu", "some CPU, AVX512", "float32", weights_signature(ckpt)))
    assert [r["kind"] for r in read_decodings(ckpt)] == ["lookup_rule"] and pick(read_decodings(ckpt)) is None
    (folder,) = export(ckpt, tmp_path / "out", ["vllm"], serving_device="cpu")
    card = (folder / "README.md").read_text()
    assert json.loads((folder / "config.json").read_text())["num_heads"] == 2  # the lookup chain's 2
    assert '"num_speculative_tokens": 1}\'`' in card  # the heads alone: the rule's chain
    assert '"drafter_tokens": 1, "drafter_floor": 0.2' in card


def test_speculators_export_writes_k(backbone, tmp_path):
    from headstart.models.checkpoint import build_drafter
    from headstart.models.eagle import Eagle3Config
    from headstart.models.export.eagle import to_layout

    d = build_drafter("eagle3", Eagle3Config(aux_layers=[1, 1, 1], draft_vocab_size=64), backbone)
    config, _ = to_layout(d, "speculators", "base", ["LlamaForCausalLM"], k=5)
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_tuning_measures_and_chooses(method, tmp_path):
    """The EAGLE hooks end to end on a random drafter: acceptance measured by the probe, every setting's drafter
    cost timed, a (depth, nodes, topk) the decoder takes."""
    from headstart.eval.engine.decoder import build_decoder
    from headstart.eval.tuning.tuner import TunerConfig, tune
    from headstart.models import registry
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import LoadedDrafter, build_drafter, load_drafter, save_drafter

    cfg = BackboneConfig(
        name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2}
    )
    bb, m = load_backbone(cfg), registry.get(method)
    mcfg = m.config(aux_layers=[1, 1, 1], draft_vocab_size=64) if method == "eagle3" else m.config()
    ckpt = save_drafter(tmp_path / "d", build_drafter(method, mcfg, bb), method, mcfg, cfg, bb)
    loaded = LoadedDrafter(*load_drafter(ckpt, bb), ckpt)
    record = tune(
        m.proposer, bb, loaded, [[5, 6, 7, 8, 9], [10, 11, 12]], TunerConfig(reps=3, probe_tokens=16)
    )
    assert record["acceptance"]["source"] == "measured"
    assert set(record["decoder"]) == {"num_draft_tokens", "tree_nodes", "topk"}
    assert record["costs_s"]["draft"] and 1 <= record["vllm"]["num_speculative_tokens"] <= 8
    spec = build_decoder(m.proposer, bb, loaded, **record["decoder"])
    assert spec.proposer.width == record["decoder"]["tree_nodes"] + 1


# ---------------------------------------------------------------- the finalists, decoded


def test_finalists_are_repriced_by_their_decoded_steps(ckpt, monkeypatch):
    """The model ranked the wide tree first; decoded, its step costs 3 plain steps and the narrow one 1.2: the
    narrow one comes first, each speedup its tokens per step over its decoded step, in plain steps."""
    from headstart.eval.tuning import confirm
    from headstart.eval.tuning.tuner import Use
    from headstart.models.backbone import load_backbone
    from headstart.models.checkpoint import LoadedDrafter, load_drafter

    meta = json.loads((ckpt / "config.json").read_text())
    from headstart.models.backbone import BackboneConfig

    bb = load_backbone(BackboneConfig(**meta["backbone"]))
    loaded = LoadedDrafter(*load_drafter(ckpt, bb), ckpt)
    wide, narrow = tree_from_paths([[0], [1], [0, 0]]), chain_tree(1)
    ranked = [
        (Setting({"tree": [[0], [1], [0, 0]]}, wide, "depth2"), {"tokens_per_step": 2.0, "step_ms": 10.0, "speedup": 2.0}),
        (Setting({"tree": [[0]]}, narrow, "depth1"), {"tokens_per_step": 1.5, "step_ms": 10.0, "speedup": 1.5}),
    ]  # fmt: skip
    seen = {}

    def decoded(decoders, context, new_tokens, reps, *rest):
        seen.update({k: d.proposer.width if d.proposer else 1 for k, d in decoders.items()})
        return {"plain": 0.010, "0": 0.030, "1": 0.012}

    monkeypatch.setattr(confirm, "decoded_costs", decoded)
    out, plain = confirm.confirm(
        "medusa", bb, loaded, ranked, [5, 6, 7, 8], n=2, new_tokens=4, reps=3, use=Use()
    )
    assert seen == {"plain": 1, "0": 4, "1": 2}  # each finalist decoded as the eval builds it
    assert plain == 0.010 and [s.tree.size for s, _ in out] == [2, 4]
    first = out[0][1]
    assert first["speedup"] == pytest.approx(1.5 / 0.012 * 0.010) and first["step_ms"] == pytest.approx(12.0)
    assert first["step_ms_modelled"] == 10.0 and out[1][1]["speedup"] == pytest.approx(2.0 / 3)
    assert "tokens_per_step_modelled" not in first  # greedy: acceptance stays the model's
    # sampling: each finalist's tokens per step decoded on the probe's prompts, the model's kept beside
    out, _ = confirm.confirm("medusa", bb, loaded, ranked, [5, 6, 7, 8], n=2, new_tokens=6, reps=3,
                             use=Use(temperature=1.0), prompts=[[5, 6, 7], [9, 10]])  # fmt: skip
    for _, pred in out:
        assert pred["tokens_per_step_modelled"] in (2.0, 1.5) and 1.0 <= pred["tokens_per_step"] <= 4.0
        assert pred["speedup"] == pytest.approx(pred["tokens_per_step"] / (pred["step_ms"] / 1000) * 0.010)


def test_decoded_costs_time_each_decoder_after_an_untimed_round(ckpt):
    """One untimed decode per decoder (compiles, warms), then `reps` timed ones each; the cost is the mean step."""
    from headstart.eval.engine.decoder import Decoder
    from headstart.eval.tuning.confirm import decoded_costs
    from headstart.models.backbone import BackboneConfig, load_backbone

    meta = json.loads((ckpt / "config.json").read_text())
    bb = load_backbone(BackboneConfig(**meta["backbone"]))
    calls = []

    class Counting(Decoder):
        def generate(self, *args, **kw):
            out = super().generate(*args, **kw)
            calls.append(len(out.stats.step_latency_s))
            return out

    costs = decoded_costs(
        {"a": Counting(bb, max_cache_len=64), "b": Counting(bb, max_cache_len=64)}, [5, 6, 7], 6, 2
    )
    assert len(calls) == 2 * 3 and set(calls) == {5}  # 6 tokens: the prefill's and 5 steps, no EOS stop
    assert set(costs) == {"a", "b"} and all(0 < t < 1 for t in costs.values())


def test_compiled_widths_between_the_timed_ones_cost_the_next_timed_width():
    """Compiled, each width is its own graph and the cost a step function of the width: a 7-wide verify is
    priced at the 8-wide graph's cost, not on a line from the 4-wide one; eager costs stay interpolated."""
    verify = {1: 1.0, 4: 2.0, 8: 4.0}
    seven = Setting({}, chain_tree(6), "d")
    linear = Costs(verify=verify, draft={"d": 0.0}, bookkeeping={1: 0.0})
    nxt = Costs(verify=verify, draft={"d": 0.0}, bookkeeping={1: 0.0}, between="next")
    assert linear.step(seven) == pytest.approx(3.5) and nxt.step(seven) == pytest.approx(4.0)
    assert nxt.step(seven, width=4) == 2.0 and nxt.vanilla_step() == 1.0
    assert Costs.from_json(nxt.to_json()) == nxt
