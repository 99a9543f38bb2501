"""scripts/study_outcome.py's per-token query for p0.1, on a real token Parquet file."""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from sparrow.data.rollouts import RolloutRecord
from sparrow.sparse import Schedule
from sparrow.stages.aggregate_mismatch import token_table
from sparrow.storage.schema import token_view_sql

ROOT = Path(__file__).resolve().parents[2]


def _record(prompt: int, out_len: int) -> RolloutRecord:
    return RolloutRecord(
        prompt_index=prompt, sample_index=0, dataset_row=prompt, prompt_ids=(1,) * 3,
        output_ids=tuple(range(out_len)), actor_logprobs=(0.0,) * out_len,
        topk_ids=((0,),) * out_len, topk_logprobs=((0.0,),) * out_len,
        pages_read=(1,) * out_len, finish_reason="stop", answer="1",
    )  # fmt: skip


def test_the_tail_query_gives_each_step_and_bins_p0_1_of_the_sparse_acceptance(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from study_outcome import TAIL_SQL

    rng = np.random.default_rng(0)
    schedule = Schedule("s", topk_pages=(1, 2), page_size=2, bin_tokens=200)
    files, want = [], {}
    for step in (1, 2):
        records = [_record(p, 300) for p in range(4)]
        current = [rng.uniform(0.0, 1.0, 300) for _ in records]
        own = [rng.uniform(0.0, 1.0, 300) for _ in records]  # the one bin_stats reads
        scores = {
            "acceptance": current, "sparse_acceptance": own,
            "leftover_mass": [np.zeros(300)] * 4, "dense_logprobs": [np.zeros(300)] * 4,
        }  # fmt: skip
        path = tmp_path / f"step-{step}.parquet"
        pq.write_table(token_table("r", step, records, scores, schedule), path)
        files.append(str(path))
        positions = np.arange(3, 303)
        for b in (0, 1):
            values = np.concatenate([o[schedule.bin_of(positions) == b] for o in own])
            want[(step, b)] = (len(values), float(np.quantile(values, 0.001)))
    con = duckdb.connect()
    con.execute(token_view_sql(files))
    got = {(s, b): (n, p) for s, b, n, p in con.execute(TAIL_SQL).fetchall()}
    assert set(got) == set(want)
    for key, (tokens, p01) in want.items():
        assert got[key][0] == tokens and got[key][1] == pytest.approx(p01)


def test_large_tables_are_written_gzipped_and_read_back_under_their_plain_name(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from study_analysis import read_csv
    from study_outcome import write_csv

    rows = [{"step": 1, "p5": 0.5, "counted": True}, {"step": 2, "p5": None, "counted": False}]
    write_csv(tmp_path / "a_bins.csv.gz", rows)
    assert (tmp_path / "a_bins.csv.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip
    assert read_csv(tmp_path / "a_bins.csv") == [
        {"step": 1.0, "p5": 0.5, "counted": True},
        {"step": 2.0, "p5": None, "counted": False},
    ]
    # no timestamp in the file: the same rows give the same bytes (a kept folder diffs clean)
    first = (tmp_path / "a_bins.csv.gz").read_bytes()
    write_csv(tmp_path / "a_bins.csv.gz", rows)
    assert (tmp_path / "a_bins.csv.gz").read_bytes() == first
    write_csv(tmp_path / "none_bins.csv.gz", [])
    assert read_csv(tmp_path / "none_bins.csv") == [] and read_csv(tmp_path / "x.csv") == []
