"""scripts/bench.py's table: what it says about a row's blocks (no timing here: the samples are given)."""

from __future__ import annotations

import bench


def _row(samples: list[float], block_runs: int | None) -> bench.Row:
    row = bench.Row("m", "edgepack untuned", 2, sorted(samples)[len(samples) // 2], samples, block_runs=block_runs)
    row.ratio = 0.8
    return row


def test_block_spread_shows_a_row_whose_processes_ran_at_two_speeds():
    fast, slow = [3.0, 3.1, 3.2], [5.9, 6.0, 6.1]  # three runs a block: medians 3.1 and 6.0
    row = _row(fast * 4 + slow * 4, block_runs=3)
    assert bench.block_spread(row) == "3.10-6.00"
    steady = _row(fast * 8, block_runs=3)
    assert bench.block_spread(steady) == "3.10-3.10"


def test_block_spread_needs_blocks():
    assert bench.block_spread(_row([3.0] * 9, block_runs=3)) == "-"  # three blocks: no quartiles
    assert bench.block_spread(_row([3.0] * 40, block_runs=None)) == "-"  # processing rows: one process


def test_markdown_table_has_the_block_column():
    text = bench.render_markdown([_row([3.0, 3.1, 3.2] * 4, block_runs=3)], {})
    header, _rule, line = text.splitlines()
    assert "blocks p25-p75 ms" in header
    assert header.count("|") == line.count("|")
    assert "| 3.10-3.10 |" in line
