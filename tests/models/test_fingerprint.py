"""The backbone fingerprint a drafter checkpoint is checked against includes a cheap weight digest: a
same-shape backbone with other weights is refused, the same weights in another dtype are accepted, and old
checkpoints without the digest still load."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_backbone

from headstart.models.backbone import BackboneError, check_compatible
from headstart.models.checkpoint import build_drafter, load_drafter, save_drafter
from headstart.models.medusa import MedusaConfig


def test_same_shape_backbone_with_other_weights_is_refused(tmp_path):
    trained_on = tiny_backbone(seed=0)
    cfg = MedusaConfig(num_heads=2)
    heads = build_drafter("medusa", cfg, trained_on)
    save_drafter(tmp_path / "d", heads, "medusa", cfg, _bcfg(), trained_on)
    other = tiny_backbone(seed=1)  # same config, shapes and tokenizer; other weights
    assert other.fingerprint().keys() == trained_on.fingerprint().keys()
    with pytest.raises(BackboneError, match="other weights \\(same shapes\\)"):
        load_drafter(tmp_path / "d", other)
    load_drafter(tmp_path / "d", tiny_backbone(seed=0))  # the same weights rebuilt: accepted
    load_drafter(tmp_path / "d", tiny_backbone(seed=0, dtype="bfloat16"))  # and in bfloat16

    # a checkpoint written before the digest existed still loads (the key is only checked when present)
    meta = json.loads((tmp_path / "d" / "config.json").read_text())
    del meta["backbone_fingerprint"]["weights"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(meta))
    load_drafter(tmp_path / "d", other)


def test_digest_is_cheap_and_sees_a_single_changed_tensor():
    a = tiny_backbone(seed=0)
    fp = a.fingerprint()["weights"]
    with torch.no_grad():
        a.model.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    assert a.fingerprint()["weights"] != fp
    check_compatible(tiny_backbone(seed=0), {"weights": fp}, "x")
    check_compatible(tiny_backbone(seed=3, dtype="float16"), {"weights": fp}, "x")  # fp16: not comparable


def _bcfg():
    from headstart.models.backbone import BackboneConfig

    return BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})


def test_data_caches_follow_the_weights_not_the_folder_they_were_read_from():
    """Regenerated answers, tokenized splits and hidden-state caches are keyed by backbone_fingerprint: the same
    weights loaded from another folder (a moved $HEADSTART_CACHE, a Hub id) keep them; other weights do not."""
    from headstart.data.cache import backbone_fingerprint

    a, b = tiny_backbone(seed=0), tiny_backbone(seed=0)
    a.model.config._name_or_path = "/old/cache/backbones/model"
    b.model.config._name_or_path = "/new/cache/backbones/model"
    assert backbone_fingerprint(a) == backbone_fingerprint(b)
    b.model.config.rope_theta = 12345.0  # a config change still tells them apart
    assert backbone_fingerprint(a) != backbone_fingerprint(b)
    assert backbone_fingerprint(a) != backbone_fingerprint(tiny_backbone(seed=1))
