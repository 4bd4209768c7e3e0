"""Speedup figures under load (eval/timing/harness.py, eval/timing/bounds.py): the median CI by hand, interleaved rounds on a
synthetic clock, and the eval stage with one side deliberately slowed: its figure stays within 15% of the
unslowed one or is flagged, and a flagged figure never decides the best checkpoint. No speed targets: every
assertion compares figures of the same run or is about flags."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from test_eval_stage import save_ckpt

from headstart.eval.stage.config import EvalConfig
from headstart.eval.timing.bounds import check
from headstart.eval.timing.harness import (
    Interleaved,
    Sample,
    TimingConfig,
    TimingError,
    choose_threads,
    median_ci,
)
from headstart.eval.tuning.tuner import TunerConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_median_ci_by_hand():
    # n = 20: P(B <= 5) = 0.021 <= 0.025 < P(B <= 6) = 0.058, so the CI is the 6th smallest .. 6th largest
    assert median_ci(list(range(1, 21))) == (10.5, 6.0, 15.0)
    assert median_ci([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)  # under 6 values: min .. max
    with pytest.raises(TimingError):
        TimingConfig(outlier=1.0)


def _clock(spikes: set[int]):
    """Side 'b' takes 0.5 s per unit and 'a' 1 s (b is 2x), on a fake clock; the calls numbered in `spikes`
    take 10x (a burst of load)."""
    calls = []

    def run(side: str, unit: int) -> Sample:
        calls.append((side, unit))
        slow = 10.0 if len(calls) in spikes else 1.0
        return Sample(tokens=10, seconds=(1.0 if side == "a" else 0.5) * slow, steps=10)

    return run, calls


def test_rounds_rotate_order_and_retime_a_burst():
    run, calls = _clock(spikes={4})  # unit 1's first timing of one side is hit
    timer = Interleaved(["a", "b"], "a", TimingConfig(budget_s=5, max_rounds=4, rel_ci=0.01))
    timer.run(run, units=3)
    assert calls[:6] == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]  # order alternates
    assert timer.retimed == 1 and not timer.outliers  # the burst was re-timed away
    assert timer.summary("b")["median"] == pytest.approx(2.0) and timer.summary("b")["ci"] == [2.0, 2.0]
    assert timer.converged() and timer.rounds == 2  # 6 identical ratios: the CI is tight, no more rounds


def test_a_burst_that_stays_is_counted_not_hidden():
    run, _ = _clock(spikes=set(range(4, 1000, 6)))  # every re-timing of the same pair is hit again
    timer = Interleaved(["a", "b"], "a", TimingConfig(budget_s=5, max_rounds=2, retries=1))
    timer.run(run, units=3)
    assert timer.outliers and timer.report()["outliers"] == len(timer.outliers)
    assert timer.summary("b")["median"] == pytest.approx(2.0)  # the median is not moved by it


def test_three_sides_share_one_base_and_a_pair_reads_like_two():
    def run(side, unit):  # c is 4x a on every unit; b is 2x
        return Sample(tokens=10, seconds={"a": 1.0, "b": 0.5, "c": 0.25}[side], steps=10)

    timer = Interleaved(["a", "b", "c"], "a", TimingConfig(budget_s=5, max_rounds=3, rel_ci=0.01))
    timer.run(run, units=3)
    assert [timer.order(u, 0)[0] for u in range(3)] == ["a", "b", "c"]  # each side leads a unit
    pair = timer.pair("c", "spec")
    assert pair.sides == ["a", "spec"] and pair.summary("spec")["median"] == pytest.approx(4.0)
    assert pair.samples.keys() == timer.samples.keys()  # the same base timings behind every side
    assert all(s["a"] is timer.samples[k]["a"] for k, s in pair.samples.items())
    assert timer.pair("b").report()["ratios"]["b"]["median"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="other than the base"):
        timer.pair("a")


def test_bound_and_prediction_flags():
    costs = {"vanilla": 1.0, "spec": 1.25}
    pred = {"predicted_speedup": 1.2}
    assert check(1.25, 1.5, costs, pred, 0.0, 0.15)["flags"] == []
    assert check(1.25, 1.5, costs, pred, 0.0, 0.15)["bound"] == pytest.approx(1.2)
    flags = check(3.39, 1.15, costs, pred, 0.0, 0.15)["flags"]  # the case: 3.39x at tau 1.15
    assert [f.split(":")[0] for f in flags] == ["above_bound", "off_prediction"]
    assert [f.split(":")[0] for f in check(0.44, 1.15, costs, pred, 0.0, 0.15)["flags"]] == ["off_prediction"]
    assert [f.split(":")[0] for f in check(1.2, 1.5, costs, pred, 0.5, 0.15)["flags"]] == ["unstable"]


def test_threads_requested_and_auto():
    n = torch.get_num_threads()
    try:
        assert choose_threads(1) == 1 == torch.get_num_threads()
        assert 1 <= choose_threads(0) <= (torch.get_num_threads() or 1)
    finally:
        torch.set_num_threads(n)


# ---------------------------------------------------------------- the eval stage with a slowed side

TIMING = TimingConfig(budget_s=15, threads=1)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    return save_ckpt(tmp_path / "drafter")


@pytest.fixture
def prompt_file(tmp_path) -> Path:
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Another one."]},
        {"question_id": 2, "category": "writing", "turns": ["Say hi."]},
        {"question_id": 3, "category": "coding", "turns": ["def add(a, b):"]},
        {"question_id": 4, "category": "math", "turns": ["What is 12 * 7?"]},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _cfg(ckpt, prompts, out) -> EvalConfig:
    return EvalConfig(
        checkpoint=str(ckpt),
        prompts=str(prompts),
        out_dir=str(out),
        max_new_tokens=24,
        device="cpu",
        dtype="float32",
        timing=TIMING,
        # the hand-set tree: the tuner times each checkpoint itself, so identical weights could get different
        # trees (and taus) from timing noise; tests/eval/test_tuner.py covers it
        tuner=TunerConfig(mode="off"),
    )


def _slow_spec(monkeypatch, delay_s: float, every: int = 1, only: str = ""):
    """Every `every`-th generate() of a speculative decoder (of checkpoint path containing `only`) sleeps
    `delay_s` in each of its verify forwards: load that hits one side, not a cost of the method (the step-cost
    microbenchmark runs a fresh runner and does not see it)."""
    import headstart.eval.stage.evaluate as stage

    build = stage.build_decoder

    def slowed(method, backbone, checkpoint_dir=None, **opts):
        dec = build(method, backbone, checkpoint_dir, **opts)
        if method == "vanilla" or only not in str(getattr(checkpoint_dir, "path", checkpoint_dir)):
            return dec
        step, generate, calls = dec.runner.step, dec.generate, [0]

        def slow_step(*a, **kw):
            if calls[0] % every == 0:
                time.sleep(delay_s)
            return step(*a, **kw)

        def counted(*a, **kw):
            calls[0] += 1
            return generate(*a, **kw)

        dec.runner.step, dec.generate = slow_step, counted
        return dec

    monkeypatch.setattr(stage, "build_decoder", slowed)


def _eval(ckpt, prompt_file, out):
    from headstart.eval.stage.evaluate import run

    return run(_cfg(ckpt, prompt_file, out))


def _ok_or_flagged(slowed: dict, clean: dict) -> bool:
    return bool(slowed["speedup_flags"]) or abs(slowed["speedup"] / clean["speedup"] - 1) <= 0.15


@pytest.mark.parametrize("delay_s, every", [(0.002, 1), (0.01, 3)])  # every verify late; one in three
def test_slowed_side_is_within_15_percent_or_flagged(
    ckpt, prompt_file, tmp_path, monkeypatch, delay_s, every
):
    clean = _eval(ckpt, prompt_file, tmp_path / "clean")
    _slow_spec(monkeypatch, delay_s, every)
    slowed = _eval(ckpt, prompt_file, tmp_path / "slowed")
    assert slowed["tau"] == clean["tau"]  # tau and acceptance do not depend on timing
    assert _ok_or_flagged(slowed, clean), (slowed["speedup"], clean["speedup"], slowed["timing"])
    if delay_s >= 0.002 and every == 1:  # every verify forward 2 ms late: several times the step's cost
        assert slowed["speedup_flags"] and "off_prediction" in slowed["speedup_flags"][0]
    md = (tmp_path / "slowed" / "report.md").read_text()
    assert "## Timing" in md and "threads" in md and "load average" in md
    assert ("**FLAGGED** (not used to rank)" in md) == bool(slowed["speedup_flags"])


def test_identical_checkpoints_agree_and_a_flagged_one_never_wins(prompt_file, tmp_path, monkeypatch):
    from headstart.eval.stage.evaluate import run

    run_dir = tmp_path / "run"
    first = save_ckpt(run_dir / "checkpoints" / "step_6" / "drafter")
    (run_dir / "checkpoints" / "step_12").mkdir(parents=True)
    save_ckpt(run_dir / "checkpoints" / "step_12" / "drafter")  # the same seed: identical weights
    summary = run(_cfg(run_dir, prompt_file, tmp_path / "out"))
    a, b = summary["checkpoints"]
    assert a["tau"] == b["tau"]
    # same weights: the speedups agree within their reported 95% CIs (the intervals overlap, up to 2%: the two are
    # timed in separate passes minutes apart, and the machine's drift between them is in neither interval; under
    # the full suite they once missed by 0.005 of 0.79)
    slack = 0.02 * max(a["speedup"], b["speedup"])
    assert (
        a["speedup_ci"][0] <= b["speedup_ci"][1] + slack and b["speedup_ci"][0] <= a["speedup_ci"][1] + slack
    ), (
        a,
        b,
    )
    _slow_spec(monkeypatch, 0.002, only="step_6")  # step_6's spec side runs under load; tau ties
    summary = run(_cfg(run_dir, prompt_file, tmp_path / "out2"))
    by_ckpt = {e["checkpoint"]: e for e in summary["checkpoints"]}
    assert by_ckpt[str(first)]["flags"] and not by_ckpt[str(first)]["best"]
    assert "**FLAGGED**" in (tmp_path / "out2" / "runs.md").read_text()
