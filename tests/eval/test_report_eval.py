"""Report arithmetic on hand-worked records, the best-checkpoint rule, the files written, and the eval config
schema (every config composes; a typo or a wrong type fails at compose time naming the key)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from headstart.eval.errors import EvalError
from headstart.eval.report.write import (
    best_index,
    latency_memory_rows,
    log_wandb,
    markdown,
    write_report,
    write_runs_summary,
)
from headstart.eval.scoring.score import FIRST_PASS_DROPPED, aggregate
from headstart.eval.stage.config import register_configs, to_eval_config
from headstart.tracking import LoggerConfig

CONF = str(Path(__file__).resolve().parents[2] / "eval" / "conf")


def rec(cat, v_tok, v_s, s_tok, fwd, s_s, acc, prop, times, lat, match):
    return {
        "question_id": cat,
        "category": cat,
        "match": match,
        "answers": ["x"],
        "vanilla": {"new_tokens": v_tok, "wall_s": v_s, "step_latency_s": [v_s / v_tok] * v_tok},
        # step_tokens: the prefill's token is not a step's (tau = step_tokens / target_forwards)
        "spec": {
            "new_tokens": s_tok,
            "step_tokens": s_tok - 1,
            "target_forwards": fwd,
            "wall_s": s_s,
            "accepted_by_position": acc,
            "proposed_by_position": prop,
            "time_s": times,
            "step_latency_s": lat,
        },
    }


RECORDS = [
    rec(
        "a",
        10,
        1.0,
        10,
        4,
        0.5,
        [3, 2, 1],
        [4, 4, 2],
        {"draft": 0.1, "verify": 0.3, "bookkeeping": 0.1, "total": 0.5},
        [0.1, 0.1, 0.1, 0.2],
        True,
    ),
    rec(
        "b",
        20,
        2.0,
        20,
        10,
        1.5,
        [6, 3],
        [10, 6],
        {"draft": 0.3, "verify": 1.0, "bookkeeping": 0.2, "total": 1.5},
        [0.15] * 10,
        False,
    ),
]


def test_aggregate_by_hand():
    m = aggregate(RECORDS, greedy=True)
    assert m["tokens_per_s"] == pytest.approx({"vanilla": 10.0, "spec": 15.0})  # 30 tok / 3 s, 30 tok / 2 s
    assert m["speedup_of_totals"] == pytest.approx(1.5)
    assert m["speedup"] == pytest.approx((2.0 + (20 / 1.5) / 10) / 2)  # median of the per-prompt ratios
    assert m["speedup_ci"] == pytest.approx([20 / 15, 2.0]) and m["speedup_pairs"] == 2  # < 6 pairs: min, max
    assert m["tau"] == pytest.approx((9 + 19) / 14)
    assert m["efficiency"] == pytest.approx(m["speedup"] / 2.0)
    assert m["acceptance_by_position"] == pytest.approx([9 / 14, 5 / 14, 1 / 14])
    assert m["acceptance_rate_by_position"] == pytest.approx([9 / 14, 5 / 10, 1 / 2])
    assert m["categories"]["a"]["tau"] == pytest.approx(9 / 4) and m["categories"]["a"][
        "speedup"
    ] == pytest.approx(2.0)
    assert (
        m["categories"]["b"]["speedup"] == pytest.approx((20 / 1.5) / 10) and m["categories"]["b"]["n"] == 1
    )
    assert m["greedy_matches_vanilla"] == 0.5
    assert m["time_split"] == pytest.approx({"draft": 0.2, "verify": 0.65, "bookkeeping": 0.15})
    assert m["step_latency_ms"]["p50"] == pytest.approx(150.0)
    assert aggregate(RECORDS, greedy=False)["greedy_matches_vanilla"] is None


def test_a_compiled_evals_rates_come_from_its_timed_rounds():
    """Its first pass compiled the graphs (dropped from the timing): tokens/s overall and by category, and the
    ratio of totals, are the rounds', and the latency rows say they are the first pass's."""
    units = [
        {"prompt": 0, "turn": 0, "ratios": [1.0], "timed": {"vanilla": [20, 2.0], "spec": [20, 1.0]}},
        {"prompt": 1, "turn": 0, "ratios": [1.0], "timed": {"vanilla": [40, 4.0], "spec": [40, 5.0]}},
    ]
    dropped = {"units": units, "flags": [], "predicted_speedup": None, "first_pass": FIRST_PASS_DROPPED}
    m = aggregate(RECORDS, greedy=True, timing=dropped)
    assert m["tokens_per_s"] == pytest.approx({"vanilla": 10.0, "spec": 10.0})  # 60 / 6 s each
    assert m["speedup_of_totals"] == pytest.approx(1.0)  # not the first pass's 1.5, which held the compiles
    assert m["categories"]["a"]["tokens_per_s"] == pytest.approx({"vanilla": 10.0, "spec": 20.0})
    timed = aggregate(RECORDS, greedy=True, timing=dropped | {"first_pass": "timed"})
    assert timed["tokens_per_s"] == pytest.approx({"vanilla": 10.0, "spec": 15.0})  # eager: the first pass's
    assert timed["speedup_of_totals"] == pytest.approx(1.5)
    rows = latency_memory_rows(_report() | {"timing": dropped})
    assert rows[0].startswith("| per-token latency p50 / p99 (ms), first pass: compiles included, spec vs")
    assert "first pass" not in markdown(_report())


def test_best_is_highest_tau_then_unflagged_speedup():
    entries = [{"speedup": 3.4, "tau": 2.0}, {"speedup": 1.4, "tau": 2.1}, {"speedup": 1.2, "tau": 1.9}]
    assert best_index(entries) == 1  # tau decides: load cannot move it
    assert best_index([{"speedup": None, "tau": 1.0}, {"speedup": 0.9, "tau": 1.0}]) == 1
    tied = [{"speedup": 1.1, "tau": 1.5}, {"speedup": 3.4, "tau": 1.5, "flags": ["above_bound: ..."]}]
    assert best_index(tied) == 0  # a flagged figure never decides


def _report() -> dict:
    return {
        "method": "medusa",
        "backbone": {"name": "tiny"},
        "checkpoint": "ck",
        "temperature": 0.0,
        "max_new_tokens": 8,
        "device": "cpu",
        "dtype": "float32",
        "prompts": {"file": "p.jsonl", "n": 2, "bad_rows": 1, "bad_examples": ["line 3: not JSON"]},
        **aggregate(RECORDS, greedy=True),
    }


def test_write_report_and_runs_summary(tmp_path):
    figures = write_report(tmp_path, _report(), RECORDS)
    assert json.loads((tmp_path / "report.json").read_text())["tau"] == pytest.approx(2.0)
    assert all(p.stat().st_size > 1000 for p in figures.values())
    md = markdown(_report())
    assert "| a | 1 | 2.250 | 2.000 |" in md and "line 3: not JSON" in md
    entries = [
        {"checkpoint": "s1", "step": 100, "tau": 1.5, "speedup": 1.1},
        {"checkpoint": "final", "step": None, "tau": 1.8, "speedup": 1.3},
    ]
    write_runs_summary(tmp_path, entries)
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert runs["best"] == "final" and [e["best"] for e in runs["checkpoints"]] == [False, True]
    assert "**best**" in (tmp_path / "runs.md").read_text() and (tmp_path / "tau_vs_step.png").is_file()


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("eval", overrides=overrides)


@pytest.mark.parametrize("logger", ["none", "wandb"])
def test_eval_config_composes(logger):
    # method= is this config's key, not the training config group conf/method/
    cfg = to_eval_config(_compose(["checkpoint=ck", f"logger={logger}", "out_dir=o", "method=prompt_lookup"]))
    assert cfg.logger.kind == logger and cfg.method == "prompt_lookup"
    assert cfg.prompts.endswith("dev_prompts.jsonl") and Path(cfg.prompts).is_file()


def test_several_prompt_files_score_as_one_set(tmp_path):
    """prompts= takes a path, a shipped set's name or a list of them; the list is one set whose categories sit
    side by side; an id in two files and a list of non-strings are refused in one line."""
    from headstart.eval.stage.prompts import load_prompts

    cfg = to_eval_config(_compose(["checkpoint=ck", "out_dir=o", "prompts=[dev,spec_bench]"]))
    both = load_prompts(cfg.prompts, limit_per_category=1)
    dev, bench = load_prompts("dev", 1), load_prompts("spec_bench", 1)
    assert both.categories == dev.categories | bench.categories and len(bench.categories) == 6
    assert [p.question_id for p in both.prompts] == [p.question_id for p in dev.prompts + bench.prompts]
    assert both.path.endswith("spec_bench_dev.jsonl") and "dev_prompts.jsonl, " in both.path
    copy = tmp_path / "copy.jsonl"
    copy.write_text((Path(dev.path)).read_text().splitlines()[0] + "\n")
    with pytest.raises(EvalError, match=r"question_id .* is in both .*dev_prompts.jsonl and .*copy.jsonl"):
        load_prompts(["dev", str(copy)])
    with pytest.raises(EvalError, match=r"prompts=\[1\]: expected a .jsonl path.*Fix: prompts=dev"):
        to_eval_config(_compose(["checkpoint=ck", "out_dir=o", "prompts=[1]"]))
    with pytest.raises(EvalError, match=r"one of \['dev', 'spec_bench'\]"):
        load_prompts("spec-bench")


def test_lookahead_options_compose_typed():
    cfg = to_eval_config(
        _compose(["checkpoint=ck", "out_dir=o", "baselines=[lookahead]", "lookahead.window=8"])
    )
    assert cfg.lookahead.set() == {"window": 8} and cfg.lookahead.resolved() == (8, 3, 4)
    assert cfg.proposer_options() == {}  # the baseline's, not the drafter's
    cfg = to_eval_config(_compose(["checkpoint=ck", "out_dir=o", "method=lookahead", "lookahead.guesses=2"]))
    assert cfg.proposer_options() == {"guesses": 2}


def test_unknown_key_and_wrong_type_fail_at_compose_time():
    with pytest.raises(ConfigCompositionException) as e:
        _compose(["max_new_token=8"])
    assert "Key 'max_new_token' not in 'EvalConfig'" in str(e.value.__cause__)
    with pytest.raises(ConfigCompositionException) as e:
        _compose(["temperature=hot"])
    assert isinstance(e.value.__cause__, ValidationError) and "temperature" in str(e.value.__cause__)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("temperature=-1", "temperature"),
        ("dtype=int8", "dtype"),
        ("method=foo", "method"),
        ("checkpoint=", "checkpoint="),
        ("timing.rel_ci=2", "rel_ci"),
        ("lookahead.ngram=1", r"lookahead\.ngram=1: must be an integer >= 2"),
        ("lookahead.window=3", "lookahead decoding is not run"),  # set, but no lookahead baseline
    ],
)
def test_range_checks_name_the_key(override, match):
    with pytest.raises(EvalError, match=match):
        to_eval_config(_compose(["checkpoint=ck", "out_dir=o", override]))


def test_log_wandb_sends_scalars_table_and_figures(tmp_path, monkeypatch):
    logged, inits = [], []

    class Run:
        log = staticmethod(logged.append)

        def finish(self):
            logged.append("finished")

    fake = types.SimpleNamespace(
        init=lambda **kw: inits.append(kw) or Run(),
        Table=lambda columns, data: ("table", data),
        Image=lambda path: ("image", path),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    figures = write_report(tmp_path, _report(), RECORDS)
    log_wandb(
        LoggerConfig(kind="wandb", mode="offline"),
        tmp_path,
        "eval-x",
        {"method": "medusa"},
        [{"eval/tau": 2.0}],
        (["category"], [["a"]]),
        figures,
    )
    assert inits[0]["mode"] == "offline" and inits[0]["dir"] == str(tmp_path) and inits[0]["name"] == "eval-x"
    assert logged[0] == {"eval/tau": 2.0} and logged[1] == {"eval/table": ("table", [["a"]])}
    assert logged[2]["eval/acceptance_by_position"] == ("image", str(figures["acceptance_by_position"]))
    assert logged[-1] == "finished"
