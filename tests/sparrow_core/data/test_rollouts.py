"""Rollout records survive a Parquet round trip; bad files are named errors."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow_core.data.rollouts import RolloutFileError, RolloutRecord, read_rollouts, write_rollouts


def _record(i, n):
    return RolloutRecord(
        prompt_index=i, sample_index=1, dataset_row=10 + i, prompt_ids=(1, 2, 3),
        output_ids=tuple(range(n)), actor_logprobs=tuple(-0.5 * k for k in range(n)),
        topk_ids=tuple((k, k + 1) for k in range(n)),
        topk_logprobs=tuple((-0.25, -1.5) for _ in range(n)), budget_pages=tuple([5] * n),
        finish_reason="stop", answer="7", text="abc",
    )


def test_round_trip(tmp_path):
    records = [_record(0, 4), _record(1, 0), _record(2, 2)]
    path = write_rollouts(tmp_path / "r" / "rollouts.parquet", records)
    assert read_rollouts(path) == records  # values chosen exactly representable in float32
    assert records[0].total_length == 7


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError, match="disagree in length"):
        RolloutRecord(0, 0, 0, (1,), (1, 2), (0.0,), ((1,), (2,)), ((0.0,), (0.0,)), (3, 3), "stop", "1")


def test_bad_files(tmp_path):
    with pytest.raises(RolloutFileError, match="does not exist"):
        read_rollouts(tmp_path / "none.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"garbage")
    with pytest.raises(RolloutFileError, match="not a readable Parquet"):
        read_rollouts(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"prompt_index": [0]}), tmp_path / "few.parquet")
    with pytest.raises(RolloutFileError, match="lacks column.*output_ids"):
        read_rollouts(tmp_path / "few.parquet")
