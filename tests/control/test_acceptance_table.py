"""The calibration table's bounds and trajectories per bin: the cluster bootstrap per (budget,
bin), the conservative side per statistic, the floor, and a file round trip."""

from __future__ import annotations

import numpy as np
import pytest

from sparrow.control.acceptance_table import table_from_tokens
from sparrow.mismatch.acceptance import BinFloor
from sparrow.mismatch.bootstrap import bootstrap_intervals
from sparrow.runtime.ledger.calibration_files import table_from_dict, table_to_dict


def _table():
    rng = np.random.default_rng(0)
    positions = np.tile(np.arange(10, 138), 12)  # 12 trajectories over bins 0-2 of 64
    trajectories = np.repeat(np.arange(12), 128)
    acceptance = [rng.uniform(0.5, 1.0, positions.size), rng.uniform(0.8, 1.0, positions.size)]
    table = table_from_tokens([4, 8], positions, acceptance, 64, trajectories=trajectories, seed=3)
    return table, positions, acceptance, trajectories


def test_bounds_are_the_cluster_bootstrap_of_each_cell():
    table, positions, acceptance, trajectories = _table()
    assert list(table.samples) == [12, 12, 12]
    for j in range(2):
        for i in range(3):
            mask = positions // 64 == i
            expected = bootstrap_intervals(acceptance[j][mask], trajectories[mask], seed=(3, j, i))
            assert (table.bounds["p5_lo"][j, i], table.bounds["p5_hi"][j, i]) == expected["p5"]
            assert table.bounds["p5_lo"][j, i] <= table.p5[j, i] <= table.bounds["p5_hi"][j, i]
    np.testing.assert_array_equal(table.conservative("p5"), table.bounds["p5_lo"])
    # lower is better for the share: its high bound, turned onto the higher-is-better axis
    np.testing.assert_array_equal(
        table.conservative("share_below_half"), 1.0 - table.bounds["share_below_half_hi"]
    )


def test_rows_mark_the_floor_and_the_estimator_and_the_file_round_trips():
    table, *_ = _table()
    rows = table.rows(BinFloor(min_tokens=100, min_samples=13))
    assert {r["counted"] for r in rows} == {False} and {r["estimator"] for r in rows} == {"exact"}
    assert {r["counted"] for r in table.rows(BinFloor(100, 12))} == {True}
    assert rows[0]["p5_lo"] == pytest.approx(table.bounds["p5_lo"][0, 0])
    back = table_from_dict(table_to_dict(table))
    np.testing.assert_array_equal(back.samples, table.samples)
    np.testing.assert_array_equal(back.bounds["p5_lo"], table.bounds["p5_lo"])
    # a table file from before the bounds: none, and the chooser reads the estimate
    old = {k: v for k, v in table_to_dict(table).items() if "_lo" not in k and "_hi" not in k}
    old.pop("samples")
    assert table_from_dict(old).conservative("p5") is None
