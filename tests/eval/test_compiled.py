"""The compiled decoder (eval/engine/compiled.py): modes resolve or fail in one line, and fp32 greedy decoding
through the compiled plain and verify steps equals eager vanilla, token for token."""

from __future__ import annotations

import pytest
import torch

from headstart.eval.engine import compiled
from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
from headstart.eval.engine.runner import ModelRunner
from headstart.models.backbone import BackboneConfig, load_backbone
from tests.conftest import tiny_backbone

# a compiled width that falls back to eager would pass every equality check below while testing nothing
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("error:compilation failed")]


def test_modes_resolve():
    cpu = torch.device("cpu")
    assert compiled.resolve("eager", cpu) is False
    assert compiled.resolve("auto", torch.device("meta")) is False  # nothing compiles there: eager, said once
    with pytest.raises(ValueError, match=r"compile=max-autotune on meta: .*Fix: compile=eager"):
        compiled.resolve("max-autotune", torch.device("meta"))
    with pytest.raises(ValueError, match=r"compile='fast': expected one of .*Fix: compile=eager"):
        Decoder(tiny_backbone(), compile="fast")


def test_the_hardware_mode_follows_the_compute_dtype():
    """compile=hardware: compiled where eager verify steps cost several plain steps (float32 on a CPU), eager where
    they cost about one (native bf16 on a CPU) and where compiling was not measured (CUDA); each with its reason."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compiled.for_hardware(cpu, "float32")[0] == "auto"
    assert compiled.for_hardware(cpu, "bfloat16")[0] == "eager"
    assert compiled.for_hardware(cuda, "float32")[0] == compiled.for_hardware(cuda, "bfloat16")[0] == "eager"
    assert all(compiled.for_hardware(d, t)[1] for d in (cpu, cuda) for t in ("float32", "bfloat16"))
    # graphs that would not fit: every graph keeps a prepacked copy of the weights (Qwen2.5-Coder-0.5B float32:
    # 2 GB of weights, ~34 GB of graphs on a 24 GB machine); SmolLM2's 0.54 GB fit
    gb = 10**9
    mode, reason = compiled.for_hardware(cpu, "float32", 2 * gb, available=22 * gb)
    assert mode == "eager" and "34 GB" in reason and "22 GB available" in reason
    assert compiled.for_hardware(cpu, "float32", int(0.54 * gb), available=22 * gb)[0] == "auto"
    # the eval resolves it first: a Decoder takes the mode it chose
    with pytest.raises(ValueError, match=r"compile='hardware': expected one of"):
        Decoder(tiny_backbone(), compile="hardware")


def test_unavailable_without_compiler(monkeypatch):
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    assert compiled.unavailable(torch.device("cpu")) == "no C++ compiler"
    assert compiled.resolve("auto", torch.device("cpu")) is False
    with pytest.raises(ValueError, match=r"no C\+\+ compiler"):
        compiled.resolve("max-autotune", torch.device("cpu"))


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path))
    assert compiled.cache_dir() == tmp_path / "inductor"
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what inductor writes there itself
    assert compiled.cache_dir() == tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiled.cache_dir() == tmp_path / "mine"  # the user's setting wins


def test_cpu_options_freeze_weights():
    opts = compiled.inductor_options(torch.device("cpu"))
    assert opts["freezing"] and opts["max_autotune"] and not opts.get("triton.cudagraphs")
    assert "freezing" not in compiled.inductor_options(torch.device("cuda"))


def test_widths_outside_the_set_run_eagerly():
    runner = ModelRunner(tiny_backbone(), 32, compile="max-autotune", compile_widths={1, 4})
    assert runner.fixed_shapes and runner.compiles(4) and not runner.compiles(3)
    assert not ModelRunner(tiny_backbone(), 32).fixed_shapes


def _prompts(backbone) -> list[list[int]]:
    tok = backbone.tokenizer
    texts = ["the cat sat on the mat and the cat sat", "1 2 3 4 1 2 3 4 1 2", "abcabcabcabc hello"]
    return [tok(t)["input_ids"] for t in texts]


@pytest.mark.slow
def test_compiled_greedy_equals_eager_vanilla():
    """Compiles widths 1 (plain), 5 (prompt lookup's 4 tokens + root) and Lookahead's of a 2-layer model: about
    a minute each on a busy 2-core CPU, seconds once inductor's disk cache holds them."""
    backbone = tiny_backbone(initializer_range=0.1)
    eager = Decoder(backbone, max_cache_len=128)
    plain = Decoder(backbone, compile="max-autotune", max_cache_len=128)
    lookup = Decoder(
        backbone, PromptLookupOptions(num_draft_tokens=4), compile="max-autotune", max_cache_len=128
    )
    for prompt in _prompts(backbone):
        ref = eager.generate(prompt, 24, eos_token_ids=[]).tokens
        assert plain.generate(prompt, 24, eos_token_ids=[]).tokens == ref
        out = lookup.generate(prompt, 24, eos_token_ids=[])
        assert out.tokens == ref
    # (width, last_only, cache slots attended: the prefix rounded up to 64 slots)
    assert {k[:2] for k in plain.runner._graphs} == {(1, True)}
    assert {k[:2] for k in lookup.runner._graphs} == {(1, True), (5, False)}  # misses: width 1, else padded
    assert {k[2] for k in [*plain.runner._graphs, *lookup.runner._graphs]} <= {64, 128}
    for step in [*plain.runner._graphs.values(), *lookup.runner._graphs.values()]:
        assert step is not None and step.forward != step.runner._forward  # compiled, not an eager fallback
    assert max(out.stats.accepted_per_step) > 1  # the verify width really accepted drafts
    # Lookahead (the main job's baseline, compiled where the eval is): its one fixed width, compiled, lossless
    lookahead = build_decoder("lookahead", backbone, None, compile="max-autotune", max_cache_len=128)
    for prompt in _prompts(backbone):
        assert (
            lookahead.generate(prompt, 24, eos_token_ids=[]).tokens
            == eager.generate(prompt, 24, eos_token_ids=[]).tokens
        )
    ((width, last_only),) = {k[:2] for k in lookahead.runner._graphs}
    assert width == lookahead.proposer.width > 1 and not last_only
    # a second decoder over the same backbone reuses the graphs: no new compilation
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    again = Decoder(backbone, compile="max-autotune", max_cache_len=128)
    prompt = _prompts(backbone)[0]
    assert (
        again.generate(prompt, 8, eos_token_ids=[]).tokens
        == eager.generate(prompt, 8, eos_token_ids=[]).tokens
    )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before


@pytest.mark.slow
def test_compiled_steps_cross_cache_lengths():
    """A compiled step attends over the prefix rounded up to 64 slots (eval/engine/runner.py): a decode from 248
    to 264 cached positions steps over 256 slots, then 320, through one compiled graph whose attended length is
    dynamic, and equals eager vanilla token for token; so does a decode over the whole cache."""
    backbone = tiny_backbone(initializer_range=0.1, seed=3)  # its own backbone: graphs of no other test
    compiled_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for n, new, buckets in ((248, 16, {256, 320}), (1010, 8, {1024})):
        prompt = [(7 * i) % 250 + 3 for i in range(n)]
        ref = Decoder(backbone, max_cache_len=1024).generate(prompt, new, eos_token_ids=[]).tokens
        plain = Decoder(backbone, compile="max-autotune", max_cache_len=1024)
        assert plain.generate(prompt, new, eos_token_ids=[]).tokens == ref
        assert set(plain.runner._graphs) == {(1, True, b) for b in buckets}
        assert all(
            step is not None and step.forward != step.runner._forward
            for step in plain.runner._graphs.values()
        )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled_graphs + 1


@pytest.mark.slow
def test_the_evals_step_costs_reuse_the_decoders_graphs():
    """The eval prices its steps (eval/timing/bounds.py) on a runner of its own after the decodes: built and
    stepped as a decoder's is, its steps reuse the compiled graphs (under no_grad rather than inference mode
    their inputs' dispatch keys differed, and every width was compiled a second time, ~1 GB each)."""
    from headstart.eval.timing.bounds import step_costs

    backbone = tiny_backbone(initializer_range=0.1, seed=4)  # its own backbone: graphs of no other test
    prompt = [(7 * i) % 250 + 3 for i in range(300)]
    Decoder(backbone, compile="max-autotune", max_cache_len=1024).generate(prompt, 8, eos_token_ids=[])
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    costs = step_costs(backbone, {"vanilla": (1, None)}, prompt[:200], 2, {"vanilla": True}, 1024)
    assert costs["vanilla"] > 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_compiled_path_keeps_windows_and_soft_caps(family, monkeypatch):
    """The compiled step applies what the eager one does: sliding-window masks (Mistral on every layer, Gemma-2
    on every other) and Gemma-2's final logit soft cap. `torch.compile` is replaced by the plain function, so
    the compiled path's own code runs (fast) and greedy prompt lookup past the window equals eager vanilla."""
    monkeypatch.setattr(compiled, "compiled_step", lambda device: compiled._step)
    attn = "eager" if family == "gemma2" else "sdpa"
    backbone = load_backbone(
        BackboneConfig(name="tiny", path="tiny", dtype="float32", attn_implementation=attn,
                       tiny={"seed": 0, "family": family, "initializer_range": 0.1})
    )  # fmt: skip
    eager = Decoder(backbone, max_cache_len=128)
    lookup = Decoder(
        backbone, PromptLookupOptions(num_draft_tokens=4), compile="max-autotune", max_cache_len=128
    )
    for prompt in _prompts(backbone):
        assert (
            lookup.generate(prompt, 24, eos_token_ids=[]).tokens
            == eager.generate(prompt, 24, eos_token_ids=[]).tokens
        )
    assert all(step is not None for step in lookup.runner._graphs.values()) and lookup.runner._graphs


def test_eval_config_refuses_an_unknown_mode(tmp_path):
    from headstart.eval.errors import EvalError
    from tests.eval.test_eval_stage import _cfg

    with pytest.raises(EvalError, match=r"compile='fast': expected one of .*Fix: compile=eager"):
        _cfg(tmp_path / "drafter", tmp_path / "p.jsonl", tmp_path / "out", compile="fast")


def test_eval_stage_times_vanilla_compiled_and_eager(tmp_path, monkeypatch):
    """compile=max-autotune: vanilla and the drafter run the compiled path, an eager vanilla runs in the same
    rounds, and the report gives the speedup over both. `torch.compile` itself is replaced by the plain function
    (the fixed-shape path runs, nothing is compiled) so that this stays fast; compiled kernels are checked above."""
    import json

    from headstart.eval.stage.evaluate import EAGER_VANILLA, run
    from tests.eval.test_eval_stage import _cfg, save_ckpt

    monkeypatch.setattr(compiled, "compiled_step", lambda device: compiled._step)
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"question_id": i, "category": c, "turns": [t]}
        for i, (c, t) in enumerate([("a", "Say hi."), ("b", "x")])
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    cfg = _cfg(save_ckpt(tmp_path / "drafter"), prompts, out, warmup=0, compile="max-autotune")
    report = run(cfg)
    eager = json.loads((out / "baselines" / EAGER_VANILLA / "report.json").read_text())
    assert eager["method"] == "vanilla" and eager["compile"]["compiled"] is False
    assert report["timing"]["sides"] == ["vanilla", "drafter", EAGER_VANILLA]  # the same rounds
    entry = report["compile"]
    assert entry["mode"] == "max-autotune" and entry["compiled"] is True
    assert entry["eager_vanilla_vs_compiled_vanilla"] == eager["speedup"]
    assert entry["speedup_vs_eager_vanilla"] == pytest.approx(report["speedup"] / eager["speedup"])
    assert report["greedy_matches_vanilla"] == 1.0


