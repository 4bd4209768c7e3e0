"""The hybrid's rule, tuned (eval/tuning/lookup_rule.py): which (lookup chain L, min_match m) wins on predicted
speed (greedy tau priced by verify cost by width), the lengths searched, when a growing chain is kept, and a real
tune on a tiny backbone whose record the serve check and the cards read back."""

import pytest

from headstart.eval.tuning.lookup_rule import (
    FLOORS,
    SLACK,
    growth,
    lookup_lengths,
    pick_rule,
    predicted_speed,
    steps_by_width,
    tune_lookup_rule,
)
from headstart.models.decoding import hybrid_speculative_config, lookup_options, plugin_serving, served_rule

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_fastest_rule_wins_and_near_ties_go_to_the_narrower_rule():
    assert pick_rule({None: 1.2, (2, 1): 1.3, (2, 2): 1.35, (4, 1): 1.5, (4, 2): 1.45}) == (4, 1)
    near = 1.5 * (1 - SLACK / 2)  # within the slack of the best: the shorter chain, then the larger m
    assert pick_rule({None: 1.2, (2, 1): near, (2, 2): near, (4, 1): 1.5}) == (2, 2)
    assert pick_rule({None: 1.5, (2, 1): 1.5, (4, 1): 1.49}) is None  # the drafter alone is in the tie


def test_lookup_lengths_run_from_the_drafters_chain_to_ngrams():
    assert lookup_lengths(2) == [2, 3, 4]
    assert lookup_lengths(5) == [5]  # never shorter than the drafter's chain


def test_growing_chains_are_tried_up_to_what_the_drafter_serves():
    assert growth(3, 16) == [8, 16]
    assert growth(1, 3) == [3] and growth(4, 12) == [8, 12]
    assert growth(4, 4) == [] and growth(2, None) == []  # nothing past the longest chain allowed


def test_steps_by_width_and_their_price_worked_by_hand():
    # 10 forwards; 6 had a 1st draft, 4 a 2nd, 1 a 3rd: widths 4 x1, 3 x3, 2 x2, and 4 steps drafted nothing
    assert steps_by_width(10, [6, 4, 1]) == {4: 1, 3: 3, 2: 2, 1: 4}
    assert steps_by_width(3, []) == {1: 3}
    # tau 2 over 4 steps costing 1 + 1 + 1.5 + 1.5 plain steps: 8 tokens in 5 steps' time
    assert predicted_speed(2.0, {1: 2, 3: 2}, {1: 1.0, 2: 1.1, 3: 1.5}) == pytest.approx(1.6)
    assert predicted_speed(2.0, {9: 1}, {1: 1.0, 4: 1.25}) == pytest.approx(1.6)  # past the curve: its widest


def test_the_drafters_own_price_worked_by_hand():
    """A drafter's price: "every" on each step, "step" more on the steps that verified its chain."""
    cost = {1: 1.0, 2: 1.0, 3: 1.0}
    # 4 steps of width 3, tau 1.5: 6 tokens; 2 of the steps verified the drafter's chain
    assert predicted_speed(1.5, {3: 4}, cost, 2) == pytest.approx(1.5)  # no price: drafting free
    priced = predicted_speed(1.5, {3: 4}, cost, 2, {"every": 0.0, "step": 0.2})
    assert priced == pytest.approx(6 / 4.4)
    both = predicted_speed(1.5, {3: 4}, cost, 2, {"every": 0.05, "step": 0.1})
    assert both == pytest.approx(6 / (4 + 4 * 0.05 + 2 * 0.1))


