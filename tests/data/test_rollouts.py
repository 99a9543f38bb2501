"""Rollout records survive a Parquet round trip; bad files are named errors."""

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.data.rollouts import (
    RolloutFileError,
    RolloutRecord,
    _schema,
    read_rollouts,
    write_rollouts,
)


def _record(i, n):
    return RolloutRecord(
        prompt_index=i,
        sample_index=1,
        dataset_row=10 + i,
        prompt_ids=(1, 2, 3),
        output_ids=tuple(range(n)),
        actor_logprobs=tuple(-0.5 * k for k in range(n)),
        topk_ids=tuple((k, k + 1) for k in range(n)),
        topk_logprobs=tuple((-0.25, -1.5) for _ in range(n)),
        pages_read=tuple([5] * n),
        finish_reason="stop",
        answer="7",
        text="abc",
    )


def test_round_trip(tmp_path):
    records = [_record(0, 4), _record(1, 0), _record(2, 2)]
    path = write_rollouts(tmp_path / "r" / "rollouts.parquet", records)
    assert read_rollouts(path) == records  # values chosen exactly representable in float32
    assert records[0].total_length == 7
    # the columnar writer gives the table a row-by-row conversion gives
    rows = [dataclasses.asdict(r) for r in records]
    assert pq.read_table(path).equals(pa.Table.from_pylist(rows, schema=_schema()))


def test_top_k_reads_back_as_arrays(tmp_path):
    records = [_record(0, 4), _record(1, 0)]
    back = read_rollouts(write_rollouts(tmp_path / "rollouts.parquet", records))
    ids, logprobs = back[0].topk_ids, back[0].topk_logprobs
    assert ids.dtype == np.int32 and ids.shape == (4, 2)
    assert ids.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert logprobs.dtype == np.float32 and logprobs.shape == (4, 2)
    assert (logprobs == np.array([-0.25, -1.5], np.float32)).all()
    assert back[1].topk_ids.shape == (0, 0)
    assert back[0].output_ids == (0, 1, 2, 3) and back[0].actor_logprobs == (0.0, -0.5, -1.0, -1.5)
    # arrays write back as they read: the same file contents
    again = read_rollouts(write_rollouts(tmp_path / "again.parquet", back))
    assert again == back == records
    tables = [pq.read_table(tmp_path / name) for name in ("rollouts.parquet", "again.parquet")]
    assert tables[0].equals(tables[1])


def test_equality_by_value_whatever_the_form():
    record = _record(0, 3)
    as_arrays = dataclasses.replace(
        record,
        topk_ids=np.array(record.topk_ids, np.int32),
        topk_logprobs=np.array(record.topk_logprobs, np.float32),
    )
    assert as_arrays == record and record == as_arrays and hash(as_arrays) == hash(record)
    changed = as_arrays.topk_ids.copy()
    changed[2, 1] = 9
    assert dataclasses.replace(as_arrays, topk_ids=changed) != record
    assert dataclasses.replace(as_arrays, topk_ids=changed[:, :1]) != record
    ragged = dataclasses.replace(record, topk_ids=((0, 1), (1,), (2, 3)))
    assert ragged != as_arrays and ragged != record
    with pytest.raises(ValueError, match=r"must be \[tokens, K\]"):
        dataclasses.replace(record, topk_ids=np.arange(3))


def test_ragged_top_k_survives_the_round_trip(tmp_path):
    # not what the engine writes, but readable: such a row comes back as tuples
    ragged = dataclasses.replace(
        _record(0, 2), topk_ids=((0, 1), (5,)), topk_logprobs=((-0.25, -1.5), (-0.5,))
    )
    back = read_rollouts(write_rollouts(tmp_path / "r.parquet", [ragged, _record(1, 2)]))
    assert back[0].topk_ids == ((0, 1), (5,)) and back[0].topk_logprobs == ((-0.25, -1.5), (-0.5,))
    assert isinstance(back[1].topk_ids, np.ndarray)
    assert back == [ragged, _record(1, 2)]


