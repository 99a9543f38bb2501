"""The repository functions of sparrow/storage/: keys replace rather than duplicate, reads give plain
values back, and a column name that is not a statistic never reaches SQL."""

from __future__ import annotations

import pytest

from sparrow.storage import Store
from sparrow.storage.mismatch_rows import (
    BIN_COLUMNS,
    below_target_bins,
    replace_bin_stats,
    replace_threshold_events,
    statistic_history,
)
from sparrow.storage.run_rows import (
    last_step_of_stage,
    record_stage,
    replace_step_metrics,
    step_metric,
)
from sparrow.storage.schedule_rows import (
    insert_schedule,
    newest_schedule,
    schedule_in_force,
    stored_schedule,
)


def _bin_row(bin_: int, p5: float) -> dict:
    row = dict.fromkeys(BIN_COLUMNS)
    return {
        **row,
        "bin": bin_,
        "n": 10,
        "mean": 0.9,
        "p5": p5,
        "schedule_name": "s",
        "schedule_version": 1,
    }


def test_bin_stats_and_events_replace_one_step(tmp_path):
    with Store.open_writer(tmp_path) as store:
        for attempt in range(2):  # a re-run stage writes the same step again
            with store.connect() as conn:
                replace_bin_stats(
                    conn, "r", 3, [_bin_row(0, 0.5 + attempt / 10), _bin_row(1, 0.95)]
                )
                replace_threshold_events(conn, "r", 3, [(0, "below_target", 0.5, 0.86)])
        with store.connect() as conn:
            assert statistic_history(conn, "r", "p5", 3) == [(3, 0, 0.6), (3, 1, 0.95)]
            assert statistic_history(conn, "r", "p5", 2) == []
            assert below_target_bins(conn, "r", 3) == {0}
            with pytest.raises(ValueError, match="not a bin_stats statistic"):
                statistic_history(conn, "r", "p5 FROM bin_stats; --", 3)


def test_schedule_rows_round_trip_and_the_version_in_force(tmp_path):
    row = {
        "name": "s",
        "page_size": 16,
        "bin_tokens": 2000,
        "topk_pages": (4, 8),
        "reserved_bos": 1,
        "reserved_eos": 2,
        "skip_layers": (),
        "target": 0.86,
    }
    with Store.open_writer(tmp_path) as store, store.connect() as conn:
        insert_schedule(conn, row, 1, "r", 0, "initial")
        insert_schedule(conn, {**row, "topk_pages": (6, 8)}, 2, "r", 5, "raise")
        assert newest_schedule(conn, "s") == ({**row, "topk_pages": [6, 8], "skip_layers": []}, 2)
        assert schedule_in_force(conn, "s", "r", 1, 5)[1] == 1  # stored at step 5: from 6 on
        assert schedule_in_force(conn, "s", "r", 1, 6)[0]["topk_pages"] == [6, 8]
        assert schedule_in_force(conn, "s", "r", 3, 6) is None


def test_run_rows_metrics_and_stages(tmp_path):
    from datetime import datetime

    now = datetime(2026, 1, 1)
    with Store.open_writer(tmp_path) as store, store.connect() as conn:
        replace_step_metrics(conn, "r", 0, {"a": 1.0, "b": float("nan")})
        replace_step_metrics(conn, "r", 0, {"a": 2.0})
        assert (step_metric(conn, "r", 0, "a"), step_metric(conn, "r", 0, "b")) == (2.0, None)
        assert last_step_of_stage(conn, "r", "sync_weights") is None
        for step in (1, 2):
            record_stage(conn, "r", step, "sync_weights", now, now, 1.0, "/x")
        assert last_step_of_stage(conn, "r", "sync_weights") == 2


def test_a_schedule_keeps_its_scoring_rule_and_dense_heads(tmp_path):
    """selection and dense_heads go in and come back; a row from before them (NULL there)
    comes back without them: the schedule's defaults."""
    row = {
        "name": "q",
        "page_size": 16,
        "bin_tokens": 2000,
        "topk_pages": (2, 4),
        "reserved_bos": 1,
        "reserved_eos": 2,
        "skip_layers": (0,),
        "target": 0.86,
    }
    rule = {"selection": "quest_maxhead", "dense_heads": ((2, 0), (3, 1))}
    with Store.open_writer(tmp_path) as store, store.connect() as conn:
        insert_schedule(conn, {**row, **rule}, 1, "r", 0, "initial")
        insert_schedule(conn, {**row, "name": "old"}, 1, "r", 0, "initial")
        got, _ = schedule_in_force(conn, "q", "r", 1, 1)
        assert (got["selection"], got["dense_heads"]) == ("quest_maxhead", [[2, 0], [3, 1]])
        old, _ = newest_schedule(conn, "old")
        assert "selection" not in old and "dense_heads" not in old
    stored, _, _ = stored_schedule(tmp_path, "q")
    assert stored["dense_heads"] == [[2, 0], [3, 1]]
