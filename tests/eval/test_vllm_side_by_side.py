"""Side-by-side vLLM timing without vLLM: the interleaving (eval/serving/side_by_side.py), the K sweep that measures vLLM's
chain length in vLLM (eval/serving/k_sweep.py) and the serve check's flow (eval/serving/check.py), on a fake engine whose
step cost and acceptance per K are set by the test. The real engines run in the slow serve-check test."""

from __future__ import annotations

import json
import math
from contextlib import ExitStack

import pytest

from headstart.eval.serving import side_by_side as il
from headstart.models.decoding import read_decoding, read_decodings, write_decoding

pytestmark = pytest.mark.usefixtures("one_thread")


class FakeEngine:
    """A vLLM engine stand-in: every answer is `max_tokens` tokens (no EOS), the first from the prefill; a
    speculative engine with K drafts accepts ACCEPT[K] tokens a step and takes STEP_S[K] seconds a step (the
    prefill's time folded in), a plain one PLAIN_S a token."""

    PLAIN_S = 0.010
    STEP_S = {1: 0.011, 2: 0.012, 3: 0.016, 4: 0.020}  # 4: the ngram baseline's K
    ACCEPT = {1: 0.5, 2: 0.8, 3: 0.9, 4: 0.95}
    started: list[dict] = []
    alive = most_alive = 0

    def __init__(self, spec: dict, log_path=None, env=None) -> None:
        self.spec, self.log_path, self.startup_s = spec, log_path, 1.0
        self.k = (spec.get("speculative_config") or {}).get("num_speculative_tokens", 0)
        self.drafts = self.accepted = 0
        FakeEngine.started.append(spec)

    def generate(self, prompts, max_tokens, temperature=0.0, seeds=None, stop_token_ids=None):
        if not self.k:
            return {"outputs": [{"token_ids": [5] * max_tokens}], "time_s": max_tokens * self.PLAIN_S}
        steps = math.ceil((max_tokens - 1) / (1 + self.ACCEPT[self.k]))
        self.drafts += steps
        self.accepted += max_tokens - 1 - steps
        return {"outputs": [{"token_ids": [5] * max_tokens}], "time_s": steps * self.STEP_S[self.k]}

    def metrics(self):
        if not self.k:
            return []
        per_pos = [int(self.accepted * (0.9**i) / sum(0.9**j for j in range(self.k))) for i in range(self.k)]
        return [
            {"name": "vllm:spec_decode_num_drafts", "value": self.drafts},
            {"name": "vllm:spec_decode_num_draft_tokens", "value": self.drafts * self.k},
            {"name": "vllm:spec_decode_num_accepted_tokens", "value": self.accepted},
            {"name": "vllm:spec_decode_num_accepted_tokens_per_pos", "values": per_pos},
        ]

    def close(self) -> None:
        pass

    def __enter__(self):
        FakeEngine.alive += 1
        FakeEngine.most_alive = max(FakeEngine.most_alive, FakeEngine.alive)
        return self

    def __exit__(self, *exc) -> None:
        FakeEngine.alive -= 1


class Recorder:
    def __init__(self, name: str, log: list, settle_s: float = 0.0) -> None:
        self.name, self.log, self.settle_s = name, log, settle_s

    def warm_up(self, prompt):
        self.log.append(("warm", self.name))
        self.warmed_on = prompt

    def run(self, prompt, max_new):
        self.log.append((self.name, prompt[0]))
        return [1] * max_new, 0.5 * max_new


def test_every_prompt_runs_on_every_runner_in_a_rotating_order():
    log: list = []
    runners = {n: Recorder(n, log) for n in "abc"}
    done = []
    out = il.interleave(runners, [[0], [1], [2], [3]], 4, lambda i, n: done.append((i, n)))
    assert log[:3] == [("warm", "a"), ("warm", "b"), ("warm", "c")]  # every engine warm before any timing
    order = [name for name, _ in log[3:]]
    assert order == list("abc" + "bca" + "cab" + "abc")  # prompt i starts at runner i mod 3
    assert [p for _, p in log[3:]] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3  # one prompt at a time
    assert out["b"]["per_prompt"] == [(4, 2.0)] * 4 and out["c"]["outputs"][0] == [1] * 4
    assert done == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_the_warm_up_is_no_scored_prompt():
    """Suffix decoding caches every reply it gave: a warm-up on a scored prompt would draft that prompt's reply."""
    runners = {n: Recorder(n, []) for n in "ab"}
    prompts = [[7, 8, 9, 10], [1, 2]]
    il.interleave(runners, prompts, 2)
    assert all(r.warmed_on == [7, 8] and r.warmed_on not in prompts for r in runners.values())


