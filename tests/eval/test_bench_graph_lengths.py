"""eval/bench/graph_lengths.py: the three compiled step paths timed side by side, on the tests' tiny model."""

from __future__ import annotations

import pytest

from headstart.eval.bench import graph_lengths


@pytest.mark.slow
def test_it_times_each_path_over_its_own_slots(capsys):
    graph_lengths.main(
        ["--backbone", "tiny", "--widths", "2", "--contexts", "70", "--reps", "1", "--threads", "1"]
        + ["--max-cache-len", "512"]
    )
    line = capsys.readouterr().out.strip()
    # 70 cached + 2: the specialized and bucketed graphs attend over 256 slots, the decoder's over 128
    assert line.startswith("70 cached, width 2: specialized ")
    assert (
        "(256 slots), one graph, buckets" in line and "one graph, rounded" in line and "(128 slots)" in line
    )
    assert line.count("ms (") == 3 and "vs specialized: " in line
