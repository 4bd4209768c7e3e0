"""vLLM's step cost by verify width (eval/serving/vllm_costs.py): the serve check prices the hybrid's rule with
it, and re-prices a rule recorded with headstart's own costs; the measurement itself on a tiny model in real vLLM
(slow)."""

from __future__ import annotations

import json

import pytest

from headstart.vllm_runner import is_set_up

VLLM_COST = {1: 1.02, 2: 1.07, 3: 1.13}


def test_the_serve_check_prices_the_rule_with_vllms_steps_once(backbone, tmp_path, monkeypatch):
    """A rule recorded with headstart's eager costs (in an older record of the same weights) is priced again with
    vLLM's (its decodes reused: the old rule is passed as known), written into the newest record marked "vllm",
    and then reused without timing vLLM again."""
    import headstart.eval.serving.vllm_costs as vllm_costs
    import headstart.eval.tuning.lookup_rule as lookup_rule
    from headstart.eval.serving.check import recorded_rule
    from headstart.models.checkpoint import LoadedDrafter, build_drafter
    from headstart.models.decoding import read_decoding, write_decoding
    from headstart.models.medusa import MedusaConfig

    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    loaded = LoadedDrafter(heads, {"method": "medusa"})
    old = {"k": 2, "prompts": 2, "max_new_tokens": 8, "min_match": 1, "lookup_tokens": 2,
           "tau_by_rule": {"none": 1.1}, "widths_by_rule": {"none": {"3": 4}}, "speed_by_rule": {"none": 0.7},
           "verify_cost": {"1": 1.0, "2": 1.6, "3": 1.8}}  # fmt: skip
    conditions = {"device": "cpu", "temperature": "greedy", "weights": "w"}
    write_decoding(tmp_path, {"decoder": {"tree": [[0]]}, "conditions": conditions, "lookup_rule": old})
    # a newer tuning of the tree (the eval stage's), for another workload: it carries no rule
    newer = {"decoder": {"tree": [[0], [0, 0]]}, "conditions": conditions | {"workload": [[8, 1.0]]}}
    write_decoding(tmp_path, newer)
    timed, tuned = [], []

    def measure(model, prompt, widest, dtype, reps=4, eager=False, drafter=None, keeps_cache=False):
        timed.append((prompt, widest, dtype))
        return {"cost": dict(VLLM_COST), "ms": {0: 30.0} | {w: 30.0 * c for w, c in VLLM_COST.items()}}

    def tune(*args, known=None, cost=None, cost_source="headstart", **kwargs):
        tuned.append((known, cost, cost_source))
        return lookup_rule.LookupRule(
            min_match=1, k=2, lookup_tokens=2, tau_by_rule={"none": 1.1}, prompts=2, max_new_tokens=8,
            verify_cost={str(w): c for w, c in cost.items()}, cost_source=cost_source, predicted=1.21,
        )  # fmt: skip

    monkeypatch.setattr(vllm_costs, "measure_in_vllm", measure)
    monkeypatch.setattr(lookup_rule, "tune_lookup_rule", tune)
    monkeypatch.setattr(lookup_rule, "untried_suffix", lambda rule: False)
    questions = ["What is a cat?", "Name three colours, please."]
    served = recorded_rule(tmp_path, backbone, loaded, 2, questions, 8, "float32")
    assert len(timed) == 1 and timed[0][1:] == (lookup_rule.LONG_CHAIN + 1, "float32")
    (known, cost, source), = tuned  # fmt: skip
    assert known == old and cost == VLLM_COST and source == "vllm"
    assert served["cost_source"] == "vllm" and served["predicted"] == 1.21 and served["min_match"] == 1
    newest = read_decoding(tmp_path, greedy=True, device="cpu")
    assert newest["decoder"] == newer["decoder"] and newest["lookup_rule"]["cost_source"] == "vllm"
    assert newest["lookup_rule"]["vllm_step_ms"] == {
        "0": 30.0,
        "1": 30.6,
        "2": 32.1,
        "3": 33.9,
    }  # what was fitted

    again = recorded_rule(tmp_path, backbone, loaded, 2, questions, 8, "float32")
    assert len(timed) == 1 and len(tuned) == 1 and again == served  # priced by vLLM already: reused


