"""Rows of a prompt file (Parquet or JSONL), in plain columns or the community's RL layout.

    from sparrow.data.prompt_rows import read_prompt_rows
    rows = read_prompt_rows(Path("train.parquet"), "prompt", "answer")
    rows[0].prompt        # "What is 2+2?" or (("user", "What is 2+2?"),)
    rows[0].answer, rows[0].data_source, rows[0].extra_info    # "4", "openai/gsm8k", '{"split": ..}'

Two layouts, told apart per file by its columns:
- plain: a text prompt column (data.prompt_key) and a text answer column (data.answer_key);
- the layout verl, OpenRLHF and the method's reference preprocessors write: `prompt` a list of
  chat messages ({"role", "content"}), the answer in `reward_model.ground_truth`, with
  `data_source` (which reward scores the row: data.reward_by_source) and `extra_info` (a dict
  handed to reward functions that take it) beside them. data.answer_key may name a nested
  field with dots; when the file has no column data.answer_key names but has `reward_model`,
  the answer is `reward_model.ground_truth`.
A ground truth that is a list or dict (code tests) becomes its JSON text; extra_info is kept as
JSON text too ("" when absent), so rows stay plain values on their way into rollout records.
Every bad value is one DatasetError naming the file, the row (and JSONL line) and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparrow.errors import SparrowError

COMMUNITY_ANSWER = "reward_model.ground_truth"
SOURCE_KEY = "data_source"
EXTRA_KEY = "extra_info"

Messages = tuple[tuple[str, str], ...]  # (role, content) pairs


class DatasetError(SparrowError, ValueError):
    """A dataset that cannot be read or holds a bad row; the message names the file and row."""


@dataclass(frozen=True)
class FileRow:
    prompt: str | Messages  # plain text, or chat messages to render with the chat template
    answer: str
    data_source: str = ""
    extra_info: str = ""  # JSON text of the row's extra_info dict, "" when it has none


def read_prompt_rows(path: Path, prompt_key: str, answer_key: str) -> list[FileRow]:
    """Every row of a .parquet or .jsonl file, checked (see the module doc)."""
    if path.suffix not in (".parquet", ".jsonl"):
        raise DatasetError(
            f"dataset {path}: unsupported file type {path.suffix or '(none)'!r}; "
            "use a .parquet or .jsonl file, or builtin:synthetic"
        )
    if not path.is_file():
        raise DatasetError(f"dataset file {path} does not exist")
    if path.suffix == ".parquet":
        records, lines, columns = _read_parquet(path, prompt_key, answer_key)
    else:
        records, lines, columns = _read_jsonl(path)
    if not records:
        raise DatasetError(f"dataset {path} has no rows")
    answer_key = _answer_key(path, columns, prompt_key, answer_key)
    return [
        _row(_Where(path, row, lines[row]), record, prompt_key, answer_key)
        for row, record in enumerate(records)
    ]


@dataclass(frozen=True)
class _Where:
    path: Path
    row: int
    line: int | None

    def __str__(self) -> str:
        line = f" (line {self.line})" if self.line is not None else ""
        return f"dataset {self.path}: row {self.row}{line}"


def _answer_key(path: Path, columns: list[str] | None, prompt_key: str, answer_key: str) -> str:
    """answer_key, or reward_model.ground_truth where the file has the community layout."""
    top = answer_key.split(".")[0]
    if columns is None:  # JSONL: decided per row, by the same rule (see _row)
        return answer_key
    if top not in columns and "reward_model" in columns:
        answer_key, top = COMMUNITY_ANSWER, "reward_model"
    for role, key, name in (("prompt", prompt_key, prompt_key), ("answer", answer_key, top)):
        if name not in columns:
            raise DatasetError(
                f"dataset {path} has no {role} column {key!r} (data.{role}_key); "
                f"columns present: {', '.join(columns) or '(none)'}"
            )
    return answer_key


def _row(where: _Where, record: dict, prompt_key: str, answer_key: str) -> FileRow:
    if answer_key.split(".")[0] not in record and "reward_model" in record:
        answer_key = COMMUNITY_ANSWER
    for key in (prompt_key, answer_key.split(".")[0]):
        if key not in record:
            raise DatasetError(
                f"{where} has no {key!r} field; fields present: "
                f"{', '.join(sorted(record)) or '(none)'}"
            )
    source = record.get(SOURCE_KEY)
    if source is not None and not isinstance(source, str):
        raise DatasetError(f"{where}: {SOURCE_KEY!r} is {type(source).__name__}, expected text")
    return FileRow(
        prompt=_prompt(where, prompt_key, record[prompt_key]),
        answer=_answer(where, answer_key, _nested(where, record, answer_key)),
        data_source=source or "",
        extra_info=_extra_info(where, record.get(EXTRA_KEY)),
    )


def _nested(where: _Where, record: dict, dotted: str) -> Any:
    value: Any = record
    for depth, part in enumerate(dotted.split(".")):
        if not isinstance(value, dict) or part not in value:
            parent = ".".join(dotted.split(".")[:depth]) or "the row"
            held = type(value).__name__ if not isinstance(value, dict) else "no such key"
            raise DatasetError(f"{where}: {parent} has no field {part!r} ({held})")
        value = value[part]
    return value


def _prompt(where: _Where, key: str, value: Any) -> str | Messages:
    if isinstance(value, list):
        return _messages(where, key, value)
    return _text(where, key, value, "prompt")


def _messages(where: _Where, key: str, value: list) -> Messages:
    """Chat messages: a non-empty list of {"role", "content"} with text values."""
    if not value:
        raise DatasetError(f"{where}: the prompt {key!r} is an empty list of chat messages")
    out = []
    for index, message in enumerate(value):
        field = f"{key}[{index}]"
        if not isinstance(message, dict):
            raise DatasetError(
                f"{where}: {field} is {type(message).__name__}, expected a chat message "
                '{"role": ..., "content": ...}'
            )
        for part in ("role", "content"):
            if not isinstance(message.get(part), str):
                got = "missing" if part not in message else type(message[part]).__name__
                raise DatasetError(f"{where}: {field}.{part} is {got}, expected text")
        out.append((message["role"], message["content"]))
    return tuple(out)


def _answer(where: _Where, key: str, value: Any) -> str:
    if key != COMMUNITY_ANSWER or not isinstance(value, (list, dict)):
        return _text(where, key, value, "answer")
    if not value:
        raise DatasetError(f"{where}: the answer {key!r} is empty")
    return json.dumps(value)  # code tests and the like: the reward parses them


def _extra_info(where: _Where, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, dict):
        raise DatasetError(f"{where}: {EXTRA_KEY!r} is {type(value).__name__}, expected a dict")
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise DatasetError(f"{where}: {EXTRA_KEY!r} cannot be written as JSON: {err}") from None


def _text(where: _Where, key: str, value: Any, role: str) -> str:
    """The value as text; None, an empty string or a non-scalar is an error naming the row."""
    if value is None or isinstance(value, (list, dict)):
        kind = "null" if value is None else type(value).__name__
        raise DatasetError(f"{where}: the {role} {key!r} is {kind}, expected non-empty text")
    text = value if isinstance(value, str) else str(value)
    if not text.strip():
        raise DatasetError(f"{where}: the {role} {key!r} is empty")
    return text


def _read_parquet(path: Path, prompt_key: str, answer_key: str):
    """(records, lines, columns): only the columns a row is made of are read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        columns = pq.read_schema(path).names
        wanted = {prompt_key, answer_key.split(".")[0], "reward_model", SOURCE_KEY, EXTRA_KEY}
        table = pq.read_table(path, columns=[c for c in columns if c in wanted])
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(f"dataset {path} is not a readable Parquet file: {err}") from None
    records = table.to_pylist()
    return records, [None] * len(records), columns


def _read_jsonl(path: Path) -> tuple[list[dict], list[int], None]:
    records, lines = [], []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(f"dataset {path} is not UTF-8 text: {err}") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = len(records)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"dataset {path}: row {row} (line {number}) is not valid JSON: {err.msg}"
            ) from None
        if not isinstance(record, dict):
            raise DatasetError(f"dataset {path}: row {row} (line {number}) is not a JSON object")
        records.append(record)
        lines.append(number)
    return records, lines, None
