"""Fault injection over every file a training run writes: each is truncated, then (restored and) damaged at
the same size, and the code that reads it back is run. The outcome must be one of: fell back with a warning
naming the file, rebuilt with a warning naming the file, or refused in one line naming the file. Nothing
proceeds silently. (One training run, then the readers in-process: the resume search, the drafter loader that
eval and export use, the tokenized-data cache, decoding.json, the eval report an export quotes, final_eval.json,
and the exported layouts: the push, and the export that replaces them.)"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from test_faults_digests import flip

from headstart.data.build import _load_cached
from headstart.models.checkpoint import FINAL_EVAL, CheckpointError, load_drafter, read_final_eval, read_meta
from headstart.models.decoding import read_decoding, write_decoding
from headstart.models.export import export
from headstart.models.export.card import find_report
from headstart.models.export.hub import HubError, push_folder
from headstart.models.export.publish import SUMS, damage
from headstart.models.export.serve_card import find_serve_check
from headstart.train.checkpoints import find_resume_dir
from helpers import run_train, train_overrides, write_chat_file

DAMAGES = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "flipped": lambda p: flip(p, at=0.5, n=8),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("walk")
    data, run_dir = write_chat_file(root / "chat.jsonl"), root / "run"
    run_train(train_overrides(run_dir, data, root / "cache", **{"train.keep_checkpoints": 0}))
    return run_dir


def damaged(path: Path, how: str):
    """Damage `path` for the block, then restore it."""
    good = path.read_bytes()
    DAMAGES[how](path)
    assert path.read_bytes() != good
    return good


def each_file(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*")) if p.is_file()]


@pytest.mark.parametrize("how", list(DAMAGES))
def test_every_checkpoint_file_damaged_falls_back_naming_it(run, caplog, how):
    newest = run / "checkpoints" / "step_00000006"
    files = each_file(newest)
    assert {"model.safetensors", "optimizer.bin", "trainer_state.json", "drafter/model.safetensors"} <= {
        str(p.relative_to(newest)) for p in files
    }
    for path in files:
        good = damaged(path, how)
        try:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="headstart.train"):
                chosen = find_resume_dir(run, "auto")
        finally:
            path.write_bytes(good)
        assert chosen == run / "checkpoints" / "step_00000003", path
        rel = str(path.relative_to(newest))
        named = (
            rel in caplog.text or path.name == "trainer_state.json" and "trainer_state.json" in caplog.text
        )
        assert f"checkpoint {newest} is damaged or incomplete" in caplog.text and named, (rel, caplog.text)
    assert find_resume_dir(run, "auto") == newest  # all restored


@pytest.mark.parametrize("how", list(DAMAGES))
def test_every_drafter_file_damaged_is_refused_naming_it(run, backbone, how):
    drafter = run / "drafter"
    for path in each_file(drafter):
        good = damaged(path, how)
        try:
            with pytest.raises((CheckpointError, FileNotFoundError)) as e:
                load_drafter(drafter, backbone, read_meta(drafter))
        finally:
            path.write_bytes(good)
        assert str(path) in str(e.value) and "Fix:" in str(e.value), (path, str(e.value))
    load_drafter(drafter, backbone)  # all restored


@pytest.mark.parametrize("how", list(DAMAGES))
def test_damaged_tokenized_cache_is_rebuilt_naming_it(run, caplog, how):
    (cache,) = (run.parent / "cache" / "data" / "tokenized").glob("*.safetensors")
    good = damaged(cache, how)
    try:
        with caplog.at_level(logging.WARNING):
            assert _load_cached(cache) is None  # build_datasets then rebuilds it
    finally:
        cache.write_bytes(good)
    assert f"data cache {cache} is unreadable" in caplog.text and "rebuilding it" in caplog.text
    assert _load_cached(cache) is not None


@pytest.mark.parametrize("how", list(DAMAGES))
def test_damaged_decoding_json_warns_and_uses_the_defaults(tmp_path, caplog, how):
    path = write_decoding(tmp_path, {"decoder": {"tree": "chain", "num_draft_tokens": 3}, "chain": 3})
    damaged(path, how)
    with caplog.at_level(logging.WARNING):
        assert read_decoding(tmp_path) is None
    assert str(path) in caplog.text and "rerun the tuner" in caplog.text


QUOTED = {  # the reports the model cards quote, with a reader each
    "eval/report.json": (find_report, {"tau": 2.0, "speedup": 1.5, "prompts": 4}),
    "serve_check/serve_check.json": (find_serve_check, {"k": 2, "passed": True, "prompts": 4}),
}


@pytest.mark.parametrize("how", list(DAMAGES))
@pytest.mark.parametrize("name", list(QUOTED))
def test_damaged_report_is_refused_at_export_naming_it(run, tmp_path, name, how):
    drafter = tmp_path / "run" / "drafter"
    shutil.copytree(run / "drafter", drafter)
    read, content = QUOTED[name]
    report = drafter.parent / name
    report.parent.mkdir()
    report.write_text(json.dumps(content))
    damaged(report, how)
    with pytest.raises(ValueError, match=f"{report.name} is unreadable") as e:
        read(drafter)
    assert str(report) in str(e.value) and "Fix:" in str(e.value)


@pytest.mark.parametrize("how", list(DAMAGES))
def test_damaged_final_eval_falls_back_to_the_drafters_figures_naming_it(run, caplog, how):
    path = run / FINAL_EVAL
    figures = json.loads(path.read_text())
    assert figures and read_final_eval(run) == figures
    good = damaged(path, how)
    try:
        with caplog.at_level(logging.WARNING, logger="headstart.models"):
            assert read_final_eval(run) == figures  # the same figures, from drafter/config.json
    finally:
        path.write_bytes(good)
    assert f"{path} is" in caplog.text and "drafter/config.json" in caplog.text


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> list[Path]:
    return export(run, tmp_path_factory.mktemp("exports") / "export")


@pytest.mark.parametrize("how", list(DAMAGES))
def test_every_export_file_damaged_is_refused_at_push_naming_it(exported, monkeypatch, how):
    uploads = []

    class Hub:
        def create_repo(self, *a, **k):
            uploads.append(a)

        def upload_folder(self, **k):
            uploads.append(k)

    monkeypatch.setattr("huggingface_hub.HfApi", Hub)
    files = [p for folder in exported for p in each_file(folder)]
    assert {p.name for p in files} >= {SUMS, "config.json", "README.md"}
    for path in files:
        good = damaged(path, how)
        try:
            with pytest.raises(HubError) as e:
                push_folder(path.parent, "me/heads", private=False)
        finally:
            path.write_bytes(good)
        assert str(path) in str(e.value) and "Fix:" in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert uploads == []
    for folder in exported:  # all restored: it pushes
        push_folder(folder, "me/heads", private=False)
    assert len(uploads) == 2 * len(exported)


@pytest.mark.parametrize("how", list(DAMAGES))
def test_a_damaged_export_is_named_when_an_export_replaces_it(run, exported, caplog, how):
    path = exported[0] / "config.json"
    damaged(path, how)
    with caplog.at_level(logging.WARNING, logger="headstart.export"):
        again = export(run, exported[0].parent)
    assert again == exported and damage(path.parent) is None  # rebuilt whole
    assert f"the earlier export {path.parent} was damaged ({path} was changed" in caplog.text