def test_a_rule_tuned_without_a_tuner_record_is_kept_and_reused(backbone, tmp_path, monkeypatch):
    """A drafter whose run had no eval stage (no tuner record): the serve check's rule is written as a rule
    record of its weights and device, which the next serve check reuses without timing or tuning again; a
    retrained drafter (other weights) is tuned anew, its stale rule dropped."""
    import os

    import headstart.eval.serving.vllm_costs as vllm_costs
    import headstart.eval.tuning.lookup_rule as lookup_rule
    from headstart.eval.serving.check import recorded_rule
    from headstart.models.backbone import BackboneConfig
    from headstart.models.checkpoint import LoadedDrafter, build_drafter, save_drafter, weights_signature
    from headstart.models.decoding import read_decodings
    from headstart.models.medusa import MedusaConfig

    cfg, tiny = (
        MedusaConfig(num_heads=2),
        BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0}),
    )
    heads = build_drafter("medusa", cfg, backbone)
    drafter_dir = save_drafter(tmp_path / "drafter", heads, "medusa", cfg, tiny, backbone)
    loaded = LoadedDrafter(heads, {"method": "medusa"}, drafter_dir)
    timed, tuned = [], []
    monkeypatch.setattr(
        vllm_costs, "measure_in_vllm", lambda *a, **kw: timed.append(a) or {"cost": dict(VLLM_COST), "ms": {}}
    )

    def tune(*args, known=None, cost=None, cost_source="headstart", **kwargs):
        tuned.append(known)
        return lookup_rule.LookupRule(
            min_match=2, k=2, lookup_tokens=3, tau_by_rule={"none": 1.1}, prompts=2, max_new_tokens=8,
            speed_by_rule={"none": 1.0}, verify_cost={str(w): c for w, c in cost.items()}, cost_source=cost_source,
            predicted=1.3,
        )  # fmt: skip

    monkeypatch.setattr(lookup_rule, "tune_lookup_rule", tune)
    monkeypatch.setattr(lookup_rule, "untried_suffix", lambda rule: False)
    monkeypatch.setattr(lookup_rule, "untried_floor", lambda rule: False)
    questions = ["What is a cat?", "Name three colours, please."]
    served = recorded_rule(drafter_dir, backbone, loaded, 2, questions, 8, "float32")
    (kept,) = read_decodings(drafter_dir)
    assert kept["kind"] == "lookup_rule" and kept["lookup_rule"]["min_match"] == 2
    assert kept["conditions"] | {"device_name": None} == {"temperature": "greedy", "device": "cpu",
        "device_name": None, "dtype": "float32", "weights": weights_signature(drafter_dir)}  # fmt: skip
    again = recorded_rule(drafter_dir, backbone, loaded, 2, questions, 8, "float32")
    assert again == served and len(timed) == 1 and tuned == [None]

    os.utime(drafter_dir / "model.safetensors", ns=(1, 1))  # retrained: other weights
    recorded_rule(drafter_dir, backbone, loaded, 2, questions, 8, "float32")
    assert len(timed) == 2 and tuned == [None, None]
    (kept,) = read_decodings(drafter_dir)
    assert kept["conditions"]["weights"] == weights_signature(drafter_dir)


def test_a_drafters_price_worked_by_hand():
    """Median step ms (0: plain) -> what the drafter adds: its engine's step less the forced verify of its width;
    a drafter with a KV cache pays its first pass (timed at k = 1) on every step."""
    from headstart.eval.engine.proposers import stateless
    from headstart.eval.serving.vllm_costs import drafter_engines, drafter_price

    ms = {0: 50.0, 1: 50.5, 2: 51.0, 3: 52.0, "drafter": 61.0}
    assert drafter_price(ms, 2, keeps_cache=False) == pytest.approx({"every": 0.0, "step": 0.18})
    ms["drafter1"] = 55.0  # the first pass: 4 ms over a forced width 2
    assert drafter_price(ms, 2, keeps_cache=True) == pytest.approx({"every": 0.08, "step": 0.10})
    assert drafter_price(ms | {"drafter": 51.0}, 2, keeps_cache=True) == {"every": 0.0, "step": 0.0}  # noise
    assert drafter_price({0: 50.0, 2: 51.0, "drafter": 56.0}, 1, keeps_cache=True) == pytest.approx(
        {"every": 0.1, "step": 0.0}
    )  # a chain of 1 is all first pass
    medusa = {"speculative_config": {"method": "medusa", "model": "h", "num_speculative_tokens": 2}}
    eagle = {"speculative_config": {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}}
    assert (
        list(drafter_engines(medusa, keeps_cache=False)) == ["drafter"] and drafter_engines(None, False) == {}
    )
    assert stateless("medusa") and not stateless("eagle3") and not stateless("draft")  # who keeps a cache
    engines = drafter_engines(eagle, keeps_cache=True)
    assert (
        engines["drafter1"]["speculative_config"]["num_speculative_tokens"] == 1
        and engines["drafter"] == eagle
    )


