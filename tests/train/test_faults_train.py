"""Faults and bad inputs around a training run: each gives one clear line and exit code 2, or a
warning and a safe result, and leaves the run folder in a stated state."""

from __future__ import annotations

import json
import shutil

from helpers import run_train, train_overrides, write_chat_file


def one_line_error(res, *needles: str) -> str:
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), line
    for needle in needles:
        assert needle in line, line
    return line


def test_rerun_of_a_finished_run_keeps_its_final_eval(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3})
    run_train(over)
    before = json.loads((run_dir / "final_eval.json").read_text())
    assert "eval/loss" in before
    run_train(over)  # nothing left to train
    assert json.loads((run_dir / "final_eval.json").read_text()) == before


def test_resume_never_moves_the_previous_run_aside(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    run_train(train_overrides(run_dir, data, tmp_path / "cache"))  # checkpoints 3 and 6
    fresh = {"train.max_steps": 3, "train.resume": "never", "method.num_heads": 3}
    res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **fresh))
    (aside,) = tmp_path.glob("run.replaced-*")
    assert f"moved the previous run's checkpoints and drafter to {aside}" in res.stdout + res.stderr
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]
    assert json.loads((aside / "drafter" / "config.json").read_text())["step"] == 6
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000003"]
    # resume=auto continues the NEW run (3 heads, step 3), not the old run's step 6
    res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **{**fresh, "train.resume": "auto"}))
    assert "step_00000003 at step 3" in res.stdout + res.stderr
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["method_config"]["num_heads"] == 3


def test_changed_hyperparameter_on_resume_is_refused_listing_it(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3}))
    config_before = (run_dir / "config.json").read_text()
    changed = {"train.max_steps": 6, "optim.lr": 5e-3, "train.seed": 7}
    res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **changed), check=False)
    one_line_error(res, "optim.lr: 0.001 -> 0.005", "train.seed: 0 -> 7", "train.resume=never")
    assert "max_steps" not in res.stderr.splitlines()[-1]  # allowed to change
    assert (run_dir / "config.json").read_text() == config_before  # nothing rewritten
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000003"]


def test_truncated_or_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(run_dir, data, tmp_path / "cache", **{"train.keep_checkpoints": 0})
    run_train(over)
    newest = run_dir / "checkpoints" / "step_00000006"
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated (a full disk, an interrupted copy)
    (newest / "optimizer.bin").unlink()
    res = run_train(over)
    log = res.stdout + res.stderr
    assert f"checkpoint {newest} is damaged or incomplete (model.safetensors has 100 bytes" in log
    assert "step_00000003 at step 3" in log
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["step"] == 6
    # no complete checkpoint at all: refused, naming the fix
    for step in ("step_00000003", "step_00000006"):
        (run_dir / "checkpoints" / step / "scheduler.bin").write_bytes(b"")
    res = run_train(over, check=False)
    one_line_error(res, "none of its 2 checkpoint(s) is complete", "train.resume=never")


def test_empty_run_config_json_still_resumes_checked_against_the_checkpoint(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3}))
    (run_dir / "config.json").write_text("")
    res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 6}))
    assert "step_00000003 at step 3" in res.stdout + res.stderr
    assert json.loads((run_dir / "config.json").read_text())["train"]["max_steps"] == 6
    shutil.rmtree(run_dir / "checkpoints" / "step_00000006")
    (run_dir / "config.json").write_text("")
    res = run_train(
        train_overrides(run_dir, data, tmp_path / "cache", **{"method.num_heads": 3}), check=False
    )
    one_line_error(res, "method.num_heads: 2 -> 3")