def test_a_file_from_before_the_rename_reads_its_pages_read(tmp_path):
    import pyarrow.parquet as pq

    records = [_record(i, 3 + i) for i in range(2)]
    path = write_rollouts(tmp_path / "r.parquet", records)
    table = pq.read_table(path)
    old = table.rename_columns(
        ["budget_pages" if c == "pages_read" else c for c in table.column_names]
    )
    pq.write_table(old, tmp_path / "old.parquet")
    assert read_rollouts(tmp_path / "old.parquet") == records


def test_the_prompt_text_and_source_travel_and_older_files_read_without_them(tmp_path):
    record = dataclasses.replace(
        _record(0, 2), prompt_text="user: hi\n", data_source="gsm8k", extra_info='{"i": 1}'
    )
    path = write_rollouts(tmp_path / "r.parquet", [record])
    [back] = read_rollouts(path)
    assert (back.prompt_text, back.data_source, back.extra_info) == (
        "user: hi\n",
        "gsm8k",
        '{"i": 1}',
    )
    old = pq.read_table(path).drop_columns(["prompt_text", "data_source", "extra_info"])
    pq.write_table(old, tmp_path / "old.parquet")
    [back] = read_rollouts(tmp_path / "old.parquet")
    assert back == dataclasses.replace(record, prompt_text="", data_source="", extra_info="")


def test_no_records(tmp_path):
    assert read_rollouts(write_rollouts(tmp_path / "r.parquet", [])) == []


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError, match="disagree in length"):
        RolloutRecord(
            0, 0, 0, (1,), (1, 2), (0.0,), ((1,), (2,)), ((0.0,), (0.0,)), (3, 3), "stop", "1"
        )


def test_bad_files(tmp_path):
    with pytest.raises(RolloutFileError, match="does not exist"):
        read_rollouts(tmp_path / "none.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"garbage")
    with pytest.raises(RolloutFileError, match="not a readable Parquet"):
        read_rollouts(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"prompt_index": [0]}), tmp_path / "few.parquet")
    with pytest.raises(RolloutFileError, match="lacks column.*output_ids"):
        read_rollouts(tmp_path / "few.parquet")
    row = dataclasses.asdict(_record(0, 2))
    row["topk_ids"] = [[1, None], [2, 3]]
    pq.write_table(pa.Table.from_pylist([row], schema=_schema()), tmp_path / "null.parquet")
    with pytest.raises(RolloutFileError, match="column topk_ids has null values"):
        read_rollouts(tmp_path / "null.parquet")


def test_token_roles_round_trip_and_an_older_file_reads_none(tmp_path):
    with_roles = dataclasses.replace(_record(0, 3), token_roles=(1, 2, 0))
    records = [with_roles, _record(1, 2)]
    path = write_rollouts(tmp_path / "r.parquet", records)
    back = read_rollouts(path)
    assert back == records and back[0].token_roles == (1, 2, 0) and back[1].token_roles == ()
    pq.write_table(pq.read_table(path).drop_columns(["token_roles"]), tmp_path / "old.parquet")
    assert [r.token_roles for r in read_rollouts(tmp_path / "old.parquet")] == [(), ()]
    with pytest.raises(ValueError, match="disagree in length"):
        dataclasses.replace(_record(0, 3), token_roles=(1, 2))


def test_the_policy_version_round_trips_and_an_older_file_reads_none(tmp_path):
    records = [dataclasses.replace(_record(0, 2), policy_version=3), _record(1, 1)]
    path = write_rollouts(tmp_path / "r.parquet", records)
    back = read_rollouts(path)
    assert back == records and [r.policy_version for r in back] == [3, None]
    assert back != [dataclasses.replace(records[0], policy_version=2), records[1]]
    old = pq.read_table(path).drop_columns(["policy_version"])
    pq.write_table(old, tmp_path / "old.parquet")
    assert [r.policy_version for r in read_rollouts(tmp_path / "old.parquet")] == [None, None]
