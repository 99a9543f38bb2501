"""Rollout records on disk: one Parquet row per generated sample.

    write_rollouts(path, records)        # write-then-rename
    records = read_rollouts(path)

The rollout stage writes them, reward / dense_score / policy_update read them by path. A row
holds what the engine returned for the sample (SampleResult) plus where it came from: the
dataset row, its prompt ids and its ground-truth answer. Per-token lists (ids, logprobs,
top-K, pages read) are Parquet list columns, so `duckdb` and `pyarrow` read them as they are.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable

from sparrow_core.errors import SparrowError


class RolloutFileError(SparrowError):
    """A rollout file that is missing, corrupt, or lacks a column (the message names it)."""


@dataclass(frozen=True)
class RolloutRecord:
    prompt_index: int  # position of the prompt within the step's batch
    sample_index: int  # which of the prompt's n samples
    dataset_row: int  # row of the prompt in its dataset
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    actor_logprobs: tuple[float, ...]  # logprob of each sampled token under the actor
    topk_ids: tuple[tuple[int, ...], ...]  # the actor's top-K ids per token
    topk_logprobs: tuple[tuple[float, ...], ...]
    budget_pages: tuple[int, ...]  # pages read per KV head at the step of each token
    finish_reason: str  # "stop" or "length"
    answer: str  # ground truth, for the reward
    text: str = ""  # decoded completion

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        lengths = {len(self.actor_logprobs), len(self.topk_ids), len(self.topk_logprobs),
                   len(self.budget_pages)}
        if lengths != {n}:
            raise ValueError(f"rollout ({self.prompt_index}, {self.sample_index}): per-token "
                             f"fields disagree in length ({n} ids vs {sorted(lengths)})")

    @property
    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


COLUMNS = tuple(f.name for f in fields(RolloutRecord))


def write_rollouts(path: str | Path, records: Iterable[RolloutRecord]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    rows = [asdict(r) for r in records]
    table = pa.Table.from_pylist(rows, schema=_schema()) if rows else _schema().empty_table()
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, scratch)
    os.replace(scratch, path)
    return path


def read_rollouts(path: str | Path) -> list[RolloutRecord]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise RolloutFileError(f"rollout file {path} does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise RolloutFileError(f"rollout file {path} is not a readable Parquet file: {err}") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise RolloutFileError(f"rollout file {path} lacks column(s) {', '.join(missing)}")
    return [_record(row) for row in table.select(list(COLUMNS)).to_pylist()]


def _record(row: dict) -> RolloutRecord:
    for key in ("prompt_ids", "output_ids", "actor_logprobs", "budget_pages"):
        row[key] = tuple(row[key])
    row["topk_ids"] = tuple(tuple(t) for t in row["topk_ids"])
    row["topk_logprobs"] = tuple(tuple(t) for t in row["topk_logprobs"])
    return RolloutRecord(**row)


def _schema():
    import pyarrow as pa

    ints, floats = pa.list_(pa.int32()), pa.list_(pa.float32())
    return pa.schema([
        ("prompt_index", pa.int32()), ("sample_index", pa.int32()), ("dataset_row", pa.int64()),
        ("prompt_ids", ints), ("output_ids", ints), ("actor_logprobs", floats),
        ("topk_ids", pa.list_(ints)), ("topk_logprobs", pa.list_(floats)),
        ("budget_pages", ints), ("finish_reason", pa.string()), ("answer", pa.string()),
        ("text", pa.string()),
    ])
