"""eval/tuning/replay.py: every rule the tuner tries, replayed on one recorded plain decode, gives the tau and the
verify widths that decoding it gives (Medusa heads, float32: exact), suffix decoding's rule included where its
tree is installed."""

import pytest
import torch
from test_lookup_branch import TEXTS

from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.proposers import chain_options
from headstart.eval.tuning import lookup_rule, replay
from headstart.eval.tuning.lookup_rule import decoder_options, replayed, steps_by_width
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import LoadedDrafter, build_drafter, load_drafter, read_meta, save_drafter
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")

# a tiny backbone whose greedy text repeats itself (lookup chains accepted), random heads it often agrees with
TINY = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, "initializer_range": 0.1})
TOKENS, MOST = 40, 8


def heads(tmp_path):
    backbone, config = load_backbone(TINY), MedusaConfig(num_heads=2)
    torch.manual_seed(0)
    folder = save_drafter(
        tmp_path / "drafter", build_drafter("medusa", config, backbone), "medusa", config, TINY, backbone
    )
    loaded = LoadedDrafter(*load_drafter(folder, backbone, read_meta(folder)), folder)
    chain, _ = chain_options("medusa", 2, loaded.drafter)
    prompts = [backbone.tokenizer(text)["input_ids"] for text in TEXTS]
    return backbone, loaded, chain, prompts


def decoded(decoder, prompts) -> tuple[list, int]:
    """What the tuner keeps of a rule, decoded: per prompt [tokens emitted, {width: steps}, steps that verified
    the drafter's chain (the lookup choice's steps less its lookup steps; every step without one)], forwards."""
    rows, forwards = [], 0
    counts = getattr(decoder.proposer, "counts", None)
    for ids in prompts:
        before = dict(counts) if counts is not None else None
        stats = decoder.generate(list(ids), TOKENS, temperature=0.0).stats
        widths = steps_by_width(stats.target_forwards, stats.proposed_by_position)
        drafted = stats.target_forwards
        if counts is not None:
            drafted = counts["steps"] - before["steps"] - (counts["lookup"] - before["lookup"])
        rows.append([sum(stats.accepted_per_step), {str(w): n for w, n in sorted(widths.items())}, drafted])
        forwards += stats.target_forwards
    return rows, forwards


def test_every_rule_replays_as_it_decodes(tmp_path):
    backbone, loaded, chain, prompts = heads(tmp_path)
    suffix = lookup_rule.suffix_available()
    decoder = build_decoder("medusa", backbone, loaded, **chain)
    recorder = replay.Recorder(decoder.proposer, (3, MOST), MOST, suffix)
    decodes = replay.record(decoder, prompts, TOKENS, recorder)
    rules = [None, (2, 1), (3, 1), (1, 2), (4, 3), (2, 1, MOST)] + [
        ("suffix", s, MOST) for s in (0.0, 1.0)
    ] * suffix
    seen = set()
    for rule in rules:
        made = build_decoder("medusa", backbone, loaded, **chain, **decoder_options(rule))
        assert replayed(decodes, rule) == decoded(made, prompts), rule
        seen.add(replayed(decodes, rule)[1])
    assert len(seen) >= 4  # the rules take different steps here, so a wrong replay of any would show


def test_a_drafter_floor_replays_as_it_decodes(tmp_path):
    """Prompts of 20 distinct tokens (1-token matches everywhere, 2-token ones rarer): a request whose heads average
    under the floor turns to 1-token matches part way, so the rule takes steps neither m = 1 nor m = 2 takes, and
    replaying it gives what decoding it gives (the per-request state read from the context's growth alike)."""
    import random

    backbone, loaded, chain, _ = heads(tmp_path)
    rng = random.Random(3)
    prompts = [[rng.randrange(30, 50) for _ in range(30)] for _ in range(3)]
    decoder = build_decoder("medusa", backbone, loaded, **chain)
    decodes = replay.record(decoder, prompts, TOKENS, replay.Recorder(decoder.proposer, (3, MOST), MOST))
    forwards = {}
    for rule in [(2, 1), (2, 2), (2, 2, None, 0.4), (2, 2, MOST, 0.4)]:
        made = build_decoder("medusa", backbone, loaded, **chain, **decoder_options(rule))
        assert replayed(decodes, rule) == decoded(made, prompts), rule
        forwards[rule] = replayed(decodes, rule)[1]
    assert forwards[(2, 2, None, 0.4)] not in (forwards[(2, 1)], forwards[(2, 2)])


def test_the_tuner_decodes_once(tmp_path, monkeypatch):
    backbone, loaded, chain, prompts = heads(tmp_path)
    calls = []
    record = replay.record
    monkeypatch.setattr(replay, "record", lambda *a, **k: calls.append(1) or record(*a, **k))
    cost = {w: 1.0 + 0.01 * w for w in range(1, 18)}
    rule = lookup_rule.tune_lookup_rule(
        backbone, "medusa", loaded, chain, 2, prompts, TOKENS, [2, 3], MOST, cost=cost, suffix=False
    )
    assert calls == [1] and len(rule.tau_by_rule) >= 7  # the drafter alone, 6 (L, m), growth: one decode
    for name, tau in rule.tau_by_rule.items():
        assert tau >= 1.0, name
