"""Rollout records on disk: one Parquet row per generated sample.

    write_rollouts(path, records)        # write-then-rename
    records = read_rollouts(path)
    records[0].topk_ids                  # [tokens, K] int32 numpy array once read back

The rollout stage writes them, reward / dense_score / policy_update read them by path. A row
holds what the engine returned for the sample (SampleResult) plus where it came from: the
dataset row, its prompt ids and text (as the chat template rendered it), its ground-truth
answer, data_source and extra_info, and the policy version whose weights generated it
(per token when a carried sample resumed under newer weights: docs/async.md). Per-token
lists (ids, logprobs, top-K, pages read) are Parquet list columns, so `duckdb` and `pyarrow`
read them as they are.

Both directions go column by column through numpy (values plus offsets), never through one
Python object per top-K entry: read back, the actor's top-K ids and logprobs are [tokens, K]
int32 / float32 arrays (views of the Arrow buffers, read-only), the other per-token fields
tuples. A record accepts either form for every per-token field (the engine's top-K comes as
arrays already, sparrow/token_arrays.py) and two records compare equal when their fields
hold the same values, whatever the form.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from sparrow.errors import SparrowError
from sparrow.token_arrays import same_values

# the per-token fields with K values per token (the actor's top-K)
TOPK_FIELDS = ("topk_ids", "topk_logprobs")


class RolloutFileError(SparrowError):
    """A rollout file that is missing, corrupt, or lacks a column (the message names it)."""


@dataclass(frozen=True)
class RolloutRecord:
    prompt_index: int  # position of the prompt within the step's batch
    sample_index: int  # which of the prompt's n samples
    dataset_row: int  # row of the prompt in its dataset
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    actor_logprobs: Sequence[float]  # logprob of each sampled token under the actor
    topk_ids: Any  # the actor's top-K ids per token: nested tuples or an [n, K] array
    topk_logprobs: Any  # the same, for their logprobs
    pages_read: Sequence[int]  # pages read per KV head at the step of each token
    finish_reason: str  # "stop" or "length"
    answer: str  # ground truth, for the reward
    text: str = ""  # decoded completion
    # role of each generated token on a chase task's reference path, as ROLES indices
    # (sparrow/data/token_roles.py); empty when the task has none (or the file predates it)
    token_roles: Sequence[int] = ()
    prompt_text: str = ""  # the prompt as the model saw it (after the chat template)
    data_source: str = ""  # the dataset row's data_source (routes its reward), "" for plain rows
    extra_info: str = ""  # JSON text of the row's extra_info, handed to rewards that take it
    # the policy version that generated the sample: the step whose update gave the engines
    # their weights (0: the initial model); None in a file written before versions were
    # recorded (every such run was synchronous: version = step - 1)
    policy_version: int | None = None
    # per generated token, the policy version that generated it, when they differ: a sample
    # carried over an early close and resumed under newer weights (rollout.finish_fraction;
    # policy_version is then its first token's); empty when every token is policy_version's
    token_versions: Sequence[int] = ()

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        lengths = {
            len(self.actor_logprobs),
            len(self.topk_ids),
            len(self.topk_logprobs),
            len(self.pages_read),
        }
        for name in ("token_roles", "token_versions"):
            if len(getattr(self, name)) not in (0, n):
                lengths.add(len(getattr(self, name)))
        if lengths != {n}:
            raise ValueError(
                f"rollout ({self.prompt_index}, {self.sample_index}): per-token "
                f"fields disagree in length ({n} ids vs {sorted(lengths)})"
            )
        for name in TOPK_FIELDS:
            value = getattr(self, name)
            if isinstance(value, np.ndarray) and value.ndim != 2:
                raise ValueError(
                    f"rollout ({self.prompt_index}, {self.sample_index}): {name} "
                    f"must be [tokens, K], got shape {value.shape}"
                )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(same_values(getattr(self, name), getattr(other, name)) for name in COLUMNS)

    def __hash__(self) -> int:
        # arrays are unhashable; equal records agree on these
        return hash((self.prompt_index, self.sample_index, self.dataset_row, len(self.output_ids)))

    @property
    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def versions_of_tokens(self, default: int) -> list[int]:
        """The policy version of each generated token (`default` where none is recorded)."""
        if len(self.token_versions):
            return [int(v) for v in self.token_versions]
        version = default if self.policy_version is None else int(self.policy_version)
        return [version] * len(self.output_ids)


COLUMNS = tuple(f.name for f in fields(RolloutRecord))
# columns added later: a file written before them reads with their defaults
OPTIONAL_COLUMNS = {
    "token_roles": (),
    "prompt_text": "",
    "data_source": "",
    "extra_info": "",
    "policy_version": None,
    "token_versions": (),
}


# write


def write_rollouts(path: str | Path, records: Iterable[RolloutRecord]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    records = list(records)
    schema = _schema()
    columns = []
    for name in COLUMNS:
        kind = schema.field(name).type
        if pa.types.is_list(kind) and pa.types.is_list(kind.value_type):
            columns.append(_nested_column([getattr(r, name) for r in records], kind))
        elif pa.types.is_list(kind):
            columns.append(_list_column([getattr(r, name) for r in records], kind))
        else:
            columns.append(pa.array([getattr(r, name) for r in records], kind))
    table = pa.Table.from_arrays(columns, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, scratch)
    os.replace(scratch, path)
    return path


def _offsets(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{int(offsets[-1])} values do not fit one Parquet list column")
    return offsets.astype(np.int32)


def _list_array(lengths, values: np.ndarray, kind):
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(_offsets(lengths)), values, type=kind)


def _list_column(values: list, kind):
    import pyarrow as pa

    dtype = kind.value_type.to_pandas_dtype()
    parts = [np.asarray(v, dtype) if len(v) else np.zeros(0, dtype) for v in values]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype)
    return _list_array([len(p) for p in parts], pa.array(flat, kind.value_type), kind)


def _nested_column(values: list, kind):
    import pyarrow as pa

    leaf = kind.value_type.value_type
    dtype = leaf.to_pandas_dtype()
    widths, parts = [], []
    for rows in values:  # one record's top-K rows: an [n, K] array or nested sequences
        if isinstance(rows, np.ndarray):
            widths.append(np.full(len(rows), rows.shape[1], np.int64))
            parts.append(rows.astype(dtype, copy=False).ravel())
        else:
            lengths = np.fromiter(map(len, rows), np.int64, count=len(rows))
            widths.append(lengths)
            parts.append(np.fromiter(chain.from_iterable(rows), dtype, count=int(lengths.sum())))
    token_widths = np.concatenate(widths) if widths else np.zeros(0, np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype)
    inner = _list_array(token_widths, pa.array(flat, leaf), kind.value_type)
    return _list_array([len(rows) for rows in values], inner, kind)


# read


def read_rollouts(path: str | Path) -> list[RolloutRecord]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise RolloutFileError(f"rollout file {path} does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise RolloutFileError(
            f"rollout file {path} is not a readable Parquet file: {err}"
        ) from None
    if "budget_pages" in table.column_names and "pages_read" not in table.column_names:
        # a file written before the rename (docs/glossary.md): the same numbers
        table = table.rename_columns(
            ["pages_read" if c == "budget_pages" else c for c in table.column_names]
        )
    missing = [c for c in COLUMNS if c not in table.column_names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise RolloutFileError(f"rollout file {path} lacks column(s) {', '.join(missing)}")
    columns = {}
    for name in COLUMNS:
        if name not in table.column_names:
            columns[name] = [OPTIONAL_COLUMNS[name]] * table.num_rows
            continue
        column = table.column(name)
        if name in TOPK_FIELDS:
            columns[name] = _read_nested(path, name, column)
        elif pa.types.is_list(column.type):
            columns[name] = _read_list(path, name, column)
        else:
            columns[name] = column.to_pylist()
    return [
        RolloutRecord(**{name: columns[name][i] for name in COLUMNS}) for i in range(table.num_rows)
    ]


def _unnested(path: Path, name: str, array):
    """(offsets as a list, child array) of a list array without nulls."""
    if array.null_count:
        raise RolloutFileError(f"rollout file {path}: column {name} has null rows")
    return array.offsets.to_numpy().tolist(), array.values


def _leaf_values(path: Path, name: str, array) -> np.ndarray:
    if array.null_count:
        raise RolloutFileError(f"rollout file {path}: column {name} has null values")
    return array.to_numpy(zero_copy_only=True)


def _read_list(path: Path, name: str, column) -> list[tuple]:
    offsets, child = _unnested(path, name, column.combine_chunks())
    flat = _leaf_values(path, name, child).tolist()
    return [tuple(flat[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]


def _read_nested(path: Path, name: str, column) -> list[np.ndarray | tuple]:
    """Per row an [n, K] view of the leaf values (tuples of tuples for a row whose top-K
    widths differ across tokens, so scoring names it as it would any ragged record)."""
    rows, tokens = _unnested(path, name, column.combine_chunks())
    starts, child = _unnested(path, name, tokens)
    leaf = _leaf_values(path, name, child)
    widths = np.diff(np.asarray(starts, np.int64))
    out: list[np.ndarray | tuple] = []
    for a, b in zip(rows[:-1], rows[1:]):
        if a == b:
            out.append(leaf[:0].reshape(0, 0))
        elif widths[a:b].min() == widths[a:b].max():
            out.append(leaf[starts[a] : starts[b]].reshape(b - a, int(widths[a])))
        else:
            out.append(
                tuple(tuple(leaf[s:e].tolist()) for s, e in zip(starts[a:b], starts[a + 1 : b + 1]))
            )
    return out


def _schema():
    import pyarrow as pa

    ints, floats = pa.list_(pa.int32()), pa.list_(pa.float32())
    return pa.schema(
        [
            ("prompt_index", pa.int32()),
            ("sample_index", pa.int32()),
            ("dataset_row", pa.int64()),
            ("prompt_ids", ints),
            ("output_ids", ints),
            ("actor_logprobs", floats),
            ("topk_ids", pa.list_(ints)),
            ("topk_logprobs", pa.list_(floats)),
            ("pages_read", ints),
            ("finish_reason", pa.string()),
            ("answer", pa.string()),
            ("text", pa.string()),
            ("token_roles", pa.list_(pa.int8())),
            ("prompt_text", pa.string()),
            ("data_source", pa.string()),
            ("extra_info", pa.string()),
            ("policy_version", pa.int32()),
            ("token_versions", ints),
        ]
    )
