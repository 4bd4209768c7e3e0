"""The serve check's comparison with prompt lookup (eval/serving/baselines.py): per-category speedups by hand,
ties, and the markdown it adds to the report."""

from __future__ import annotations

import pytest

from headstart.eval.serving import baselines as sb

CATS = ["math", "math", "rag", "rag"]


def _timed():
    # (tokens, seconds) per prompt: plain runs 10 tok/s everywhere; the drafter doubles math and slows rag;
    # lookup is 1.5x; in "ours" the drafter is 1.5x on rag only
    return {
        "vllm:plain": [(10, 1.0), (20, 2.0), (10, 1.0), (10, 1.0)],
        "vllm:medusa-vllm": [(10, 0.5), (20, 1.0), (10, 1.25), (10, 1.25)],
        "vllm:ngram": [(15, 1.0), (15, 1.0), (15, 1.0), (15, 1.0)],
        "ours:plain": [(10, 1.0)] * 4,
        "ours:drafter": [(10, 1.0), (10, 1.0), (15, 1.0), (15, 1.0)],
        "ours:prompt_lookup": [(15, 1.0)] * 3 + [(15.4, 1.0)],
    }


def test_speedups_by_category_by_hand():
    b = sb.compare(_timed(), {k: 1.0 for k in _timed()}, CATS, "medusa-vllm")
    sp = b["speedup"]
    assert sp["vllm:medusa-vllm"]["math"] == pytest.approx(2.0)  # 30 tok in 1.5 s vs 30 in 3 s
    assert sp["vllm:medusa-vllm"]["rag"] == pytest.approx(0.8)
    assert sp["vllm:medusa-vllm"]["all"] == pytest.approx((50 / 4.0) / (50 / 5.0))
    assert sp["vllm:ngram"]["math"] == pytest.approx(1.5)  # 30 tok in 2 s vs 30 in 3 s
    assert sp["ours:prompt_lookup"]["rag"] == pytest.approx(1.52)
    assert b["categories_won"]["vllm"] == [1, 2]  # math won, rag lost
    # rag: 1.50 vs 1.52 is a tie (within 2%), not a win; math: 1.0 vs 1.5 lost
    assert b["categories_won"]["ours"] == [0, 2] and b["categories_tied"] == {"vllm": 0, "ours": 1}


def test_markdown_names_every_run_and_the_wins():
    b = sb.compare(_timed(), {k: 1.25 for k in _timed()}, CATS, "medusa-vllm")
    md = "\n".join(sb.to_markdown(b))
    assert "| math | 2.00x |" in md and "| rag | 0.80x |" in md
    assert "1/2 categories in vLLM, 0/2 in headstart's decoder" in md
    assert "`ngram` (4 drafts, n-grams 1..3)" in md


def test_the_hybrid_is_judged_beyond_noise_per_category():
    """The hybrid against each rival, prompt by prompt: on math it runs 1.9-2.1x the best rival's rate (ahead
    beyond noise), on rag 0.5-0.55x ngram's (behind beyond noise); with one prompt a category nothing is judged."""
    timed = _timed() | {
        "vllm:hybrid": [(30, 1.0), (31, 1.0), (7.5, 1.0), (8.2, 1.0)],
        "vllm:ngram": [(15, 1.0), (15, 1.0), (15, 1.0), (15, 1.0)],
    }
    b = sb.compare(timed, {k: 1.0 for k in timed}, CATS, "medusa-vllm")
    noise = b["hybrid_beyond_noise"]
    assert noise["ahead"] == ["math"] and noise["behind"] == {"rag": ["vllm:ngram"]} and noise["of"] == 2
    ngram_rag = noise["intervals"]["vllm:ngram"]["rag"]
    assert ngram_rag["low"] < ngram_rag["ratio"] < ngram_rag["high"] < 1 and ngram_rag["prompts"] == 2
    md = "\n".join(sb.to_markdown(b))
    assert (
        "faster than every other in 1/2 categories; slower than one of them in 1/2: rag (behind ngram)." in md
    )
    single = {k: v[1:3] for k, v in timed.items()}
    alone = sb.compare(single, {k: 1.0 for k in single}, ["math", "rag"], "medusa-vllm")
    assert alone["hybrid_beyond_noise"] is None
    assert "Beyond noise: not judged" in "\n".join(sb.to_markdown(alone))
