"""The train flow's per-step table: cells read from step metrics, header once, resumed mark.

Run: `python -m pytest tests/flows/test_live_table.py -q`.
"""

from __future__ import annotations

import io

from rich.console import Console

from sparrow.flows.live_table import COLUMNS, LiveTable, format_cell


def test_rows_show_the_step_metrics_and_the_header_once():
    out = io.StringIO()
    table = LiveTable(Console(file=out, width=200))
    metrics = {
        "reward/mean": 0.25,
        "response/length_mean": 103.26,
        "mismatch/min_p5": 0.8571,
        "schedule/pages_read_mean": 5.5,
        "rollout/tokens_per_s": 1234.4,
        "time/rollout_s": 12.04,
        "reward/errors": 3.0,
        "eval/accuracy": 0.625,
    }
    first = table.row(1, metrics, resumed=True)
    assert first == [
        "1",
        "0.250",
        "3",
        "103.3",
        "0.857",
        "5.50",
        "1234",
        "12.0",
        "-",
        "-",
        "-",
        "0.625",
        "resumed",
    ]
    second = table.row(2, {"reward/mean": float("nan")}, resumed=False)
    assert second[:2] == ["2", "-"] and second[-1] == ""
    lines = out.getvalue().splitlines()
    assert sum("reward" in line and "min p5" in line for line in lines) == 1
    assert len(lines) == 3 and lines[1].split()[:4] == ["1", "0.250", "3", "103.3"]
    assert len(first) == len(COLUMNS) + 2


def test_format_cell():
    assert format_cell(None, "{:.1f}") == "-" and format_cell(float("nan"), "{:.1f}") == "-"
    assert format_cell(0.86, "{:.3f}") == "0.860"


def test_the_header_prints_at_once_and_rows_line_up_under_it():
    out = io.StringIO()
    table = LiveTable(Console(file=out, width=200))
    table.header()
    assert out.getvalue().split()[:3] == ["step", "reward", "rw"]
    table.header()  # once only
    table.row(1, {"reward/mean": 0.5}, resumed=False)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and sum("min p5" in line for line in lines) == 1
    # the cell sits under its column's header
    assert lines[1].index("0.500") + len("0.500") == lines[0].index("reward") + len("reward")
