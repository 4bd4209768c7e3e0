"""Settings that were clamped, ignored or found late, and the last raw tracebacks of a training run: each is now
one line (exit code 2, or 130 for Ctrl-C) naming the fix, checked before training where it can be, and the run
folder is left as it was."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults_train import one_line_error

from headstart.errors import exit_on_user_error
from headstart.eval.stage.config import EvalConfig
from headstart.eval.timing.harness import TimingConfig
from headstart.models.eagle_config import Eagle3Config
from headstart.models.medusa import MedusaConfig, MedusaHeads
from headstart.train.checkpoints import save_checkpoint
from headstart.train.config import OptimConfig
from helpers import REPO, ctrl_c_default, env, run_train, train_overrides, write_chat_file


def test_draft_vocab_larger_than_the_vocabulary_is_refused_not_clamped(tmp_path):
    with pytest.raises(ValueError, match=r"draft_vocab_size=100000 is more than .* \(259 ids\). Fix: "):
        MedusaHeads(MedusaConfig(draft_vocab_size=100000), 64, 259)
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(run_dir, data, tmp_path / "cache", **{"method.draft_vocab_size": 100000})
    one_line_error(run_train(over, check=False), "method.draft_vocab_size=100000", "at most 259")
    assert not (run_dir / "checkpoints").exists()


def test_rerun_of_a_finished_run_with_fewer_max_steps_is_refused(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    run_train(train_overrides(run_dir, data, tmp_path / "cache"))  # 6 steps
    config = (run_dir / "config.json").read_text()
    res = run_train(train_overrides(run_dir, data, tmp_path / "cache", **{"train.max_steps": 3}), check=False)
    one_line_error(res, "holds checkpoint step_00000006, past train.max_steps=3", "train.max_steps=6")
    assert (run_dir / "config.json").read_text() == config  # still says 6, as the drafter is
    assert json.loads((run_dir / "drafter" / "config.json").read_text())["step"] == 6


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("train.save_every=0", ("train.save_every=0: must be >= 1", "Fix: train.save_every=6")),
        ("data.eval_rows=0", ("data.eval_rows=0", "Fix: data.eval_rows=1 or more")),
        ("optim.lr=nan", ("optim.lr=nan: must be a finite number > 0", "Fix: optim.lr=")),
        ("method.num_heads=0", ("method.num_heads=0: must be in 1..16", "Fix: method.num_heads=4")),
    ],
)
def test_bad_settings_are_refused_before_training_naming_the_fix(tmp_path, override, needles):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    res = run_train([*train_overrides(run_dir, data, tmp_path / "cache"), override], check=False)
    one_line_error(res, *needles)
    assert not (run_dir / "checkpoints").exists() and not (tmp_path / "cache").exists()


def test_cache_dir_that_cannot_be_created_is_one_line(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    (tmp_path / "a_file").write_text("x")
    res = run_train(train_overrides(run_dir, data, tmp_path / "a_file" / "cache"), check=False)
    one_line_error(res, f"cache_dir={tmp_path / 'a_file' / 'cache'}", "HEADSTART_CACHE")


@pytest.mark.parametrize(
    ("build", "needles"),
    [
        (lambda: TimingConfig(threads=-1), ("timing.threads=-1: must be >= 0", "Fix: timing.threads=0")),
        (
            lambda: Eagle3Config(ttt_steps=0),
            ("method.ttt_steps=0: must be in 1..16", "Fix: method.ttt_steps=3"),
        ),
        (lambda: EvalConfig(max_new_tokens=0), ("max_new_tokens=0: must be >= 1", "Fix: max_new_tokens=128")),
        (lambda: OptimConfig(lr=float("nan")), ("optim.lr=nan", "Fix: optim.lr=1e-3")),
    ],
)
def test_validation_messages_name_the_fix(build, needles):
    with pytest.raises(ValueError) as e:
        build()
    assert all(n in str(e.value) for n in needles), str(e.value)


class FullDisk:
    """accelerate's save_state as it fails on a full disk (torch.save's RuntimeError)."""

    is_main_process = True

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, folder: str) -> None:
        (Path(folder) / "model.safetensors").write_bytes(b"x" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing "
                           "file data/3: file write failed; unexpected pos 2048 vs 4096")  # fmt: skip


def test_disk_full_while_saving_is_one_line_and_the_previous_checkpoint_stays(tmp_path, capsys):
    previous = tmp_path / "checkpoints" / "step_00000003"
    previous.mkdir(parents=True)
    (previous / "trainer_state.json").write_text('{"step": 3}')
    with pytest.raises(OSError) as e:
        save_checkpoint(FullDisk(), tmp_path, 6, lambda folder: None)
    tmp = tmp_path / "checkpoints" / "step_00000006.tmp"
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp)
    assert not tmp.exists()  # its space given back
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000003"]
    with pytest.raises(SystemExit) as code, exit_on_user_error():
        raise e.value
    assert code.value.code == 2
    line = capsys.readouterr().err.strip()
    assert (
        line
        == f"error: disk full at {tmp} (No space left on device). Fix: free space there, or write elsewhere"
    )


def test_ctrl_c_stops_with_one_line_naming_the_last_checkpoint(tmp_path):
    data, run_dir = write_chat_file(tmp_path / "chat.jsonl"), tmp_path / "run"
    over = train_overrides(
        run_dir, data, tmp_path / "cache", **{"train.max_steps": 100_000, "train.save_every": 2}
    )
    proc = subprocess.Popen(
        [sys.executable, "train/medusa.py", *over],
        cwd=REPO,
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_default,
    )
    # Any checkpoint: older ones are pruned as new ones land, so a fixed step can come and go between polls.
    deadline = time.time() + 240
    while not list((run_dir / "checkpoints").glob("step_*[0-9]/trainer_state.json")):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped (Ctrl-C): the last checkpoint is ") and "rerun the same command" in last
    named = Path(last.split("the last checkpoint is ")[1].split(". Fix")[0])
    assert named.parent == run_dir / "checkpoints" and (named / "trainer_state.json").is_file()
