"""Medusa heads moved away from their identity start, so that their drafts vary (and, with `root_token`, read the
root): the lossless tests' drafters."""

import torch

from headstart.models.checkpoint import build_drafter
from headstart.models.medusa import MedusaConfig


def perturbed_heads(backbone, num_heads=3, scale=0.3, seed=0, **config):
    heads = build_drafter("medusa", MedusaConfig(num_heads=num_heads, **config), backbone)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(0.02))
    return heads
