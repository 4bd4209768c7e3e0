"""Memory overhead and per-token latency on hand-worked cases: a drafter of known size, state kept beside it,
the target's own tensors never counted, a decode's transient peak from allocations of known size."""

import pytest
import torch

from headstart.eval.engine.decoder import Decoder
from headstart.eval.scoring.memory import (
    GB,
    MemoryUse,
    measure_memory,
    memory_report,
    module_bytes,
    proposer_bytes,
    transient_peak,
)
from headstart.eval.scoring.score import aggregate, token_latencies
from headstart.models.backbone import BackboneConfig, load_backbone

pytestmark = pytest.mark.usefixtures("one_thread")


class Pool:
    """State kept in Python objects, reported by the owner."""

    __module__ = "headstart.tests.pool"  # walked like the project's own objects

    def state_bytes(self) -> int:
        return 123


class FakeProposer:
    __module__ = "headstart.tests.fake"

    def __init__(self, target) -> None:
        self.heads = torch.nn.Linear(10, 20)  # 10 * 20 + 20 = 220 float32 = 880 bytes
        self.lm_head = target.lm_head  # the target's: not the proposer's memory
        self.cache = torch.zeros(100)  # 400 bytes of state
        self.views = [self.cache[:10], self.cache[50:]]  # the same storage: counted once
        self.pool = Pool()


@pytest.fixture(scope="module")
def target():
    return load_backbone(BackboneConfig(name="tiny", path="tiny", dtype="float32"))


def test_a_drafter_of_known_size_and_its_state(target):
    drafter, state = proposer_bytes(FakeProposer(target), target.model, torch.zeros(3))
    assert drafter == 880 and state == 400 + 123
    assert proposer_bytes(None, target.model, torch.zeros(3)) == (0, 0)


def test_tied_weights_count_once():
    lin = torch.nn.Linear(4, 4, bias=False)
    twin = torch.nn.Sequential(lin, torch.nn.Linear(4, 4, bias=False))
    twin[1].weight = lin.weight
    assert module_bytes(twin) == 4 * 4 * 4


def test_transient_peak_of_known_allocations():
    def run():
        a = torch.empty(250_000)  # 1 MB
        b = torch.empty(500_000)  # 2 MB -> 3 MB held
        del a  # 2 MB
        c = torch.empty(750_000)  # 3 MB -> 5 MB held: the peak
        del b, c

    peak, how = transient_peak(run, torch.device("cpu"))
    assert peak == pytest.approx(5_000_000, rel=0.01) and "profiler" in how


def test_memory_report_subtracts_vanilla():
    vanilla = MemoryUse(1000, 200, 0, 0, 50, "x")
    side = MemoryUse(1000, 200, 300, 40, 80, "x")
    rep = memory_report(side, vanilla)
    assert rep["spec"]["peak_bytes"] == 1620 and rep["vanilla"]["peak_bytes"] == 1250
    assert rep["overhead_gb"] == pytest.approx(370 / GB) and rep["drafter_gb"] == pytest.approx(300 / GB)


def test_decoders_of_the_tiny_model(target):
    ids = target.tokenizer("the cat sat on the mat. the cat")["input_ids"]
    vanilla = measure_memory(Decoder(target, max_cache_len=128), ids, 12, [])
    lookahead = measure_memory(Decoder(target, "lookahead", max_cache_len=128), ids, 12, [])
    assert vanilla.drafter_bytes == vanilla.state_bytes == lookahead.drafter_bytes == 0
    assert vanilla.target_bytes == lookahead.target_bytes == module_bytes(target.model)
    assert vanilla.cache_bytes == Decoder(target, max_cache_len=128).runner.cache.kv.nbytes
    assert lookahead.state_bytes > 0  # its window and n-gram pool
    assert vanilla.transient_bytes > 0 and lookahead.transient_bytes > 0


def test_per_token_latency_shares_a_step_among_its_tokens():
    assert token_latencies([0.03, 0.01], [3, 1]) == pytest.approx([0.01] * 4)
    step = {"new_tokens": 1, "wall_s": 1.0, "step_tokens": 0, "target_forwards": 2, "accepted_by_position": [],
            "proposed_by_position": [], "time_s": {"total": 1.0}}  # fmt: skip
    rec = {
        "question_id": 1,
        "category": "a",
        "match": True,
        "vanilla": {**step, "step_latency_s": [0.01, 0.01], "accepted_per_step": [1, 1]},
        "spec": {**step, "step_latency_s": [0.04, 0.01], "accepted_per_step": [4, 1]},
    }
    m = aggregate([rec], greedy=True)
    assert m["token_latency_ms"] == {"p50": pytest.approx(10.0), "p99": pytest.approx(10.0)}
    assert m["step_latency_ms"]["p99"] == pytest.approx(39.7)  # steps: 40 and 10 ms
    assert m["vanilla_token_latency_ms"]["p50"] == pytest.approx(10.0)


def test_an_eagle_drafter_is_its_checkpoint_plus_unsaved_buffers(tmp_path):
    """EAGLE-3 reads the target's embeddings and lm_head (not counted) and keeps its own KV cache (state)."""
    from safetensors.torch import load_file

    from headstart.eval.engine.decoder import build_decoder
    from headstart.models.checkpoint import build_drafter, save_drafter
    from headstart.models.eagle_config import Eagle3Config

    cfg = BackboneConfig(
        name="tiny", path="tiny", dtype="float32", tiny={"seed": 3, "initializer_range": 0.2}
    )
    bb, ecfg = load_backbone(cfg), Eagle3Config(aux_layers=[1, 1, 1], draft_vocab_size=64)
    ckpt = save_drafter(tmp_path / "d", build_drafter("eagle3", ecfg, bb), "eagle3", ecfg, cfg, bb)
    saved = sum(t.numel() * t.element_size() for t in load_file(ckpt / "model.safetensors").values())
    used = measure_memory(build_decoder("eagle3", bb, ckpt, max_cache_len=128), [5, 6, 7, 8], 8, [])
    assert saved <= used.drafter_bytes <= saved + 1024  # + non-persistent buffers (rotary frequencies)
    assert used.state_bytes > 0