def test_the_serve_check_prices_the_drafter_and_reprices_a_rule_that_priced_it_free(
    backbone, tmp_path, monkeypatch
):
    """Given the drafter's engine arguments, the probe times the drafter too and the tuner gets its price; a rule
    already priced by vLLM but with drafting free is priced again (its decodes reused), then kept."""
    import headstart.eval.serving.vllm_costs as vllm_costs
    import headstart.eval.tuning.lookup_rule as lookup_rule
    from headstart.eval.serving.check import recorded_rule
    from headstart.models.checkpoint import LoadedDrafter, build_drafter
    from headstart.models.decoding import read_decoding, write_decoding
    from headstart.models.medusa import MedusaConfig

    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    loaded = LoadedDrafter(heads, {"method": "medusa"})
    free = {"k": 2, "prompts": 2, "max_new_tokens": 8, "min_match": 2, "lookup_tokens": 2, "cost_source": "vllm",
            "tau_by_rule": {"none": 1.1}, "widths_by_rule": {"none": {"3": 4}}, "speed_by_rule": {"none": 0.7},
            "verify_cost": {"1": 1.0, "2": 1.0, "3": 1.0}}  # fmt: skip
    conditions = {"device": "cpu", "temperature": "greedy", "weights": "w"}
    write_decoding(tmp_path, {"decoder": {"tree": [[0]]}, "conditions": conditions, "lookup_rule": free})
    monkeypatch.setattr(lookup_rule, "untried_suffix", lambda rule: False)
    monkeypatch.setattr(lookup_rule, "untried_floor", lambda rule: False)
    price = {"every": 0.0, "step": 0.15, "k": 2, "method": "medusa", "ms": {"drafter": 60.0}}
    asked, tuned = [], []

    def measure(model, prompt, widest, dtype, reps=4, eager=False, drafter=None, keeps_cache=False):
        asked.append((drafter, keeps_cache))  # Medusa's heads keep no cache
        return {"cost": dict(VLLM_COST), "ms": {0: 30.0}, "drafter": price}

    def tune(*args, known=None, cost=None, cost_source="headstart", drafter_cost=None, **kwargs):
        tuned.append((known, drafter_cost))
        return lookup_rule.LookupRule(
            min_match=1, k=2, lookup_tokens=2, tau_by_rule={"none": 1.1}, prompts=2, max_new_tokens=8,
            verify_cost={str(w): c for w, c in cost.items()}, cost_source=cost_source, predicted=1.2,
            drafter_cost=drafter_cost,
        )  # fmt: skip

    monkeypatch.setattr(vllm_costs, "measure_in_vllm", measure)
    monkeypatch.setattr(lookup_rule, "tune_lookup_rule", tune)
    spec = {"speculative_config": {"method": "medusa", "model": "h", "num_speculative_tokens": 2}}
    questions = ["What is a cat?", "Name three colours, please."]
    served = recorded_rule(tmp_path, backbone, loaded, 2, questions, 8, "float32", spec)
    assert asked == [(spec, False)] and tuned == [(free, price)] and served["drafter_cost"] == price
    assert read_decoding(tmp_path, greedy=True, device="cpu")["lookup_rule"]["drafter_cost"] == price
    again = recorded_rule(tmp_path, backbone, loaded, 2, questions, 8, "float32", spec)
    assert again == served and len(asked) == 1  # priced with its drafter: reused


