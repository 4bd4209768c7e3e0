"""train/curve.py: finished runs -> a table and a plot of held-out accuracy / measured tau vs conversations."""

from __future__ import annotations

import json

import pytest

from headstart.train.curve import main, read_run


def _run(folder, samples: int, acc: list[float], tau: float, dev: float | None = None):
    (folder / "drafter").mkdir(parents=True)
    meta = {"step": 10, "data_stats": {"train": {"samples": samples}}}
    (folder / "drafter" / "config.json").write_text(json.dumps(meta))
    final = {"measured/tau": tau, **{f"eval/head{k}/top1": a for k, a in enumerate(acc)}}
    (folder / "final_eval.json").write_text(json.dumps(final))
    if dev is not None:
        (folder / "eval").mkdir()
        (folder / "eval" / "report.json").write_text(json.dumps({"tau": dev}))
    return folder


def test_runs_are_read_sorted_and_plotted(tmp_path, capsys):
    big = _run(tmp_path / "b", 3000, [0.4, 0.25], 1.6, dev=1.5)
    small = _run(tmp_path / "a", 300, [0.3, 0.15], 1.4)
    (tmp_path / "unfinished").mkdir()
    assert read_run(tmp_path / "unfinished") is None
    assert read_run(big)["accuracy"] == [0.4, 0.25] and read_run(big)["dev_tau"] == 1.5
    main([str(big), str(small), str(tmp_path / "unfinished"), "--out", str(tmp_path / "c.png")])
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("| 300 |") and out[3].startswith("| 3000 |") and "0.400 / 0.250" in out[3]
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_no_finished_run_is_one_clear_error(tmp_path):
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
