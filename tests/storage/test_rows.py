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


def test_step_metrics_replace_by_name_within_their_step_only(tmp_path):
    """One step's names are replaced together; other names, steps and runs keep theirs; an
    int is stored as a float and an empty mapping writes nothing."""
    from sparrow.storage.run_rows import step_metrics

    with Store.open_writer(tmp_path) as store:
        with store.connect() as conn:
            replace_step_metrics(conn, "r", 1, {"a": 1.0, "b": 2, "c": float("inf")})
            replace_step_metrics(conn, "r", 2, {"a": 5.0})
            replace_step_metrics(conn, "s", 1, {"a": 7.0})
            replace_step_metrics(conn, "r", 1, {"a": 3.0, "d": None})
            replace_step_metrics(conn, "r", 1, {})
        assert step_metrics(store, "r", 1) == {"a": 3.0, "b": 2.0, "c": None, "d": None}
        assert step_metrics(store, "r", 2) == {"a": 5.0}
        assert step_metrics(store, "s", 1) == {"a": 7.0}


def test_sample_stats_take_numpy_scalars_and_replace_their_step(tmp_path):
    """Rows as aggregate_mismatch builds them (numpy scalars, None for unknown roles) come
    back as written, in order; writing a step again replaces that step's rows only."""
    import numpy as np

    from sparrow.storage.mismatch_rows import SAMPLE_COLUMNS, replace_sample_stats

    def row(i: int) -> dict:
        out = dict.fromkeys(SAMPLE_COLUMNS)
        out.update(
            prompt=np.int64(i // 2), sample=i % 2, tokens=np.int32(10 + i),
            mismatch_sum=np.float32(0.5 * i), min_acceptance=np.float64(0.25), estimator="exact",
        )  # fmt: skip
        return out

    with Store.open_writer(tmp_path) as store:
        with store.connect() as conn:
            replace_sample_stats(conn, "r", 1, [row(i) for i in range(4)])
            replace_sample_stats(conn, "r", 2, [row(i) for i in range(3)])
            replace_sample_stats(conn, "r", 1, [row(i) for i in range(2)])
            got = conn.execute(
                "SELECT step, prompt, sample, tokens, mismatch_sum, lookup_tokens, estimator "
                "FROM sample_stats ORDER BY step, prompt, sample"
            ).fetchall()
    assert got == [
        (1, 0, 0, 10, 0.0, None, "exact"),
        (1, 0, 1, 11, 0.5, None, "exact"),
        (2, 0, 0, 10, 0.0, None, "exact"),
        (2, 0, 1, 11, 0.5, None, "exact"),
        (2, 1, 0, 12, 1.0, None, "exact"),
    ]


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
