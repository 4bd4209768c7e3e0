"""EAGLE-2 dynamic trees in the built-in decoder: lossless against vanilla greedy for EAGLE-1 and EAGLE-3
drafters (untrained, perturbed, and trained so that drafts are accepted), and the sampling path runs."""

from __future__ import annotations

import pytest
import torch

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers import proposer_config
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config, EagleConfig

CONFIGS = {"eagle": EagleConfig(noise=0.0), "eagle3": Eagle3Config(draft_vocab_size=259, ttt_steps=2)}


@pytest.fixture(scope="module")
def sharp():
    """The tiny backbone with a sharpened lm_head (a random model is near-uniform), and greedy data from it."""
    bb = load_backbone(
        BackboneConfig(
            name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, "tie_word_embeddings": False}
        )
    )
    with torch.no_grad():
        bb.lm_head.weight.mul_(20)
    g = torch.Generator().manual_seed(0)
    vanilla = Decoder(bb, "vanilla", max_cache_len=256)
    prompts = [torch.randint(3, 259, (8,), generator=g).tolist() for _ in range(8)]
    rows = [p + vanilla.generate(p, 40, eos_token_ids=[]).tokens for p in prompts]
    return bb, vanilla, prompts, torch.tensor(rows)


def _trained(bb, method, ids, steps=40):
    torch.manual_seed(0)
    d = build_drafter(method, CONFIGS[method], bb)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    final, aux = bb(ids, batch["attention_mask"], layers=d.aux_layers)
    opt = torch.optim.Adam([p for p in d.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        loss, n, _ = d(aux if d.v3 else [final], final, batch)
        (loss / n).backward()
        opt.step()
        opt.zero_grad()
    return d.eval()


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_greedy_equals_vanilla_untrained_and_perturbed(backbone, method):
    vanilla = Decoder(backbone, "vanilla", max_cache_len=256)
    d = build_drafter(method, CONFIGS[method], backbone).eval()
    prompt = list(range(40, 60))
    ref = vanilla.generate(prompt, 32).tokens
    assert (
        Decoder(backbone, proposer_config(method, drafter=d, tree_nodes=12), max_cache_len=256)
        .generate(prompt, 32)
        .tokens
        == ref
    )
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    dec = Decoder(
        backbone, proposer_config(method, drafter=d, tree_nodes=12, num_draft_tokens=3), max_cache_len=256
    )
    assert dec.generate(prompt, 32).tokens == ref


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_trained_drafter_is_accepted_and_lossless(sharp, method):
    bb, vanilla, prompts, ids = sharp
    d = _trained(bb, method, ids)
    dec = Decoder(
        bb, proposer_config(method, drafter=d, tree_nodes=16, num_draft_tokens=4), max_cache_len=256
    )
    taus = []
    for p in prompts[:2] + [list(range(30, 38))]:
        out = dec.generate(p, 40)
        assert out.tokens == vanilla.generate(p, 40).tokens
        taus.append(out.stats.tau)
    assert max(taus) > 2.0  # deep dynamic-tree paths were accepted
    assert dec.proposer.cache.get_seq_length() == dec.proposer.cache_len  # tree rows were cropped
    sampled = dec.generate(prompts[0], 24, temperature=0.7, seed=0, eos_token_ids=[])
    assert len(sampled.tokens) == 24 and sampled.stats.tau >= 1.0


def test_served_in_the_target_dtype_with_fp32_rope(tmp_path):
    """A checkpoint loaded for decoding runs in the target's dtype (no per-node fp32 copy of a bf16 lm_head),
    except RoPE's inverse frequencies, which stay exactly what training used."""
    from headstart.eval.engine.decoder import build_decoder
    from headstart.models.checkpoint import save_drafter

    cfg = BackboneConfig(name="tiny", path="tiny", dtype="bfloat16")
    bb = load_backbone(cfg)
    d = build_drafter("eagle3", CONFIGS["eagle3"], bb)
    save_drafter(tmp_path / "drafter", d, "eagle3", CONFIGS["eagle3"], cfg, bb)
    served = build_decoder("eagle3", bb, str(tmp_path / "drafter")).proposer.drafter
    assert served.fc.weight.dtype == served.lm_head.weight.dtype == torch.bfloat16
    assert served.rotary.inv_freq.dtype == torch.float32
    torch.testing.assert_close(served.rotary.inv_freq, d.rotary.inv_freq, rtol=0, atol=0)
