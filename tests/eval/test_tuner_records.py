"""The tuner's records and what it tunes on: one decoding.json record per condition (models/decoding.py,
eval/tuning/records.py), tuning prompts apart from the scored ones (eval/tuning/prompts.py), the thread count as
a setting rather than the load at start, and plain decoding chosen when no setting pays."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from headstart.eval.engine.proposers.base import Setting
from headstart.eval.engine.tree import chain_tree
from headstart.eval.timing import harness
from headstart.eval.tuning import tuner as tuner_module
from headstart.eval.tuning.records import planned_threads
from headstart.eval.tuning.tuner import PLAIN, SPECULATE, TunerConfig, decide
from headstart.models.decoding import (
    DECODING_NAME,
    condition_of,
    pick,
    read_decoding,
    read_decodings,
    write_decoding,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _rec(temp: str | None, device: str, tree, version: int = 4, **extra) -> dict:
    cond = {"device": device, "dtype": "float32", "threads": 2, "weights": "w1"}
    cond |= {"temperature": temp} if temp else {}
    return {"version": version, "decoder": {"tree": tree}, "conditions": cond, **extra}


# ---------------------------------------------------------------- the file: records by condition


def test_records_add_per_condition_and_replace_only_their_own(tmp_path):
    greedy, sampled = _rec("greedy", "cpu", [[0]]), _rec("sampled", "cpu", [[0], [1]])
    write_decoding(tmp_path, greedy)
    write_decoding(tmp_path, sampled)
    assert read_decodings(tmp_path) == [greedy, sampled]  # the sampled eval did not overwrite the greedy one
    newer = _rec("greedy", "cpu", [[1]])
    write_decoding(tmp_path, newer)  # the same condition: replaced, the other kept
    assert read_decodings(tmp_path) == [sampled, newer]
    assert json.loads((tmp_path / DECODING_NAME).read_text())["format"] == 2
    # retrained weights: records of the old weights can never match again and are dropped
    retrained = _rec("greedy", "cpu", [[2]])
    retrained["conditions"]["weights"] = "w2"
    write_decoding(tmp_path, retrained)
    assert read_decodings(tmp_path) == [retrained]


def test_a_single_record_file_still_reads_and_migrates_on_the_next_write(tmp_path):
    old = {"version": 3, "decoder": {"tree": [[0]]}, "conditions": {"device": "cpu", "weights": "w1"}}
    (tmp_path / DECODING_NAME).write_text(json.dumps(old))
    assert read_decodings(tmp_path) == [old] and read_decoding(tmp_path) == old
    assert condition_of(old)[2:4] == ("unknown", "cpu")  # its temperature class was never recorded
    write_decoding(tmp_path, _rec("greedy", "cpu", [[1]]))
    data = json.loads((tmp_path / DECODING_NAME).read_text())
    assert data["format"] == 2 and [r["version"] for r in data["records"]] == [3, 4]


def test_readers_pick_the_record_for_their_use_and_say_which():
    cpu_greedy, gpu_greedy = _rec("greedy", "cpu", [[0]]), _rec("greedy", "cuda", [[0], [1]])
    cpu_sampled, legacy = _rec("sampled", "cpu", [[1]]), _rec(None, "cpu", [[2]], version=3)
    records = [cpu_greedy, gpu_greedy, cpu_sampled, legacy]
    p = pick(records, greedy=True, device="cuda")
    assert (
        p.record is gpu_greedy and p.exact and p.note.startswith("decoding.json record for greedy on cuda:")
    )
    assert pick(records, greedy=True, device="cpu").record is cpu_greedy
    assert pick(records, greedy=False, device="cpu").record is cpu_sampled
    # no sampled record on cuda: the sampled one elsewhere before a greedy one on the device, and said
    p = pick(records, greedy=False, device="cuda")
    assert (
        p.record is cpu_sampled
        and not p.exact
        and p.note.startswith("no decoding.json record for sampled on cuda")
    )
    # only a record whose class was not kept: used, named as such
    p = pick([legacy], greedy=True, device="cpu")
    assert p.record is legacy and not p.exact and "temperature not recorded" in p.note
    assert pick([], greedy=True) is None
    # an eager decoder takes the newest eager record over a newer compiled one (priced for other kernels)
    eager = _rec("greedy", "cpu", [[0], [0, 0]])
    compiled = _rec("greedy", "cpu", [[0]])
    compiled["conditions"]["compiled"] = True
    assert pick([eager, compiled], greedy=True, device="cpu", compiled=False).record is eager
    assert pick([eager, compiled], greedy=True, device="cpu", compiled=True).record is compiled
    assert pick([eager, compiled], greedy=True, device="cpu").record is compiled  # unsaid: the newest


# ---------------------------------------------------------------- the decision to speculate


def _ranked(*speedups: float) -> list:
    return [(Setting({"tree": [[0]]}, chain_tree(1), "d"), {"speedup": s}) for s in speedups]


def test_plain_is_chosen_when_nothing_is_predicted_faster_and_said():
    choice, reason = decide(_ranked(0.93, 0.8))
    assert choice == PLAIN and "no setting is predicted faster than plain decoding" in reason
    assert "best of 2" in reason and "0.930x" in reason
    assert decide(_ranked(1.0))[0] == PLAIN  # as fast is not faster: nothing to gain
    assert decide(_ranked(1.2, 0.9)) == (SPECULATE, "predicted 1.200x over plain decoding")


def test_speculation_must_be_predicted_min_gain_faster():
    choice, reason = decide(_ranked(1.05), min_gain=0.10)
    assert (
        choice == PLAIN and "10% faster than plain decoding (tuner.min_gain)" in reason and "1.050x" in reason
    )
    assert decide(_ranked(1.12), min_gain=0.10)[0] == SPECULATE
    with pytest.raises(ValueError, match=r"tuner.min_gain=1.5: expected in \[0, 1\)"):
        TunerConfig(min_gain=1.5)


def test_a_reused_record_is_decided_under_this_evals_min_gain():
    """A record tuned before min_gain (or under another) is re-decided from its prediction, never ignored."""
    from headstart.eval.tuning.records import redecide

    old = {"choice": SPECULATE, "choice_reason": "predicted 1.050x", "predicted": {"speedup": 1.05},
           "decoder_summary": {"nodes": 3}}  # fmt: skip
    assert redecide(old, 0.10)["choice"] == PLAIN and redecide(old, 0.10)["min_gain"] == 0.10
    assert redecide(old, 0.0)["choice"] == SPECULATE and old["choice"] == SPECULATE  # a copy, not the record
    same = old | {"min_gain": 0.10}
    assert redecide(same, 0.10) is same


# ---------------------------------------------------------------- the eval stage (tiny backbone)


@pytest.fixture
def ckpt(tmp_path):
    """A fresh 2-head Medusa checkpoint on a tiny backbone whose drafts are sometimes accepted."""
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import build_drafter, save_drafter
    from headstart.models.medusa import MedusaConfig

    cfg = BackboneConfig(
        name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2}
    )
    bb, mcfg = load_backbone(cfg), MedusaConfig(num_heads=2)
    return save_drafter(tmp_path / "drafter", build_drafter("medusa", mcfg, bb), "medusa", mcfg, cfg, bb)


def _prompts(path, texts):
    rows = [{"question_id": i, "category": "c", "turns": [t]} for i, t in enumerate(texts)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def scored(tmp_path):
    return _prompts(tmp_path / "scored.jsonl", ["Say hi.", "def f(x):"])


@pytest.fixture
def tuning(tmp_path):
    return _prompts(tmp_path / "tuning.jsonl", ["Count to five.", "Name a colour.", "class A:"])


def _eval(ckpt, prompts, out, tuning=None, tuner: dict | None = None, timing_threads: int = 1, **kw):
    """One eval of the tiny checkpoint, tuned on `tuning` (default: the shipped tuning prompts) for one thread
    unless `tuner` says otherwise; the timing on `timing_threads` (0: the harness's own choice)."""
    from headstart.eval.stage.config import EvalConfig
    from headstart.eval.stage.evaluate import run
    from headstart.eval.timing.harness import TimingConfig

    tuner = (
        {"reps": 3, "probe_tokens": 16, "threads": 1}
        | ({"prompts": str(tuning)} if tuning else {})
        | (tuner or {})
    )
    cfg = EvalConfig(checkpoint=str(ckpt), prompts=str(prompts), out_dir=str(out), max_new_tokens=8, device="cpu",
                     dtype="float32", timing=TimingConfig(budget_s=0, cost_reps=3, threads=timing_threads),
                     tuner=TunerConfig(**tuner), **kw)  # fmt: skip
    return run(cfg)


def test_two_temperatures_leave_two_records_and_each_reuses_its_own(ckpt, scored, tuning, tmp_path):
    greedy = _eval(ckpt, scored, tmp_path / "g1", tuning)["decoding"]
    sampled = _eval(ckpt, scored, tmp_path / "s1", tuning, temperature=0.7)["decoding"]
    assert greedy["reused"] is False and sampled["reused"] is False
    records = read_decodings(ckpt)
    assert [r["conditions"]["temperature"] for r in records] == ["greedy", "sampled"]
    assert records[1]["sampling"] == {"temperature": 0.7, "top_p": 1.0}
    # the sampled probe measures acceptance at its temperature (the heads' table is a greedy figure)
    assert records[1]["acceptance"]["source"] == "measured"
    again_g = _eval(ckpt, scored, tmp_path / "g2", tuning)["decoding"]
    again_s = _eval(ckpt, scored, tmp_path / "s2", tuning, temperature=0.7)["decoding"]
    assert again_g["reused"] is True and again_g["record"] == greedy["record"]
    assert again_s["reused"] is True and again_s["record"] == sampled["record"]
    assert again_g["record"].startswith("greedy, cpu") and again_s["record"].startswith("sampled, cpu")
    assert len(read_decodings(ckpt)) == 2
    md = (tmp_path / "s2" / "report.md").read_text()
    assert f"- tuner record: {sampled['record']} (reused from decoding.json; probe on 3 prompts of" in md


def test_tuning_on_scored_prompts_is_refused_and_never_reused_for_them(ckpt, scored, tuning, tmp_path):
    from headstart.eval.errors import EvalError

    with pytest.raises(EvalError, match=r"tuner.prompts=.*scored.jsonl shares 2 of its 2 probe prompts.*Fix"):
        _eval(ckpt, scored, tmp_path / "a", scored)
    # overlap by text, whatever the file: the same prompt with other spacing in another file
    _prompts(tmp_path / "copy.jsonl", ["Name a colour.", "Say   hi. "])
    with pytest.raises(EvalError, match="shares 1 of its 2 probe prompts"):
        _eval(ckpt, scored, tmp_path / "b", tmp_path / "copy.jsonl")
    # a record tuned on prompts this eval now scores is not reused: it is tuned again on the tuning set
    first = _eval(ckpt, scored, tmp_path / "c", tuning)["decoding"]
    assert first["reused"] is False and first["tuning_prompts"] == {"file": str(tuning), "n": 3}
    swapped = _eval(ckpt, tuning, tmp_path / "d", scored)["decoding"]
    assert swapped["reused"] is False and swapped["tuning_prompts"]["file"] == str(scored)


def test_the_default_tuning_prompts_share_nothing_with_the_default_scored_ones():
    from headstart.eval.stage.config import DEFAULT_PROMPTS
    from headstart.eval.stage.prompts import load_prompts
    from headstart.eval.tuning.prompts import DEFAULT_TUNING_PROMPTS, normalise, shared_texts

    assert TunerConfig().prompts == DEFAULT_TUNING_PROMPTS != DEFAULT_PROMPTS
    texts = [normalise(t) for p in load_prompts(DEFAULT_TUNING_PROMPTS).prompts for t in p.turns]
    assert len(texts) >= TunerConfig().probe_prompts
    assert shared_texts(texts, load_prompts(["dev", "spec_bench"])) == []
    # every category scored by the shipped sets is probed by some tuning prompt
    assert set(load_prompts(["dev", "spec_bench"]).categories) <= set(
        load_prompts(DEFAULT_TUNING_PROMPTS).categories
    )


@pytest.fixture
def two_threads():
    """torch's count as on an idle 2-core machine (the module otherwise runs on one thread)."""
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


@pytest.mark.usefixtures("two_threads")
def test_a_busy_machine_at_start_does_not_change_the_tree(ckpt, scored, tuning, tmp_path, monkeypatch):
    """tuner.threads=0 plans for torch's count (the machine's cores): a busy start (mocked load) neither
    re-tunes nor changes the choice the idle machine made, while the timing harness still picks its own count
    for the timing."""
    monkeypatch.setattr(harness, "usable_cores", lambda: 2)
    monkeypatch.setattr(harness, "busy_cores", lambda *a: 0.0)
    idle = _eval(ckpt, scored, tmp_path / "idle", tuning, tuner={"threads": 0, "probe_prompts": 2})
    monkeypatch.setattr(harness, "busy_cores", lambda *a: 1.9)  # another job holds nearly both cores
    assert planned_threads(TunerConfig()) == 2 and harness.choose_threads(0) == 1
    torch.set_num_threads(2)  # choose_threads set it: back to torch's count, as a fresh process has it
    busy = _eval(
        ckpt, scored, tmp_path / "busy", tuning, tuner={"threads": 0, "probe_prompts": 2}, timing_threads=0
    )
    assert idle["decoding"]["planned_threads"] == busy["decoding"]["planned_threads"] == 2
    assert busy["decoding"]["reused"] is True and busy["decoding"]["options"] == idle["decoding"]["options"]
    assert busy["timing"]["conditions"]["threads_chosen"] == 1  # the timing's own policy, load-aware
    assert len(read_decodings(ckpt)) == 1


def test_when_nothing_pays_plain_decoding_is_chosen_said_and_decoded(
    ckpt, scored, tuning, tmp_path, monkeypatch, caplog
):
    """Every width above 1 made 100x dearer than one token: no setting is predicted >= 1x, so the record says
    plain, the eval decodes plainly (tau 1) and the report's headline and the log say so in one line."""
    real = tuner_module.step_costs

    def dear(*args, **kw):
        return {w: t if int(w) == 1 else 100 * t for w, t in real(*args, **kw).items()}

    from headstart.eval.tuning import confirm

    def dear_decoded(decoders, *args, **kw):  # the finalists decoded too, at the same prices
        return {k: 0.01 if k == "plain" else 1.0 for k in decoders}

    monkeypatch.setattr(tuner_module, "step_costs", dear)
    monkeypatch.setattr(confirm, "decoded_costs", dear_decoded)
    with caplog.at_level(logging.WARNING, logger="headstart.eval"):
        report = _eval(ckpt, scored, tmp_path / "a", tuning, lookup_tokens=2)
    d = report["decoding"]
    assert d["choice"] == PLAIN and d["options"] == {} and d["declined_options"]["verify_width"] > 1
    assert d["predicted_speedup"] == 1.0 and d["predicted_speedup_best_setting"] < 1.0
    assert report["tau"] == pytest.approx(1.0) and report["greedy_matches_vanilla"] == 1.0
    assert "lookup_branch" not in d  # the branch rides on the tree: no tree, no branch
    assert report["headline"].startswith(
        "Speculation does not pay here: plain decoding chosen (no setting is"
    )
    md = (tmp_path / "a" / "report.md").read_text()
    assert (
        f"**{report['headline']}**" in md and "- plain decoding, the drafter unused (chosen by: tuner)" in md
    )
    said = [r.message for r in caplog.records if "speculation does not pay" in r.message]
    assert len(said) == 1 and "plain decoding chosen" in said[0]
    assert read_decoding(ckpt)["choice"] == PLAIN


def test_compiled_steps_are_priced_compiled_and_kept_apart(
    ckpt, scored, tuning, tmp_path, monkeypatch, made_runners
):
    """compile=max-autotune: the tuner times the verify widths on compiled steps (fewer widths, up to 8 unless
    tuner.max_width says more: each compiles once) over the eval's own cache length, so the eval reuses those graphs; the record says compiled and an
    eager eval tunes its own. `torch.compile` is replaced by the plain function (the compiled path runs fast)."""
    from headstart.eval.engine import compiled

    monkeypatch.setattr(compiled, "compiled_step", lambda device: compiled._step)
    report = _eval(ckpt, scored, tmp_path / "c", tuning, compile="max-autotune", max_cache_len=512)
    record = read_decodings(ckpt)[0]
    assert record["conditions"]["compiled"] is True and record["acceptance"]["probe"]["compiled"] is True
    timed = sorted(map(int, record["acceptance"]["probe"]["verify_s_as_timed"]))
    assert timed == [1, 2, 4, 8]
    assert {r.cache.max_cache_len for r in made_runners if r.compiled} == {
        512
    }  # the tuner's runner and the eval's
    assert "compiled steps" in report["decoding"]["record"]
    eager = _eval(ckpt, scored, tmp_path / "e", tuning, max_cache_len=512)["decoding"]
    assert eager["reused"] is False and [r["conditions"]["compiled"] for r in read_decodings(ckpt)] == [
        True,
        False,
    ]


def test_a_record_tuned_with_out_names_the_weights_and_is_reused_beside_them(ckpt, scored, tuning, tmp_path):
    """`eval/tune.py --out`: nothing read or written beside the checkpoint, and the record written elsewhere is
    valid for it (it named no weights before, so a copy beside the checkpoint was never reused)."""
    import shutil

    from headstart.eval.tune import main as tune_main
    from headstart.models.checkpoint import weights_signature

    out = tmp_path / "tuned"
    tune_main(["--checkpoint", str(ckpt), "--out", str(out), "--prompts", str(tuning), "--threads", "1",
               "--reps", "3", "--dtype", "float32", "--device", "cpu",
               "--eval-prompts", str(scored), "--max-new-tokens", "8"])  # fmt: skip
    assert not (ckpt / "decoding.json").exists()
    (record,) = read_decodings(out)
    assert record["conditions"]["workload"]  # priced at the eval's lengths, so the eval's condition
    assert record["conditions"]["weights"] == weights_signature(ckpt)
    shutil.copy(out / "decoding.json", ckpt / "decoding.json")
    assert _eval(ckpt, scored, tmp_path / "e", tuning)["decoding"]["reused"] is True
