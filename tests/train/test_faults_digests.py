"""Same-size damage (flipped bytes) in what a run wrote is caught by content digests (headstart/digests.py), where
a size check cannot: a damaged checkpoint falls back to the previous one, a damaged tokenized-data cache or
hidden-state shard is rebuilt, a damaged drafter is refused at export and eval, each naming the file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file
from test_faults_train import one_line_error
from test_hidden_cache import Counting, _dataset

from headstart.data.cache import load_splits
from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import CheckpointError, build_drafter, load_drafter, save_drafter
from headstart.models.medusa import MedusaConfig
from headstart.train.hidden_cache import CachedHiddenDataset, build_cache, cache_meta
from helpers import run_train, train_overrides, write_chat_file


def flip(path: Path, at: float = 0.6, n: int = 16) -> None:
    """Invert n bytes at a fraction of the file, past any header: the size stays the same."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i : i + n] = bytes(b ^ 0xFF for b in data[i : i + n])
    path.write_bytes(bytes(data))


def test_bit_rotted_newest_checkpoint_falls_back_to_the_previous_naming_the_file(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(run_dir, data, tmp_path / "cache", **{"train.keep_checkpoints": 0})
    run_train(over)
    newest = run_dir / "checkpoints" / "step_00000006"
    size = (newest / "model.safetensors").stat().st_size
    flip(newest / "model.safetensors")
    assert (newest / "model.safetensors").stat().st_size == size
    res = run_train(over)
    log = res.stdout + res.stderr
    assert f"checkpoint {newest} is damaged or incomplete (model.safetensors was changed after it was" in log
    assert "step_00000003 at step 3" in log  # resumed from the previous one, retrained 4..6
    state = json.loads((newest / "trainer_state.json").read_text())
    assert state["step"] == 6 and len(state["digests"]) == len(state["files"])  # rewritten whole


def test_damaged_tokenized_cache_is_rebuilt_with_a_warning(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 1, "train.save_every": 1})
    run_train(over)
    (cache,) = (tmp_path / "cache" / "data" / "tokenized").glob("*.safetensors")
    good = {s: {k: np.array(v) for k, v in arrays.items()} for s, arrays in load_splits(cache)[0].items()}
    flip(cache, at=0.9, n=4)  # token ids: still valid safetensors, still in-vocabulary ids after the flip
    res = run_train([*over[:-1], "method.num_heads=2", f"run_dir={tmp_path / 'run2'}"])
    log = res.stdout + res.stderr
    assert f"data cache {cache} is unreadable (its arrays were changed after it was written" in log
    assert "rebuilding it" in log
    rebuilt = load_splits(cache)[0]  # digest-checked: whole again, and the same rows
    assert all(np.array_equal(rebuilt[s][k], good[s][k]) for s in good for k in good[s])


def test_damaged_drafter_weights_are_refused_at_load_naming_the_file(backbone, tmp_path):
    tiny = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})
    cfg = MedusaConfig(num_heads=2)
    heads = build_drafter("medusa", cfg, backbone)
    folder = save_drafter(tmp_path / "drafter", heads, "medusa", cfg, tiny, backbone)
    load_drafter(folder, backbone)  # intact: loads
    flip(folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors: model.safetensors was changed after it"):
        load_drafter(folder, backbone)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "manifest"])
def test_damaged_hidden_state_shard_is_rebuilt_with_a_warning(tmp_path, backbone, caplog, damage):
    ds, folder = _dataset(), tmp_path / "hidden"
    shard_bytes = 4 * 16 * 2 * 64 * 2  # several shards
    build_cache(backbone, (1,), ds, folder, "bfloat16", 40, shard_bytes, show_progress=False)
    shard = folder / "shard_00001.safetensors"
    good = {k: v.clone() for k, v in load_file(shard).items()}  # load_file maps the file: copy it
    if damage == "flipped":
        flip(shard, at=0.8)
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-100])
    else:
        (folder / "manifest.json").write_text('{"plan": ')
    again = Counting(backbone)
    with caplog.at_level(logging.WARNING, logger="headstart.train"):
        done = build_cache(again, (1,), ds, folder, "bfloat16", 40, shard_bytes, show_progress=False)
    name = f"manifest {folder / 'manifest.json'}" if damage == "manifest" else f"shard {shard} is damaged"
    assert name in caplog.text and "rebuilding" in caplog.text
    assert done["complete"] and again.calls > 0
    rebuilt = load_file(shard)
    assert all(np.array_equal(rebuilt[k].float().numpy(), good[k].float().numpy()) for k in good)
    CachedHiddenDataset(ds, folder, cache_meta(backbone, (1,), ds, "bfloat16"))  # opens cleanly
    untouched = Counting(backbone, fail_after=0)  # and the next start reuses it without the backbone
    build_cache(untouched, (1,), ds, folder, "bfloat16", 40, shard_bytes, show_progress=False)


def test_checkpoint_refused_outright_when_every_one_is_damaged(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(run_dir, data, tmp_path / "cache", **{"train.keep_checkpoints": 0})
    run_train(over)
    for step in ("step_00000003", "step_00000006"):
        flip(run_dir / "checkpoints" / step / "optimizer.bin")
    one_line_error(
        run_train(over, check=False), "none of its 2 checkpoint(s) is complete", "train.resume=never"
    )
