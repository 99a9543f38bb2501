"""Shared by the stage tests: a run's per-bin p5 history written by hand."""

from __future__ import annotations

import pytest


def write_p5(runtime, step: int, p5_by_bin: dict[int, float]) -> None:
    """bin_stats rows of `step` for runtime.run_id, n 50, p5 as given (what the controller reads)."""
    with runtime.store.connect() as conn:
        for b, p5 in p5_by_bin.items():
            conn.execute(
                "INSERT INTO bin_stats (run_id, step, bin, n, p5) VALUES (?, ?, ?, 50, ?)",
                [runtime.run_id, step, b, p5],
            )


@pytest.fixture
def set_p5():
    """write_p5, for a test to call: set_p5(runtime, step, {bin: p5})."""
    return write_p5
