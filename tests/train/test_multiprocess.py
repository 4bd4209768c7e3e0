"""Two CPU processes over gloo (torchrun -> accelerate MULTI_CPU) against one process with the same global
batch: same heads after N steps, and the ranks saw different rows. A crashing rank ends the whole run."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file

from helpers import run_train, train_overrides, write_chat_file


def rows_by_step(trace_file):
    out = {}
    for line in trace_file.read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["step"], []).extend(rec["rows"])
    return out


@pytest.mark.parametrize("grouped", ["false", "true"])
def test_two_processes_match_one_with_same_global_batch(tmp_path, grouped):
    """grouped: train.group_by_length's groups are global micro-batches, so the ranks split the same rows."""
    data = write_chat_file(tmp_path / "chat.jsonl", n=60, varied=True)
    extra = {"train.max_steps": 5, "train.trace_rows": "true", "train.eval_every": 100, "train.save_every": 5}
    extra["train.group_by_length"] = grouped
    one = tmp_path / "one"
    run_train(train_overrides(one, data, tmp_path / "cache", **{**extra, "train.micro_batch_size": 4}))
    two = tmp_path / "two"
    run_train(
        train_overrides(two, data, tmp_path / "cache", **{**extra, "train.micro_batch_size": 2}), nproc=2
    )

    r0, r1 = rows_by_step(two / "trace" / "rank0.jsonl"), rows_by_step(two / "trace" / "rank1.jsonl")
    single = rows_by_step(one / "trace" / "rank0.jsonl")
    for step in range(5):
        assert not set(r0[step]) & set(r1[step]), "both ranks trained on the same rows"
        assert sorted(r0[step] + r1[step]) == sorted(single[step]), "global batch differs from 1 process"

    a = load_file(one / "drafter" / "model.safetensors")
    b = load_file(two / "drafter" / "model.safetensors")
    for k in a:
        assert a[k].abs().sum() > 0 or "lm_heads" in k
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_a_crashing_rank_does_not_hang_the_run(tmp_path):
    data = write_chat_file(tmp_path / "chat.jsonl", n=60)
    over = train_overrides(
        tmp_path / "run",
        data,
        tmp_path / "cache",
        **{"train.max_steps": 50, "train.micro_batch_size": 2, "train.dist_timeout_s": 60},
    )
    t0 = time.time()
    res = run_train(over, nproc=2, check=False, timeout=170, script="tests/train/crash_rank1.py")
    assert res.returncode != 0
    assert "injected crash on rank 1" in res.stderr
    assert time.time() - t0 < 150