def test_the_drafters_price_moves_the_choice_to_the_rule_that_drafts_less(monkeypatch):
    """Recorded: m = 2 has 2% more tau than m = 1 but verifies the drafter's chain on 60 of 100 steps, m = 1 on
    20. Drafting priced free m = 2 wins; at 0.2 plain steps a drafter's step, m = 1. A record without the
    drafter's steps is not priced as if it had none: the rules are decoded again."""
    import headstart.eval.tuning.lookup_rule as lookup_rule

    floors = {f"L=1,m=2,floor={f:g}": 1.40 for f in FLOORS}  # tried behind m = 2, slower
    taus = {"none": 1.2, "L=1,m=1": 1.50, "L=1,m=2": 1.53, "L=1,m=3": 1.3} | floors
    drafted = {"none": 100, "L=1,m=1": 20, "L=1,m=2": 60, "L=1,m=3": 80} | dict.fromkeys(floors, 50)
    known = {"tau_by_rule": taus, "widths_by_rule": dict.fromkeys(taus, {"2": 100}),
             "drafter_steps_by_rule": drafted}  # fmt: skip
    args = (None, "medusa", None, {}, 1, [[1, 2, 3]], 8, [1], None)
    cost, price = {1: 1.0, 2: 1.0}, {"every": 0.0, "step": 0.2}
    free = tune_lookup_rule(*args, known, cost=cost, suffix=False)
    assert free.min_match == 2 and free.drafter_cost is None
    priced = tune_lookup_rule(*args, known, cost=cost, suffix=False, drafter_cost=price)
    assert priced.min_match == 1 and priced.drafter_cost == price
    assert priced.speed_by_rule["L=1,m=1"] == pytest.approx(1.50 / 1.04)
    assert priced.drafter_steps_by_rule["L=1,m=2"] == 60

    class Decoded(Exception):
        pass

    def decoder(*args, **kwargs):
        raise Decoded

    monkeypatch.setattr(lookup_rule, "build_decoder", decoder)
    without = {key: value for key, value in known.items() if key != "drafter_steps_by_rule"}
    with pytest.raises(Decoded):
        tune_lookup_rule(*args, without, cost=cost, suffix=False, drafter_cost=price)
    tune_lookup_rule(*args, without, cost=cost, suffix=False)  # drafting free: the record is enough


def test_a_growing_chain_is_kept_only_where_its_wider_verifies_pay():
    """Recorded taus and widths, two cost curves: growing adds 5% tau through 10 steps of width 4; it is kept
    where width 4 costs as much as width 2, not where it costs twice a plain step."""
    known = {
        "tau_by_rule": {"none": 1.2, "L=1,m=1": 1.5, "L=1,m=2": 1.4, "L=1,m=3": 1.3, "L=1,m=1,max=3": 1.575},
        "widths_by_rule": {"none": {"2": 100}, "L=1,m=1": {"2": 100}, "L=1,m=2": {"2": 100},
                           "L=1,m=3": {"2": 100}, "L=1,m=1,max=3": {"2": 90, "4": 10}},
    }  # fmt: skip
    args = (None, "medusa", None, {}, 1, [[1, 2, 3]], 8, [1], 3, known)
    flat = tune_lookup_rule(*args, cost={1: 1.0, 2: 1.05, 3: 1.05, 4: 1.05}, suffix=False)
    assert (flat.lookup_tokens, flat.min_match, flat.max_tokens) == (1, 1, 3)
    assert flat.speed_by_rule["L=1,m=1,max=3"] == pytest.approx(1.575 / 1.05)
    steep = tune_lookup_rule(*args, cost={1: 1.0, 2: 1.05, 3: 1.5, 4: 2.0}, suffix=False)
    assert (steep.lookup_tokens, steep.min_match, steep.max_tokens) == (1, 1, None)
    assert (
        steep.verify_cost == {"1": 1.0, "2": 1.05, "3": 1.5, "4": 2.0}
        and steep.tau_by_rule == known["tau_by_rule"]
    )