def test_the_eval_compiles_by_hardware_from_its_compute_dtype(tmp_path, monkeypatch, caplog):
    """compile=hardware on the eval: a float32 checkpoint decodes compiled (an eager vanilla beside it), a
    bfloat16 one eagerly; the choice is said at start and recorded in the report's `compile` entry."""
    import json
    import logging

    from headstart.eval.stage.evaluate import EAGER_VANILLA, run
    from headstart.eval.timing.harness import TimingConfig
    from headstart.eval.tuning.tuner import TunerConfig
    from tests.eval.test_eval_stage import _cfg, save_ckpt

    monkeypatch.setattr(compiled, "compiled_step", lambda device: compiled._step)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 0, "category": "a", "turns": ["Say hi."]}) + "\n")
    ckpt = save_ckpt(tmp_path / "drafter")
    for dtype, mode in (("float32", "auto"), ("bfloat16", "eager")):
        out = tmp_path / dtype
        with caplog.at_level(logging.INFO, logger="headstart.eval"):
            report = run(_cfg(ckpt, prompts, out, warmup=0, compile="hardware", dtype=dtype,
                              timing=TimingConfig(budget_s=0), tuner=TunerConfig(mode="off")))  # fmt: skip
        entry = report["compile"]
        assert entry["setting"] == "hardware" and entry["mode"] == mode and entry["reason"], entry
        assert entry["compiled"] is (mode == "auto")
        assert (out / "baselines" / EAGER_VANILLA).is_dir() is (mode == "auto")
        assert f"compile=hardware -> {mode} ({entry['reason']})" in caplog.text


