"""The offline hidden-state cache (EAGLE's fused layers, Medusa's last hidden state: cached batches equal the online features, resume after an interrupted
build, reuse without the backbone, clear errors for a cache of another backbone / dataset / shard layout, and a
full pipeline run that trains the same drafter as the online one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_backbone
from safetensors.torch import load_file, save_file

from headstart.data import TokenizedDataset, collate
from headstart.models import registry
from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.medusa import MedusaConfig
from headstart.train.hidden_cache import (
    CachedHiddenDataset,
    HiddenCacheError,
    build_cache,
    cache_meta,
    collate_hidden,
    length_batches,
    offline_datasets,
)
from headstart.train.steps import eagle_step
from helpers import run_train, train_overrides, write_chat_file

LAYERS = (1, 1, 0)  # EAGLE-3's aux layers on the 2-layer tiny backbone


def _dataset(n: int = 20, seed: int = 0) -> TokenizedDataset:
    g = np.random.default_rng(seed)
    lengths = g.integers(5, 17, n)
    ids = g.integers(3, 259, int(lengths.sum())).astype(np.int32)
    labels = ids.copy()
    labels[::3] = -100
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    arrays = {"input_ids": ids, "labels": labels, "offsets": offsets, "row_ids": np.arange(n) + 100}
    return TokenizedDataset(arrays)


class Counting:
    """The backbone, counting its forward calls and raising after `fail_after` of them."""

    def __init__(self, backbone, fail_after: int | None = None) -> None:
        self.backbone, self.calls, self.fail_after = backbone, 0, fail_after

    def __getattr__(self, name):
        return getattr(self.backbone, name)

    def __call__(self, *args, **kwargs):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("interrupted")
        self.calls += 1
        return self.backbone(*args, **kwargs)


def test_config_checks():
    with pytest.raises(ValueError, match="hidden_cache"):
        EagleConfig(hidden_cache="disk")
    with pytest.raises(ValueError, match="hidden_cache_dtype"):
        Eagle3Config(hidden_cache="offline", hidden_cache_dtype="int8")
    with pytest.raises(ValueError, match="hidden_cache"):
        MedusaConfig(hidden_cache="disk")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_cached_batches_equal_online(tmp_path, backbone, method):
    cfg = EagleConfig(noise=0.0) if method == "eagle" else Eagle3Config(draft_vocab_size=64, ttt_steps=2)
    drafter = build_drafter(method, cfg, backbone).eval()
    ds = _dataset()
    sets, stats = offline_datasets(
        backbone, drafter.aux_layers, {"train": ds}, tmp_path, "float32", batch_tokens=48, show_progress=False
    )
    assert stats["train"]["bytes"] > 0 and not stats["train"]["reused"]
    items = [sets["train"][i] for i in (7, 0, 13, 2)]  # shuffled rows, different lengths: padding differs
    cached = collate_hidden(items, pad_id=0)
    online = collate(items, pad_id=0)
    final, aux = backbone(online["input_ids"], online["attention_mask"], layers=drafter.aux_layers)
    valid = online["attention_mask"].bool()
    for k, want in enumerate([*aux, final]):
        torch.testing.assert_close(cached["hidden"][:, :, k][valid], want[valid], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        loss_c, n_c, _ = eagle_step(Counting(backbone, fail_after=0), drafter, cached)  # never calls it
        loss_o, n_o, _ = eagle_step(backbone, drafter, online)
    torch.testing.assert_close(loss_c, loss_o, atol=1e-4, rtol=1e-5)
    assert n_c == n_o


def test_length_batches_cover_every_row_once_within_the_token_budget():
    lengths = np.array([5, 300, 17, 16, 9, 120, 16, 400])
    groups = length_batches(lengths, 64)
    assert sorted(j for g in groups for j in g) == list(range(len(lengths)))
    for g in groups:  # longest first: the first row sets the padding; one over-long row goes alone
        assert lengths[g[0]] == max(lengths[g]) and (len(g) * lengths[g[0]] <= 64 or len(g) == 1)
    assert [list(lengths[g]) for g in groups][:3] == [[400], [300], [120]]
    assert [17, 16, 16] in [list(lengths[g]) for g in groups]  # similar lengths share a forward


def test_interrupted_build_resumes_then_reuses(tmp_path, backbone):
    ds = _dataset()
    folder = tmp_path / "cache"
    shard_bytes = 4 * 16 * 2 * 64 * 2  # 4 rows of <= 16 tokens, K=2 (aux layer 1 + final), H=64, bf16
    whole = Counting(backbone)
    build_cache(whole, (1,), ds, tmp_path / "whole", "bfloat16", 40, shard_bytes, show_progress=False)
    rows0 = np.diff(json.loads((tmp_path / "whole" / "manifest.json").read_text())["plan"][0])[0]
    calls0 = len(length_batches(ds.lengths[:rows0], 40))  # forward batches in shard 0
    first = Counting(backbone, fail_after=calls0 + 1)  # fails in the second shard's second batch
    with pytest.raises(RuntimeError, match="interrupted"):
        build_cache(first, (1,), ds, folder, "bfloat16", 40, shard_bytes, show_progress=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert list(manifest["shards"]) == ["shard_00000.safetensors"] and not manifest["complete"]
    assert len(manifest["plan"]) >= 3
    assert not list(folder.glob("*.tmp*"))  # nothing half-written left behind
    second = Counting(backbone)
    done = build_cache(second, (1,), ds, folder, "bfloat16", 40, shard_bytes, show_progress=False)
    assert done["complete"] and second.calls == whole.calls - calls0  # shard 0 was not recomputed
    for name in done["shards"]:
        for k, v in load_file(folder / name).items():
            assert torch.equal(v, load_file(tmp_path / "whole" / name)[k]), (name, k)
    again = Counting(backbone, fail_after=0)
    build_cache(again, (1,), ds, folder, "bfloat16", 40, shard_bytes, show_progress=False)
    assert again.calls == 0
    meta = cache_meta(backbone, (1,), ds, "bfloat16")
    item = CachedHiddenDataset(ds, folder, meta)[5]
    assert item["hidden"].shape == (len(item["input_ids"]), 2, 64) and item["hidden"].dtype == torch.bfloat16


def test_reuse_without_backbone_and_mismatch_errors(tmp_path, backbone):
    ds = _dataset()
    root = tmp_path / "hidden"
    _, stats = offline_datasets(backbone, (), {"train": ds}, root, "bfloat16", 4, show_progress=False)
    folder = root / cache_meta(backbone, (), ds, "bfloat16")["key"]
    never = Counting(backbone, fail_after=0)
    _, again = offline_datasets(never, (), {"train": ds}, root, "bfloat16", 4, show_progress=False)
    assert (
        never.calls == 0 and again["train"]["reused"] and again["train"]["bytes"] == stats["train"]["bytes"]
    )

    other_backbone = tiny_backbone(seed=1)  # same shapes and tokenizer, other weights
    with pytest.raises(HiddenCacheError, match="backbone_fingerprint"):
        CachedHiddenDataset(ds, folder, cache_meta(other_backbone, (), ds, "bfloat16"))
    other_ds = _dataset(seed=1)
    with pytest.raises(HiddenCacheError, match="dataset_hash"):
        CachedHiddenDataset(other_ds, folder, cache_meta(backbone, (), other_ds, "bfloat16"))
    with pytest.raises(HiddenCacheError, match="dtype"):
        CachedHiddenDataset(ds, folder, cache_meta(backbone, (), ds, "float16"))

    shard = folder / "shard_00000.safetensors"  # a shard with a row missing: caught on load
    tensors = load_file(shard)
    n = int(tensors["offsets"][-2])
    save_file(
        {
            "hidden": tensors["hidden"][:n],
            "offsets": tensors["offsets"][:-1],
            "row_ids": tensors["row_ids"][:-1],
        },
        str(shard),
    )
    with pytest.raises(HiddenCacheError, match="does not match the dataset rows"):
        CachedHiddenDataset(ds, folder, cache_meta(backbone, (), ds, "bfloat16"))


# EAGLE-1 reads the same one-feature cache as Medusa through the pipeline (its batches: test_cached_batches_equal_online)
@pytest.mark.parametrize("method", ["eagle3", "medusa"])
def test_offline_pipeline_trains_the_online_drafter(tmp_path, method):
    data = write_chat_file(tmp_path / "chat.jsonl")
    short = {"train.max_steps": 4, "train.eval_every": 2, "train.save_every": 4}
    base = [
        o
        for o in train_overrides(tmp_path / "x", data, tmp_path / "cache", **short)
        if ("num_heads" not in o or method == "medusa") and not o.startswith("run_dir=")
    ]
    if method == "eagle3":
        base += ["method=eagle3", "method.draft_vocab_size=48", "method.ttt_steps=2"]
    script = f"train/{registry.get(method).entry}.py"
    run_train([*base, f"run_dir={tmp_path / 'online'}"], script=script)
    offline = [*base, "method.hidden_cache=offline", "method.hidden_cache_dtype=float32"]
    res = run_train([*offline, f"run_dir={tmp_path / 'offline'}"], script=script)
    assert "hidden cache train" in res.stderr + res.stdout and "(built)" in res.stderr + res.stdout
    online_w = load_file(tmp_path / "online" / "drafter" / "model.safetensors")
    offline_w = load_file(tmp_path / "offline" / "drafter" / "model.safetensors")
    assert online_w.keys() == offline_w.keys()
    for k, v in online_w.items():
        torch.testing.assert_close(offline_w[k], v, atol=1e-4, rtol=1e-4, msg=k)
    meta = json.loads((tmp_path / "offline" / "drafter" / "config.json").read_text())
    hidden = meta["data_stats"]["hidden_cache"]
    assert hidden["train"]["bytes"] > 0 and hidden["eval"]["gb"] >= 0 and not hidden["train"]["reused"]
    res = run_train([*offline, f"run_dir={tmp_path / 'again'}"], script=script)  # another run
    assert "(built)" not in res.stderr + res.stdout and "(reused)" in res.stderr + res.stdout