@pytest.mark.slow
@pytest.mark.skipif(not is_set_up(), reason="vLLM not set up (./launch.sh vllm-setup)")
def test_vllm_steps_are_timed_by_width_against_plain_decoding(tmp_path):
    """Real engines on a tiny Llama: a cost for every width 1..widest, relative to the plain engine's step (so
    of the order of 1), never falling as the verify widens nor under a plain step; and the price of Medusa heads
    served alone at a chain of 2, timed in the same rounds (nothing every step: the heads keep no cache)."""
    from headstart.eval.serving.check import export_layouts, layout_spec
    from headstart.eval.serving.vllm_costs import measure_in_vllm
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import build_drafter, read_meta, save_drafter
    from headstart.models.medusa import MedusaConfig

    # vLLM's CPU attention takes head sizes of 32 and up
    tiny = {"seed": 0, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
    cfg = BackboneConfig(name="tiny-costs", path="tiny", dtype="float32", tiny=tiny)
    backbone = load_backbone(cfg)
    target = tmp_path / "target"
    backbone.model.save_pretrained(target)
    backbone.tokenizer.save_pretrained(target)
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    drafter_dir = save_drafter(tmp_path / "drafter", heads, "medusa", heads.cfg, cfg, backbone)
    (lay,) = [
        lay
        for lay in export_layouts(drafter_dir, read_meta(drafter_dir), tmp_path / "export")
        if lay.required
    ]
    prompt = backbone.tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    timed = measure_in_vllm(
        str(target), prompt, 4, "float32", reps=1, eager=True, drafter=layout_spec("medusa", lay, 2)
    )
    cost = timed["cost"]
    assert sorted(cost) == [1, 2, 3, 4] and sorted(timed["ms"]) == [0, 1, 2, 3, 4]
    assert 1.0 <= cost[1] <= cost[2] <= cost[3] <= cost[4]
    assert cost[4] < 5  # relative to a plain step: a tiny model's verify of 4 is no 5 plain steps
    price = timed["drafter"]
    assert (price["k"], price["method"], price["every"]) == (2, "medusa", 0.0) and 0.0 <= price["step"] < 5
    assert price["ms"]["drafter"] > 0 and "drafter1" not in price["ms"]
    json.dumps(timed)  # what decoding.json records


def test_the_report_holds_the_rules_prediction_beside_the_served_step_cost():
    from headstart.eval.serving.check import hybrid_markdown

    rates = {"tau": 1.57, "position_rates": [0.34], "tokens_per_s": 23.5}
    h = {"source": "ngram", "min_match": 2, "k": 2, "lookup_tokens": 3, "max_tokens": None, "loaded": True,
         "predicted": 1.5, "cost_source": "vllm", "vllm": rates | {"speedup": 1.17},
         "ours": rates | {"speedup": 0.8}, "tau_ratio": 1.0, "tau_within_tolerance": True,
         "agree_with_vllm_plain": 17}  # fmt: skip
    text = "\n".join(hybrid_markdown(h, 17))
    assert "priced by vLLM's step cost by verify width on this machine" in text
    assert "1.50x; served, a vLLM step of the hybrid cost 1.34 plain steps" in text
    assert "the drafter's own cost left out" in text
    priced = "\n".join(hybrid_markdown(h | {"drafter_cost": {"every": 0.0, "step": 0.18}}, 17))
    assert (
        "the drafter's own measured in vLLM: 0.00 plain steps every step, 0.18 more a step on its chain"
        in priced
    )
    alone = "\n".join(hybrid_markdown(h | {"drafter_alone": {"predicted": 1.112, "served": 1.09}}, 17))
    assert "The drafter alone, priced alike: predicted 1.11x, served 1.09x." in alone
    assert "predicted" not in "\n".join(hybrid_markdown(h | {"predicted": None}, 17))


def test_the_hybrid_summary_holds_the_drafter_alone_predicted_and_served():
    from types import SimpleNamespace

    from headstart.eval.serving.check import hybrid_summary

    def run(tau: float, rate: float):
        return SimpleNamespace(tau=tau, position_rates=[0.4], tokens_per_s=rate, outputs=[[1, 2]])

    runs = {"vllm:plain": run(1.0, 20.0), "ours:plain": run(1.0, 10.0), "vllm:hybrid": run(1.6, 28.0),
            "ours:hybrid": run(1.6, 13.0), "vllm:medusa-vllm": run(1.3, 22.0)}  # fmt: skip
    rule = {"k": 2, "min_match": 2, "predicted_alone": 1.12}
    h = hybrid_summary(runs, {}, rule, "vllm:medusa-vllm")
    assert h["drafter_alone"] == pytest.approx({"predicted": 1.12, "served": 1.1})
    assert h["vllm"]["speedup"] == pytest.approx(1.4) and h["agree_with_vllm_plain"] == 1
    assert "drafter_alone" not in hybrid_summary(
        runs, {}, rule | {"predicted_alone": None}, "vllm:medusa-vllm"
    )


def test_costs_are_the_non_decreasing_fit_never_under_a_plain_step():
    """Worked by hand: ratios to the plain step 0.99, 1.03, 1.20, 1.10, 1.30 pool the 1.20 / 1.10 violation to 1.15,
    and a speculative step never costs under a plain one; one slow width is averaged with the wider ones after it,
    not carried to all of them (a running maximum read 2.0 for every width past a single 2x step)."""
    from headstart.eval.serving.vllm_costs import relative_costs

    got = relative_costs({0: 100.0, 1: 99.0, 2: 103.0, 3: 120.0, 4: 110.0, 5: 130.0})
    assert got == pytest.approx({1: 1.0, 2: 1.03, 3: 1.15, 4: 1.15, 5: 1.30})
    spike = relative_costs({0: 100.0, 1: 100.0, 2: 200.0, 3: 100.0, 4: 100.0})
    assert spike == pytest.approx({1: 1.0, 2: 4 / 3, 3: 4 / 3, 4: 4 / 3})