def test_a_run_waits_for_the_previous_engine_to_settle(monkeypatch):
    """vLLM's worker busy-polls for 1 s after it answers: the next run (on any engine) starts after that."""
    slept, log = [], []
    monkeypatch.setattr(il.time, "sleep", slept.append)
    runners = {"vllm": Recorder("vllm", log, settle_s=1.2), "ours": Recorder("ours", log)}
    il.interleave(runners, [[0], [1]], 2)
    # before the first run: the warm-ups' settle; then after vllm 1.2, after ours 0
    assert [n for n, _ in log[2:]] == ["vllm", "ours", "ours", "vllm"]
    assert slept == [1.2, 1.2, 0.0, 0.0]


def test_engines_alive_together_share_the_memory_fraction(monkeypatch):
    import headstart.vllm_runner as vr

    monkeypatch.setattr(vr, "on_gpu", lambda: False)  # CPU: an explicit KV size, not a fraction of a node
    gib = 2**30
    assert vr.engine_spec("m")["kv_cache_memory_bytes"] == 3 * gib
    assert vr.engine_spec("m", engines=2)["kv_cache_memory_bytes"] == 3 * gib // 2
    assert vr.engine_spec("m", engines=8)["kv_cache_memory_bytes"] == gib // 2  # the floor
    assert "gpu_memory_utilization" not in vr.engine_spec("m")
    monkeypatch.setattr(vr, "on_gpu", lambda: True)
    spec = vr.engine_spec("m", engines=4)
    assert spec["gpu_memory_utilization"] == pytest.approx(0.2) and "kv_cache_memory_bytes" not in spec


# ---------------------------------------------------------------- the K sweep


@pytest.fixture
def medusa_ckpt(tmp_path):
    from headstart.models.backbone import BackboneConfig, load_backbone
    from headstart.models.checkpoint import build_drafter, save_drafter
    from headstart.models.medusa import MedusaConfig

    cfg = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 3})
    bb, mcfg = load_backbone(cfg), MedusaConfig(num_heads=3)
    return save_drafter(
        tmp_path / "run" / "drafter", build_drafter("medusa", mcfg, bb), "medusa", mcfg, cfg, bb
    )


@pytest.fixture
def fake_vllm(monkeypatch):
    import headstart.eval.serving.check as serving
    import headstart.eval.serving.k_sweep as vk
    import headstart.vllm_runner as vr

    FakeEngine.started, FakeEngine.alive, FakeEngine.most_alive = [], 0, 0
    monkeypatch.setattr(vr, "on_gpu", lambda: False)
    monkeypatch.setattr(il.VllmRunner, "settle_s", 0.0)  # a fake engine does not busy-poll
    monkeypatch.setattr(
        vr, "VllmEngine", FakeEngine
    )  # eval/serving/side_by_side.py's start_engines starts them
    for module in (vk, serving):
        monkeypatch.setattr(module, "served_model", lambda backbone: "converted-folder")
    return FakeEngine


def test_start_engines_shares_memory_and_tolerates_a_failed_layout_only_when_asked(
    fake_vllm, monkeypatch, tmp_path
):
    import headstart.vllm_runner as vr

    class Refusing(FakeEngine):
        def __init__(self, spec, log_path=None, env=None):
            if spec.get("speculative_config"):
                raise vr.VllmError("cannot load the layout")
            super().__init__(spec, log_path, env)

    monkeypatch.setattr(vr, "VllmEngine", Refusing)
    specs = {"vllm:plain": {}, "vllm:eagle3": {"speculative_config": {"method": "eagle3"}}}
    with ExitStack() as stack:
        engines, errors = il.start_engines(stack, "m", specs, 256, tmp_path, tolerate=True)
    assert list(engines) == ["vllm:plain"] and "cannot load" in errors["vllm:eagle3"]
    assert engines["vllm:plain"].log_path == tmp_path / "plain.log"
    assert fake_vllm.started[0]["kv_cache_memory_bytes"] == 3 * 2**30 // 2  # 2 engines' CPU share
    with ExitStack() as stack, pytest.raises(vr.VllmError, match="cannot load"):
        il.start_engines(stack, "m", specs, 256, tmp_path)


def _tuner_record(k: int = 3) -> dict:
    """A decoding.json as the tuner writes it (the fields the sweep and the exports read)."""
    return {
        "decoder": {"tree": [[0]]},
        "decoder_summary": {"verify_width": 2},
        "conditions": {"device": "cpu"},
        "acceptance": {"table": [[0.5], [0.4], [0.3]]},
        "vllm": {"num_speculative_tokens": k, "tokens_per_step": 1.9, "speedup": 1.4},
    }