def test_the_hybrid_serves_an_eagle_drafters_drafts_by_local_argmax():
    """The hybrid's speculative_config: the longest chain; EAGLE drafters draft by the argmax over their own
    vocabulary (vLLM's use_local_argmax_reduction), a Medusa drafter as it is."""
    rule = {"source": "ngram", "min_match": 1, "k": 2, "lookup_tokens": 4, "max_tokens": 8}
    for method in ("eagle", "eagle3"):
        spec = {"model": "d", "method": method, "num_speculative_tokens": 2}
        assert hybrid_speculative_config(spec, rule) == spec | {
            "num_speculative_tokens": 8,
            "use_local_argmax_reduction": True,
        }
    medusa = {"model": "d", "method": "medusa", "num_speculative_tokens": 2}
    assert hybrid_speculative_config(medusa, rule) == medusa | {"num_speculative_tokens": 8}


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
    rule = tune_lookup_rule(backbone, "medusa", loaded, chain, 1, [prompt], 12, [1, 2, 3], suffix=False)
    chosen = f"L={rule.lookup_tokens},m={rule.min_match}"
    grown = {f"{chosen},max={most}" for most in (8, 16)}  # the chosen rule, tried growing with its match
    fixed = {f"L={L},m={m}" for L in (1, 2, 3) for m in (1, 2, 3)}
    kept = chosen + (f",max={rule.max_tokens}" if rule.max_tokens else "")
    floors = {f"{kept},floor={f:g}" for f in FLOORS} if rule.min_match > 1 else set()  # then with a floor
    assert (
        set(rule.tau_by_rule)
        == set(rule.speed_by_rule)
        == set(rule.widths_by_rule)
        == {"none"} | grown | fixed | floors
    )
    assert rule.min_match is not None and rule.k == 1 and rule.lookup_tokens in (1, 2, 3)
    assert set(rule.verify_cost) == {str(w) for w in range(1, 18)} and rule.verify_cost["1"] == 1.0
    for name, widths in rule.widths_by_rule.items():  # every step has its width, chains as long as allowed
        most = dict(part.split("=") for part in name.split(",")).get("max") if name != "none" else None
        assert max(map(int, widths)) <= (int(most) + 1 if most else 4)
    faster = {most: rule.speed_by_rule[f"{chosen},max={most}"] for most in (8, 16)}
    best = max(faster, key=faster.get)
    kept = faster[best] > rule.speed_by_rule[chosen]
    assert rule.max_tokens == (best if kept else None) and rule.served_k == (
        best if kept else rule.lookup_tokens
    )


def test_recorded_taus_are_not_decoded_again(backbone, monkeypatch):
    """An older record's taus and widths (same prompts) are reused: only the growing chain is new, replayed on the
    one plain decode recorded for it (the drafter's chain, no lookup: eval/tuning/replay.py)."""
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
    taus = {"none": 1.0, "L=1,m=1": 1.2, "L=1,m=2": 1.5, "L=1,m=3": 1.1}
    known = {"tau_by_rule": taus, "widths_by_rule": dict.fromkeys(taus, {"2": 10})}
    rule = tune_lookup_rule(
        backbone, "medusa", LoadedDrafter(heads, {"method": "medusa"}), chain, 1, [[5, 6, 7, 8] * 4], 8,
        [1], long_chain=3, known=known, cost=dict.fromkeys(range(1, 5), 1.0), suffix=False,
    )  # fmt: skip
    kept = "L=1,m=2" + (",max=3" if rule.max_tokens else "")
    floors = {f"{kept},floor={f:g}" for f in FLOORS}  # m = 2: each drafter floor tried, on the same decode
    assert built == [chain] and set(rule.tau_by_rule) == set(taus) | {"L=1,m=2,max=3"} | floors
    assert {k: rule.tau_by_rule[k] for k in taus} == taus and (rule.lookup_tokens, rule.min_match) == (1, 2)