def test_a_compiled_eval_times_round_0_again(tmp_path, monkeypatch):
    """The first pass compiles each (width, cache bucket) inside the decode that first reaches it: a compiled
    eval drops its times and decodes every turn again on every side (round 0 over built graphs); an eager eval
    times its first pass."""
    import json

    from headstart.eval.scoring import measure
    from headstart.eval.stage.evaluate import run
    from headstart.eval.timing.harness import TimingConfig
    from headstart.eval.tuning.tuner import TunerConfig
    from tests.eval.test_eval_stage import _cfg, save_ckpt

    monkeypatch.setattr(compiled, "compiled_step", lambda device: compiled._step)
    decodes = []
    real = measure.decode_turn
    monkeypatch.setattr(
        measure, "decode_turn", lambda dec, *a, **k: decodes.append(dec) or real(dec, *a, **k)
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 0, "category": "a", "turns": ["Say hi."]}) + "\n")
    ckpt = save_ckpt(tmp_path / "drafter")
    for mode, first_pass in (("eager", "timed"), ("max-autotune", "dropped: it compiled the graphs")):
        decodes.clear()
        cfg = _cfg(ckpt, prompts, tmp_path / mode, warmup=0, compile=mode, timing=TimingConfig(budget_s=0),
                   tuner=TunerConfig(mode="off"))  # fmt: skip
        report = run(cfg)
        assert report["timing"]["first_pass"] == first_pass
        sides = len(report["timing"]["sides"])  # compiled: vanilla, the drafter, an eager vanilla
        assert len(decodes) >= (2 if mode != "eager" else 1) * sides and report["timing"]["pairs"] >= 1


