"""eval/bench/rule_bound.py: rules simulated from one recorded plain decode give the tau a decoder running them
measures (Medusa heads, float32), the oracle bounds both of its chains, and the bench runs end to end."""

import json

import pytest
import torch
from test_chain_tau import _drafter
from test_lookup_branch import TEXTS

from headstart.eval.bench import rule_bound
from headstart.eval.engine.decoder import build_decoder
from headstart.eval.engine.proposers import chain_options
from headstart.eval.engine.proposers.prompt_lookup import MAX_NGRAM
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import LoadedDrafter, build_drafter, load_drafter, read_meta, save_drafter
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")

# a tiny backbone whose greedy text repeats itself (lookup chains accepted) and random heads that it often agrees with
TINY = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, "initializer_range": 0.1})


def decoded_tau(decoder, prompts, tokens: int) -> float:
    made = forwards = 0
    for _, ids in prompts:
        stats = decoder.generate(list(ids), tokens, temperature=0.0).stats
        made, forwards = made + sum(stats.accepted_per_step), forwards + stats.target_forwards
    return made / forwards


def test_simulated_rules_match_decoded_ones(tmp_path):
    backbone, config = load_backbone(TINY), MedusaConfig(num_heads=2)
    torch.manual_seed(0)
    heads = build_drafter("medusa", config, backbone)
    folder = save_drafter(tmp_path / "drafter", heads, "medusa", config, TINY, backbone)
    loaded = LoadedDrafter(*load_drafter(folder, backbone, read_meta(folder)), folder)
    chain, _ = chain_options("medusa", 2, loaded.drafter)
    prompts = [(f"c{i % 2}", backbone.tokenizer(text)["input_ids"]) for i, text in enumerate(TEXTS)]
    decodes = rule_bound.record(build_decoder("medusa", backbone, loaded, **chain), prompts, 40, MAX_NGRAM)
    assert all(len(d.tokens) > len(ids) + 1 for d, (_, ids) in zip(decodes, prompts))
    alone = rule_bound.simulate(decodes, rule_bound.lookup_rule(MAX_NGRAM + 1, 2))
    assert alone["tau"] == pytest.approx(
        decoded_tau(build_decoder("medusa", backbone, loaded, **chain), prompts, 40)
    )
    taus = set()
    for m, L in ((1, 3), (2, 1), (1, 1), (3, 2)):
        hybrid = rule_bound.simulate(decodes, rule_bound.lookup_rule(m, L))
        lookup = build_decoder("medusa", backbone, loaded, **chain, lookup_tokens=L, lookup_min_match=m)
        assert hybrid["tau"] == pytest.approx(decoded_tau(lookup, prompts, 40)), (m, L)
        taus.add(round(hybrid["tau"], 6))
    assert len(taus) >= 3  # the rules differ here, so a mismatch in any would show
    hybrid = rule_bound.simulate(decodes, rule_bound.lookup_rule(1, 3))
    assert alone["lookup_share"] == 0 and 0 < hybrid["lookup_share"] < 1  # both sides chosen somewhere
    best = rule_bound.simulate(
        decodes, rule_bound.oracle(rule_bound.lookup_rule(1, 3), rule_bound.lookup_rule(MAX_NGRAM + 1, 2))
    )
    assert best["tau"] >= max(alone["tau"], hybrid["tau"])
    assert set(hybrid["by_category"]) == {"c0", "c1"}
    assert all(0 < d.positions[d.start].p1 <= 1 for d in decodes)  # head 1's top probability, read each step


def test_accepted_prefix_and_the_extension_behind_the_drafts():
    assert rule_bound.accepted([1, 2, 9], [0, 1, 2, 3], 1) == 2
    assert rule_bound.accepted([1, 2, 3, 4], [0, 1, 2, 3], 1) == 3  # the output ends: no more to accept
    p = rule_bound.Position(n=0, lookup=[], drafts=[7, 8], p1=0.5)
    tokens = [7, 8, 9, 4, 7]  # context [7, 8, 9, 4]: after drafting 7 8, "7 8" was followed by 9 4
    assert rule_bound.lookup_rule(1, 4, extend=2)(p, tokens, 4) == ([7, 8, 9, 4], "drafter")
    assert rule_bound.lookup_rule(1, 4)(p, tokens, 4) == ([7, 8], "drafter")
    confident = rule_bound.Position(n=2, lookup=[1, 2, 3, 4, 5], drafts=[7, 8], p1=0.95)
    assert rule_bound.lookup_rule(1, 4, theta=0.9)(confident, tokens, 4) == ([7, 8], "drafter")
    assert rule_bound.lookup_rule(1, 4, theta=0.99)(confident, tokens, 4) == ([1, 2, 3, 4], "lookup")


def test_the_bench_prints_and_writes_every_rule(tmp_path, capsys):
    folder = _drafter(tmp_path / "d" / "drafter", 0)
    out = tmp_path / "rules.json"
    table = rule_bound.main([
        "--checkpoint", str(folder), "--prompts", "dev", "--per-category", "1", "--tokens", "8",
        "--dtype", "float32", "--out", str(out),
    ])  # fmt: skip
    assert json.loads(out.read_text())["prompts"] == 11
    assert len(table) == 8 and "oracle over m=1's two chains" in capsys.readouterr().out