def test_a_drafter_floor_is_kept_where_it_prices_within_slack_of_the_rule_without_it():
    """Recorded rules (nothing decoded): the kept n-gram rule at m = 2 is tried with each floor of FLOORS; the
    fastest floor is kept when within SLACK of the rule without it (it moves the requests whose drafter is weak
    to ngram's rule), not when it prices lower; a rule at m = 1 has no floor to try. Served with it."""
    base = {"none": 1.0, "L=1,m=1": 1.2, "L=1,m=2": 1.5, "L=1,m=3": 1.1, "L=1,m=2,max=3": 1.4}

    def tuned(floors: dict[str, float]):
        taus = base | floors
        known = {"tau_by_rule": taus, "widths_by_rule": dict.fromkeys(taus, {"2": 10})}
        return tune_lookup_rule(
            None, "medusa", None, {}, 1, [[1, 2, 3]], 8, [1], 3, known=known,
            cost=dict.fromkeys(range(1, 5), 1.0), suffix=False,
        )  # fmt: skip

    close = tuned({"L=1,m=2,floor=0.2": 1.49, "L=1,m=2,floor=0.4": 1.45})
    assert close.drafter_floor == 0.2 and close.predicted == pytest.approx(1.49)
    served = served_rule({"lookup_rule": close.to_json()}, 1)
    assert plugin_serving(served) == (1, {"headstart_lookup": {"min_match": 2, "drafter_floor": 0.2}})
    assert lookup_options(served)["lookup_drafter_floor"] == 0.2
    slower = tuned({"L=1,m=2,floor=0.2": 1.40, "L=1,m=2,floor=0.4": 1.3})
    assert slower.drafter_floor is None and slower.predicted == pytest.approx(1.5)


def test_suffix_decoding_is_kept_only_where_it_is_faster_prompt_by_prompt():
    """Recorded per-prompt steps (nothing decoded): suffix decoding's draft at each min_score beside the n-gram
    rules; kept when its best is faster on the tuning prompts beyond SUFFIX_SE standard errors of the paired
    difference, and then served as source 'suffix'; a pooled lead carried by one prompt is not enough."""
    from headstart.eval.tuning.lookup_rule import SUFFIX_SCORES

    def record(per_prompt: dict) -> dict:
        """{rule: per-prompt [accepted, {width: steps}]} -> the known record of those decodes."""
        taus, widths = {}, {}
        for name, rows in per_prompt.items():
            steps = sum(sum(ws.values()) for _, ws in rows)
            taus[name] = sum(a for a, _ in rows) / steps
            widths[name] = {"2": steps}
        return {"tau_by_rule": taus, "widths_by_rule": widths, "prompt_steps_by_rule": per_prompt}

    even = lambda accepted: [[accepted + i % 2, {"2": 10}] for i in range(4)]  # noqa: E731  4 prompts
    ngram = {name: even(15) for name in ("none", "L=1,m=1", "L=1,m=2", "L=1,m=3", "L=1,m=1,max=3")}
    ngram |= {"none": even(12), "L=1,m=2": even(14), "L=1,m=3": even(13)}  # L=1,m=1 the n-gram rule
    suffix = {f"suffix,s={s:g},max=3": even(14) for s in SUFFIX_SCORES}
    args = (None, "medusa", None, {}, 1, [[1, 2, 3]] * 4, 8, [1], 3)
    flat = dict.fromkeys(range(1, 5), 1.0)

    suffix["suffix,s=2,max=3"] = even(16)  # one token more on every prompt
    rule = tune_lookup_rule(*args, record(ngram | suffix), cost=flat, suffix=True)
    assert (rule.source, rule.min_score, rule.min_match, rule.lookup_tokens, rule.max_tokens) == (
        "suffix",
        2.0,
        None,
        3,
        None,
    )
    served = served_rule({"lookup_rule": rule.to_json()}, 1)
    assert served == {"source": "suffix", "min_score": 2.0, "k": 1, "lookup_tokens": 3}
    assert plugin_serving(served) == (
        3,
        {"headstart_lookup": {"source": "suffix", "min_score": 2.0, "drafter_tokens": 1}},
    )
    lucky = [[12, {"2": 10}], [13, {"2": 10}], [14, {"2": 10}], [30, {"2": 10}]]  # ahead on one prompt only
    rule = tune_lookup_rule(
        *args, record(ngram | suffix | {"suffix,s=2,max=3": lucky}), cost=flat, suffix=True
    )
    assert (rule.source, rule.min_score, rule.min_match) == ("ngram", None, 1)  # the n-gram rule kept
    assert rule.speed_by_rule["suffix,s=2,max=3"] > rule.speed_by_rule["L=1,m=1"]  # though pooled it leads
    assert set(rule.tau_by_rule) == set(ngram) | set(suffix)
