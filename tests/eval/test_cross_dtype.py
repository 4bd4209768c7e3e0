"""Checkpoints do not depend on the compute dtype: a drafter saved from a float32 backbone decodes losslessly on
the same backbone loaded in bfloat16, and the reverse (greedy speculative == greedy vanilla in the dtype it
decodes in), for Medusa, EAGLE and EAGLE-3, through save_drafter / build_decoder as the eval stage does."""

from __future__ import annotations

import pytest
import torch

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.models import registry
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter, read_meta, save_drafter
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = {
    "medusa": MedusaConfig(num_heads=3),
    "eagle": EagleConfig(noise=0.0),
    "eagle3": Eagle3Config(draft_vocab_size=259, ttt_steps=2),
}
PROMPTS = [list(range(40, 60)), [7, 8, 9, 7, 8, 9, 7, 8], list(range(200, 230, 3))]
PROMPTS_TRAIN = [list(range(40 + 3 * i, 48 + 3 * i)) for i in range(8)]
MAX_NEW = 32
INIT = 0.1


def tiny(dtype: str) -> tuple[BackboneConfig, object]:
    # init 0.1: repeats with switches, so drafts are accepted and rejected
    cfg = BackboneConfig(name="tiny", path="tiny", dtype=dtype, tiny={"seed": 0, "initializer_range": INIT})
    return cfg, load_backbone(cfg)


@pytest.fixture(scope="module")
def backbones():
    return {d: tiny(d) for d in ("float32", "bfloat16")}


def saved(path, method: str, cfg: BackboneConfig, backbone):
    """A drafter built on `backbone` and moved off its init as training would (Medusa: perturbed, its heads start
    as the lm_head and already draft; EAGLE: 40 steps on the backbone's own greedy text), saved as train/ does."""
    torch.manual_seed(0)
    drafter = build_drafter(method, CONFIGS[method], backbone)
    if method == "medusa":
        with torch.no_grad():
            for p in drafter.parameters():
                p.add_(torch.randn_like(p) * 0.05 * p.std().clamp_min(0.02))
    else:
        vanilla = Decoder(backbone, "vanilla", max_cache_len=256)
        ids = torch.tensor([p + vanilla.generate(p, 24, eos_token_ids=[]).tokens for p in PROMPTS_TRAIN])
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
        final, aux = backbone(ids, batch["attention_mask"], layers=drafter.aux_layers)
        opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
        half = backbone.dtype != torch.float32  # as train.mixed_precision=auto trains on a bf16 backbone
        for _ in range(40):
            with torch.autocast("cpu", dtype=backbone.dtype, enabled=half):
                loss, n, _ = drafter(aux if drafter.v3 else [final], final, batch)
            (loss / n).backward()
            opt.step()
            opt.zero_grad()
    return save_drafter(path, drafter.eval(), method, CONFIGS[method], cfg, backbone)


@pytest.mark.parametrize("method", list(CONFIGS))
@pytest.mark.parametrize("saved_in, decoded_in", [("float32", "bfloat16"), ("bfloat16", "float32")])
def test_a_checkpoint_decodes_losslessly_in_another_dtype(backbones, tmp_path, method, saved_in, decoded_in):
    ckpt = saved(tmp_path / "ck", method, *backbones[saved_in])
    assert read_meta(ckpt)["backbone"]["dtype"] == saved_in
    _, target = backbones[decoded_in]
    spec = build_decoder(registry.proposer_of(method), target, str(ckpt), max_cache_len=256)
    vanilla = Decoder(target, "vanilla", max_cache_len=256)
    taus = []
    for prompt in PROMPTS:
        out = spec.generate(prompt, MAX_NEW, eos_token_ids=[])
        assert out.tokens == vanilla.generate(prompt, MAX_NEW, eos_token_ids=[]).tokens
        taus.append(out.stats.tau)
    assert max(taus) > 1.2  # drafts were accepted: the drafter's proposals decided the path taken