def test_roofline_hand_worked():
    """Tiny Llama (hidden 64, MLP 128, 2 layers, 4 heads / 2 KV heads of 16, tied 259-token vocab): per layer
    q 64x64 + k, v 64x32 + o 64x64 + gate, up, down 64x128 = 36,864 weights; 2 layers + the tied table 259x64 =
    90,304 matmul weights; + 5 norm vectors of 64 = 90,624 fp32 weights = 362,496 bytes. At 1 GB/s and 1 GFLOP/s:
    w=1 reads for 362.5 us (its 180.6 us of FLOPs hide), w=4 computes for 722.4 us."""
    from headstart.eval.timing.verify_cost import roofline

    floor = roofline(tiny_backbone(), 1e9, 1e9, [1, 4])
    assert floor[1] == pytest.approx(362_496e-9) and floor[4] == pytest.approx(4 * 2 * 90_304e-9)


def test_verify_cost_table(monkeypatch):
    """The --verify-costs table on the tiny model, the compiled path run uncompiled (fast): every width on both
    paths, the same tokens, the machine named in the first line."""
    from headstart.eval.timing import verify_cost

    monkeypatch.setattr(compiled, "compiled_step", lambda device: compiled._step)
    monkeypatch.setattr(verify_cost, "memory_bandwidth", lambda dtype: 1e10)  # not this test's subject
    monkeypatch.setattr(verify_cost, "peak_flops", lambda dtype: 1e11)
    text = verify_cost.report(
        tiny_backbone(), "float32", (1, 2, 4), context=8, reps=2, compile="max-autotune"
    )
    head, rows = text.splitlines()[0], [r for r in text.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert "ISA" in head and "BLAS" in head and "BLAS ?" not in head and "float32, 1 threads" in head
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 2", "| 4"]
    assert all(" | True | " in r and "n/a" not in r for r in rows)
    eager_only = verify_cost.report(tiny_backbone(), "float32", (1, 2), context=8, reps=1, compile="eager")
    assert eager_only.count("n/a") == 2 * 6  # no compiled figure where nothing compiles


def test_step_costs_time_each_side_on_its_own_path(monkeypatch, made_runners):
    """The eval's physical checks price a compiled side with compiled steps and an eager side with eager ones
    (else a compiled vanilla beside an eager one would be flagged as off its prediction)."""
    from headstart.eval.timing.bounds import step_costs

    monkeypatch.setattr(compiled, "compiled_step", lambda device: compiled._step)
    shapes = {"vanilla": (1, None), "eager": (1, None)}
    costs = step_costs(tiny_backbone(), shapes, list(range(5, 20)), 2, {"vanilla": True}, max_cache_len=64)
    assert set(costs) == {"vanilla", "eager"} and all(c > 0 for c in costs.values())
    assert sorted((r.compiled, r.cache.max_cache_len) for r in made_runners) == [(False, 17), (True, 64)]
    compiled_graphs = [set(r._graphs) for r in made_runners if r.compiled]
    assert compiled_graphs == [{(1, True, 64)}]  # the compiled side ran its graph (over all 64 slots)


def test_bench_decode_verify_costs_honours_an_explicit_eager(monkeypatch, capsys):
    """--verify-costs compiles its second column where inductor runs, unless --compile eager is asked for."""
    from headstart.eval.bench import decode
    from headstart.eval.timing import verify_cost

    seen = []
    monkeypatch.setattr(verify_cost, "report", lambda *a: seen.append(a[-1]) or "table")
    for extra in ([], ["--compile", "eager"], ["--compile", "max-autotune"]):
        decode.main(["--backbone", "tiny", "--verify-costs", "--dtype", "float32", "--threads", "1", *extra])
    assert seen == ["auto", "eager", "max-autotune"]
