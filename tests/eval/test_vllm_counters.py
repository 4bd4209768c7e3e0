"""vLLM's spec-decode counters -> tau and per-position acceptance (hand-worked), and the serve check's pure
parts: chain options per method, EOS stripping, the pass/fail verdict."""

from __future__ import annotations

import pytest

from headstart.eval.engine.proposers import chain_options
from headstart.eval.serving import counters as vc
from headstart.eval.serving.check import EngineRun, OursRun, verdict
from headstart.eval.serving.side_by_side import strip_eos


def metrics(drafts, accepted, per_pos, draft_tokens=0, engines=1):
    rows = []
    for _ in range(engines):
        rows += [
            {"name": "vllm:spec_decode_num_drafts", "kind": "counter", "value": drafts},
            {"name": "vllm:spec_decode_num_draft_tokens", "kind": "counter", "value": draft_tokens},
            {"name": "vllm:spec_decode_num_accepted_tokens", "kind": "counter", "value": accepted},
            {"name": "vllm:spec_decode_num_accepted_tokens_per_pos", "kind": "vector", "values": per_pos},
            {"name": "vllm:num_requests_running", "kind": "gauge", "value": 1.0},
        ]
    return rows


def test_counters_parsed_and_summed_over_engines():
    c = vc.spec_counters(metrics(10, 12, [7, 4, 1], 30, engines=2))
    assert c == {"drafts": 20, "draft_tokens": 60, "accepted": 24, "accepted_per_pos": [14, 8, 2]}


def test_tau_and_rates_by_hand():
    # 10 drafting steps of a chain of 3: 7 accepted position 1, 4 of them position 2, 1 of those position 3.
    # Tokens: 10 from the target (one per step) + 12 accepted = 22 over 10 forwards.
    before = vc.spec_counters(metrics(5, 1, [1, 0, 0]))
    after = vc.spec_counters(metrics(15, 13, [8, 4, 1]))
    c = vc.delta(after, before)
    assert c["drafts"] == 10 and c["accepted"] == 12 and c["accepted_per_pos"] == [7, 4, 1]
    assert vc.tau(c) == pytest.approx(2.2)
    assert vc.position_rates(c) == pytest.approx([0.7, 0.4, 0.1])


def test_steps_without_a_draft_count_as_forwards():
    """An ngram proposer that matched on 10 of 16 decode steps (12 drafts accepted): 28 tokens after the prefill
    over 16 forwards, tau 1.75, not the 2.2 of its drafting steps alone."""
    c = vc.delta(vc.spec_counters(metrics(10, 12, [7, 4, 1])), vc.spec_counters([])) | {"emitted": 28}
    assert vc.tau(c) == pytest.approx(28 / 16)
    assert vc.tau(c | {"emitted": 22}) == pytest.approx(2.2)  # every step drafted: the same either way


def test_drafts_accepted_past_the_last_token_are_not_forwards():
    """vLLM counts a step's accepted drafts before it cuts the request at max_tokens or a stop token: 10 drafting
    steps of a chain of 2 that accepted 15 drafts, of which the last step's 2 fell past the 22-token limit.
    Forwards are the 10 steps (22 / 10 = 2.2), not 22 - 15 = 7 (3.14)."""
    c = vc.delta(vc.spec_counters(metrics(10, 15, [8, 7])), vc.spec_counters([])) | {"emitted": 22}
    assert vc.tau(c) == pytest.approx(2.2)


def test_the_vllm_runner_counts_tokens_after_each_prefill():
    from headstart.eval.serving.side_by_side import VllmRunner

    class Engine:
        def generate(self, prompts, max_new, stop_token_ids):
            return {"outputs": [{"token_ids": [5, 6, 7, 2]}], "time_s": 0.1}

        def metrics(self):
            return metrics(2, 1, [1])

    runner = VllmRunner(Engine(), [2])
    runner.warm_up([1])
    assert runner.run([1], 8) == ([5, 6, 7], 0.1)  # EOS stripped from the output, counted as emitted
    runner.run([1], 8)
    assert runner.counters()["emitted"] == 6


def test_no_drafts_is_tau_one():
    c = vc.spec_counters([])
    assert vc.tau(c) == 1.0 and vc.position_rates(c) == []


def test_delta_pads_a_vector_that_appeared_later():
    after = {"drafts": 4, "draft_tokens": 12, "accepted": 3, "accepted_per_pos": [2, 1]}
    before = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    assert vc.delta(after, before)["accepted_per_pos"] == [2, 1]


def test_chain_options():
    from types import SimpleNamespace

    four, two = SimpleNamespace(blocks=[0] * 4), SimpleNamespace(blocks=[0] * 2)
    assert chain_options("medusa", 3, four) == ({"tree": [[0], [0, 0], [0, 0, 0]]}, 3)
    assert chain_options("medusa", 5, two) == ({"tree": [[0], [0, 0]]}, 2)
    assert chain_options("eagle3", 3, None) == ({"num_draft_tokens": 3, "tree_nodes": 3, "topk": 1}, 3)
    assert chain_options("draft", 4, None) == ({"num_draft_tokens": 4}, 4)
    with pytest.raises(KeyError):
        chain_options("vanilla", 3, None)


def test_strip_eos():
    assert strip_eos([5, 6, 2, 9], {2}) == [5, 6] and strip_eos([5, 6], {2}) == [5, 6]


def test_verdict():
    ours = OursRun(tau=1.8, position_rates=[0.5, 0.2], tokens_per_s=10, outputs=[], drafts=400)
    good = EngineRun(loaded=True, tau=1.75, position_rates=[0.46, 0.2], counters={"drafts": 400})
    bad = EngineRun(loaded=True, tau=1.3, position_rates=[0.2, 0.05], counters={"drafts": 400})
    assert verdict("x", good, ours) == ""
    assert "below 0.9 x ours" in verdict("x", bad, ours)
    # 0.118 vs 0.138 over ~420 drafts each is 0.86x but under one standard error: noise, not a wrong export
    noisy = EngineRun(loaded=True, tau=1.13, position_rates=[0.118], counters={"drafts": 416})
    assert verdict("x", noisy, OursRun(1.16, [0.138], 2.0, [], drafts=443)) == ""
    assert "could not load" in verdict("x", EngineRun(loaded=False, error="boom"), ours)


def test_captured_aux_layers_from_the_log(tmp_path):
    from headstart.eval.serving.check import captured_aux_layers

    log = tmp_path / "v.log"
    log.write_text(
        "INFO [gpu_model_runner.py:5243] Using auxiliary layers from speculative config: (1, 14, 26)\n"
    )
    assert captured_aux_layers(log) == [1, 14, 26]
    assert captured_aux_layers(tmp_path / "missing.log") is None


def test_shortfall_z_by_hand():
    from headstart.eval.serving.check import shortfall_z

    # pooled p = 0.4, se = sqrt(0.4 * 0.6 * (1/100 + 1/100)) = 0.0693
    assert shortfall_z(0.5, 100, 0.3, 100) == pytest.approx(0.2 / 0.069282, rel=1e-4)
    assert shortfall_z(0.5, 0, 0.3, 100) == float("inf")


def test_verdict_catches_shifted_aux_layers():
    ours = OursRun(tau=1.2, position_rates=[0.2], tokens_per_s=10, outputs=[])
    run = EngineRun(loaded=True, tau=1.2, position_rates=[0.2], aux_layers=[1, 14, 26])
    assert "fuses target layers [1, 14, 26]" in verdict("eagle3-sglang", run, ours, [2, 15, 27])
    assert verdict("eagle3-sglang", run, ours, [1, 14, 26]) == ""
