"""The eval's context lengths as the tuner prices them (eval/tuning/workload.py): decode positions grouped by the
compiled step's cache bucket, contexts built to those lengths from the probe's own sequences, costs weighted by
share, and a tuning run that prices its steps after each length."""

from __future__ import annotations

import pytest

from headstart.eval.engine.runner import bucket
from headstart.eval.stage.prompts import Prompt, chat_ids
from headstart.eval.tuning.workload import contexts, profile, turn_lengths, weighted
from headstart.models.decoding import describe_workload as describe


def test_positions_are_grouped_by_the_bucket_a_compiled_step_attends_over():
    # turns at 100, 300 and 900 tokens, 128 new each: positions 100-227 (bucket 256), 300-427 (512), 900-1023
    # (1024) and 1024-1027 (2048: 1% of the steps, dropped); each group at its mean position, rounded to 16
    assert bucket(228, 2048) == 256 and bucket(1024, 2048) == 1024 and bucket(1025, 2048) == 2048
    assert profile([100, 300, 900], 128, 2048) == ((160, 0.35), (368, 0.35), (960, 0.35))
    assert profile([10], 8, 2048) == ((16, 1.0),)
    # a bucket under MIN_SHARE of the steps is not priced (a compiled graph a width each): 10% at 960 dropped
    assert profile([100] * 9 + [900], 128, 2048) == ((160, 1.0),)
    assert profile([100] * 3 + [900], 128, 2048) == ((160, 0.75), (960, 0.25))
    # a cache shorter than a turn: positions past it are never decoded
    assert profile([200], 128, 256) == ((224, 1.0),)
    assert profile([], 128, 2048) == ()


def test_contexts_end_with_the_first_sequence_after_the_others():
    seqs = [[1, 2, 3], [4, 5], [6]]
    out = contexts(seqs, ((5, 0.5), (2, 0.3), (9, 0.2)))
    assert out == [
        [4, 5, 1, 2, 3],
        [2, 3],
        [4, 5, 6, 4, 5, 6, 1, 2, 3],
    ]  # repeats only when the others run out
    assert contexts([[7, 8]], ((5, 1.0),)) == [[7, 8, 7, 7, 8]]  # alone: it fills its own padding


def test_costs_are_weighted_by_share():
    assert weighted([{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 2.0}], ((16, 0.25), (512, 0.75))) == {
        "a": pytest.approx(2.5),
        "b": pytest.approx(2.0),
    }
    assert describe(((160, 0.9), (960, 0.1))) == "160 tokens 90%, 960 tokens 10%"
    assert describe(()) == "the probe's median sequence"


def test_turn_lengths_count_earlier_answers_at_max_new_tokens(backbone):
    tok = backbone.tokenizer
    p = Prompt("q", "c", ["Say hi.", "And again."])
    first = len(chat_ids(tok, [{"role": "user", "content": "Say hi."}]))
    both = len(
        chat_ids(tok, [{"role": "user", "content": "Say hi."}, {"role": "user", "content": "And again."}])
    )
    assert turn_lengths(tok, [p], 32) == [first, both + 32]


def test_the_tuner_prices_steps_after_each_workload_length(backbone, monkeypatch, tmp_path):
    """Verify costs are timed after a context of each length and weighted by share; the finalists are decoded
    after the largest group's context alone, as many tokens as the eval's answers; the record says which lengths
    it was priced at."""
    from headstart.eval.tuning import confirm, tuner
    from headstart.eval.tuning.records import conditions
    from headstart.models.checkpoint import LoadedDrafter
    from headstart.models.medusa import MedusaConfig, MedusaHeads

    timed, decoded = [], []

    def step_costs(bb, shapes, context, *a, **kw):  # a step after a longer context costs more
        timed.append(len(context))
        return {w: 0.001 * len(context) + 0.0001 * s[0] for w, s in shapes.items()}

    def decoded_costs(decoders, context, *a, **kw):
        decoded.append(len(context))
        return {n: 0.001 * len(context) * (1 if n == "plain" else 0.5) for n in decoders}

    monkeypatch.setattr(tuner, "step_costs", step_costs)
    monkeypatch.setattr(confirm, "decoded_costs", decoded_costs)
    heads = MedusaHeads(MedusaConfig(num_heads=2), backbone.hidden_size, backbone.vocab_size)
    loaded = LoadedDrafter(heads, {"method": "medusa"}, None)
    use = tuner.Use(workload=((32, 0.75), (64, 0.25)), new_tokens=8)  # probe_tokens 0: the eval's 8
    cfg = tuner.TunerConfig(reps=3, probe_prompts=2, min_trials=1, acceptance="measured")
    rec = tuner.tune("medusa", backbone, loaded, [[5, 6, 7], [9, 10, 11, 12]], cfg, use)
    assert timed == [32, 64] and decoded == [32] and rec["acceptance"]["probe"]["tokens"] == 8
    assert rec["costs_s"]["verify"]["1"] == pytest.approx(0.001 * (32 * 0.75 + 64 * 0.25) + 0.0001)
    assert rec["confirmed"][0]["step_ms"] == pytest.approx(0.5 * 32)
    assert conditions(backbone, loaded, use)["workload"] == [[32, 0.75], [64, 0.25]]
    assert conditions(backbone, loaded, tuner.Use())["workload"] is None
    with pytest.raises(ValueError, match="tuner.workload"):
        tuner.TunerConfig(workload="scored")