def test_the_k_sweep_serves_every_k_side_by_side_and_keeps_the_fastest(medusa_ckpt, fake_vllm, tmp_path):
    from headstart.eval.serving.k_sweep import sweep

    sampled = _tuner_record(k=1)
    sampled["conditions"] = {"device": "cpu", "temperature": "sampled"}
    write_decoding(medusa_ckpt, sampled)  # another condition's record: the sweep (greedy) leaves it alone
    write_decoding(
        medusa_ckpt, _tuner_record(k=3) | {"conditions": {"device": "cpu", "temperature": "greedy"}}
    )
    report = sweep(medusa_ckpt, ["Say hi.", "Count to three."], tmp_path / "k", [1, 2, 3], max_new=30)
    # one plain engine and one per K, all started before the timing, sharing the memory
    assert len(fake_vllm.started) == 4 and fake_vllm.started[0].get("speculative_config") is None
    assert [s["speculative_config"]["num_speculative_tokens"] for s in fake_vllm.started[1:]] == [1, 2, 3]
    assert all(s["kv_cache_memory_bytes"] == 3 * 2**30 // 4 for s in fake_vllm.started)
    by_k = report["summary"]["by_k"]
    # K=2: 1.8 tokens a step at 12 ms vs plain 10 ms a token -> 1.5x; K=1 1.36x; K=3 1.19x
    steps = math.ceil(29 / 1.8)  # after the prefill's token
    assert by_k[2]["speedup"] == pytest.approx((30 / (steps * 0.012)) / 100)
    assert by_k[2]["tau"] == pytest.approx(29 / steps)
    assert by_k[2]["step_ms"] == pytest.approx(12.0)
    assert by_k[1]["speedup"] < by_k[2]["speedup"] and by_k[3]["speedup"] < by_k[2]["speedup"]
    # the table's prediction at vLLM's own step costs: chain of 2 expects 1 + 0.5 + 0.5 * 0.4 = 1.7 tokens
    assert by_k[2]["predicted_tau"] == pytest.approx(1.7)
    assert by_k[2]["predicted_speedup"] == pytest.approx(1.7 * 10.0 / 12.0)
    assert report["chosen"] == 2 and report["tuner_k"] == 3 and report["written"]
    saved = read_decoding(medusa_ckpt)["vllm"]
    assert saved["num_speculative_tokens"] == 2 and saved["source"] == "vllm"
    assert saved["tuner"]["num_speculative_tokens"] == 3 and set(saved["sweep"]) == {"1", "2", "3"}
    assert read_decodings(medusa_ckpt)[0] == sampled
    md = (tmp_path / "k" / "vllm_k.md").read_text()
    assert "Chosen: K = 2 (written to decoding.json); the tuner had predicted K = 3" in md
    assert "The drafter's decoding.json record for greedy on cpu: greedy, cpu" in md
    assert json.loads((tmp_path / "k" / "vllm_k.json").read_text())["chosen"] == 2


def test_exports_and_cards_follow_the_k_vllm_chose(medusa_ckpt, fake_vllm, tmp_path):
    from headstart.eval.serving.k_sweep import sweep
    from headstart.models.export import export

    write_decoding(medusa_ckpt, _tuner_record(k=3))
    sweep(medusa_ckpt, ["Say hi."], tmp_path / "k", [1, 2], max_new=20)
    (folder,) = export(medusa_ckpt, tmp_path / "out", ["vllm"])
    assert json.loads((folder / "config.json").read_text())["num_heads"] == 2
    card = (folder / "README.md").read_text()
    assert '"num_speculative_tokens": 2' in card and "was the fastest of K = 1, 2 measured in vLLM" in card
    assert str(tmp_path) not in card  # nothing published carries a local path


def test_no_decoding_json_reports_without_writing(medusa_ckpt, fake_vllm, tmp_path):
    from headstart.eval.serving.k_sweep import sweep

    report = sweep(medusa_ckpt, ["Say hi."], tmp_path / "k", [1, 2], max_new=20)
    assert report["chosen"] == 2 and not report["written"] and read_decoding(medusa_ckpt) is None
    assert report["summary"]["by_k"][1]["predicted_speedup"] is None  # no acceptance table to predict from
    with pytest.raises(ValueError, match="chain lengths >= 1"):
        sweep(medusa_ckpt, ["Say hi."], tmp_path / "k", [0, 1], max_new=20)
    with pytest.raises(ValueError, match="at most 3 tokens. Fix: --ks 1..3"):
        sweep(medusa_ckpt, ["Say hi."], tmp_path / "k", [2, 4], max_new=20)


def test_the_tuner_keeps_a_k_vllm_measured_for_the_same_weights_and_device():
    from headstart.eval.tuning.records import measured_k

    new = {"conditions": {"weights": "w1", "device_name": "cpu-x"}, "vllm": {"num_speculative_tokens": 3}}
    old = {"vllm": {"num_speculative_tokens": 2, "source": "vllm", "weights": "w1", "device_name": "cpu-x"}}
    kept = measured_k([old], new)
    assert kept["num_speculative_tokens"] == 2 and kept["tuner"] == {"num_speculative_tokens": 3}
    assert measured_k([{"vllm": {**old["vllm"], "weights": "w2"}}], new) is None  # retrained heads
    assert measured_k([{"vllm": {**old["vllm"], "device_name": "gpu"}}], new) is None  # another device
    assert measured_k([{"vllm": {"num_speculative_tokens": 2}}], new) is None  # the tuner's own prediction
    assert measured_k([], new) is None


# ---------------------------------------------------------------- the serve check's flow


def test_the_serve_check_starts_every_engine_first_and_interleaves(medusa_ckpt, fake_vllm, tmp_path):
    from headstart.eval.serving.check import serve_check

    questions = ["Say hi.", "Count to three.", "Name a colour.", "Add 2 and 2."]
    # K from the record for its use (greedy, on this CPU), not the sampled one written after it
    write_decoding(
        medusa_ckpt, _tuner_record(k=2) | {"conditions": {"device": "cpu", "temperature": "greedy"}}
    )
    write_decoding(
        medusa_ckpt, _tuner_record(k=1) | {"conditions": {"device": "cpu", "temperature": "sampled"}}
    )
    report = serve_check(medusa_ckpt, questions, tmp_path / "sc", max_new=12, categories=["a", "a", "b", "b"])
    assert report["decoding_record"].startswith("decoding.json record for greedy on cpu: greedy, cpu")
    # vLLM plain, the Medusa vLLM layout and ngram, alive together
    kinds = [(s.get("speculative_config") or {}).get("method") for s in fake_vllm.started]
    assert kinds == [None, "medusa", "ngram"] and all(
        s["kv_cache_memory_bytes"] == 2**30 for s in fake_vllm.started
    )
    assert report["timing"] == "interleaved" and report["k"] == 2
    (row,) = report["layouts"]
    # 11 tokens after the prefill's in ceil(11 / 1.8) = 7 forwards
    assert row["vllm"]["loaded"] and row["vllm"]["tau"] == pytest.approx(11 / 7)
    assert len(row["vllm"]["per_prompt"]) == 4 and len(row["ours"]["per_prompt"]) == 4
    b = report["baselines"]
    assert set(b["speedup"]) == {"vllm:medusa-vllm", "vllm:ngram", "ours:drafter", "ours:prompt_lookup"}
    assert b["speedup"]["vllm:medusa-vllm"]["all"] == pytest.approx((12 / (7 * 0.012)) / 100)
    assert "Timed side by side" in (tmp_path / "sc" / "serve_check.md").read_text()


def test_one_engine_at_a_time_runs_each_alone_with_the_whole_memory_share(medusa_ckpt, fake_vllm, tmp_path):
    """For a pair that does not fit in memory three times over: each vLLM engine started alone after ours ran,
    with the memory a single engine gets; the same runs and counters come back, and the report says how it was
    timed."""
    from headstart.eval.serving.check import serve_check

    questions = ["Say hi.", "Count to three.", "Name a colour.", "Add 2 and 2."]
    write_decoding(
        medusa_ckpt, _tuner_record(k=2) | {"conditions": {"device": "cpu", "temperature": "greedy"}}
    )
    report = serve_check(medusa_ckpt, questions, tmp_path / "sc", max_new=12, categories=["a", "a", "b", "b"],
                         one_at_a_time=True)  # fmt: skip
    kinds = [(s.get("speculative_config") or {}).get("method") for s in fake_vllm.started]
    assert kinds == [None, "medusa", "ngram"] and fake_vllm.most_alive == 1
    assert all(s["kv_cache_memory_bytes"] == 3 * 2**30 for s in fake_vllm.started)  # one engine's share
    assert report["timing"] == "one at a time"
    (row,) = report["layouts"]
    assert row["vllm"]["loaded"] and row["vllm"]["tau"] == pytest.approx(11 / 7)
    assert len(row["vllm"]["per_prompt"]) == 4 and len(row["ours"]["per_prompt"]) == 4
    assert report["baselines"]["speedup"]["vllm:ngram"]["all"] > 0
    assert "Timed one engine at a time" in (tmp_path / "sc" / "serve_check.md").read_text()
