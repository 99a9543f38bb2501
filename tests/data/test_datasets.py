"""Prompt datasets: synthetic rows, Parquet and JSONL files, per-step batches, named errors.

python -m pytest tests/data/test_datasets.py -q
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.data.char_tokenizer import build_char_tokenizer
from sparrow.data.datasets import DatasetError, load_prompts, synthetic_row_seed
from sparrow.errors import SparrowError
from sparrow.model import load_tokenizer


class ByteEncoder:
    """One token per UTF-8 byte: lengths are easy to reason about."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    return load_tokenizer(build_char_tokenizer(tmp_path_factory.mktemp("char")))


def pointer_chase_answer(prompt: str) -> str:
    """Recompute the answer from the prompt text alone: follow the hops."""
    defs_line, from_line = prompt.strip().split("\n")
    targets = dict(item.split("=") for item in defs_line.split()[1:])
    _, name, _, hops = from_line.split()
    for _ in range(int(hops)):
        name = targets[name]
    return name


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# synthetic


def test_synthetic_rows_are_consistent_and_deterministic(char_tokenizer):
    data = load_prompts("builtin:synthetic", "prompt", "answer", char_tokenizer, 1024, seed=3)
    batch = data.batch(step=2, prompts_per_step=3)
    assert [r.row for r in batch] == [6, 7, 8]
    for r in batch:
        assert r.answer == pointer_chase_answer(r.prompt)
        assert list(r.prompt_ids) == char_tokenizer.encode(r.prompt)
    again = load_prompts("builtin:synthetic", "prompt", "answer", char_tokenizer, 1024, seed=3)
    assert again.batch(2, 3) == batch
    other_seed = load_prompts("builtin:synthetic", "prompt", "answer", char_tokenizer, 1024, seed=4)
    assert [r.prompt for r in other_seed.batch(2, 3)] != [r.prompt for r in batch]
    assert len(data) > 10**18


def test_synthetic_train_and_eval_differ(char_tokenizer):
    train = load_prompts("builtin:synthetic", "prompt", "answer", char_tokenizer, 1024)
    evals = load_prompts(
        "builtin:synthetic", "prompt", "answer", char_tokenizer, 1024, split="eval"
    )
    train_prompts = {r.prompt for r in train.batch(0, 100)}
    eval_prompts = {r.prompt for r in evals.batch(0, 100)}
    assert len(train_prompts) == 100 and len(eval_prompts) == 100
    assert not train_prompts & eval_prompts


def test_synthetic_row_seeds_are_distinct_and_split_by_parity():
    seen = {}
    for seed in range(-4, 5):
        for row in range(40):
            for split in ("train", "eval"):
                value = synthetic_row_seed(seed, split, row)
                assert value not in seen, (seed, split, row, seen.get(value))
                seen[value] = (seed, split, row)
                assert value % 2 == (split == "eval")


def test_synthetic_prompt_over_the_limit_fails_at_load(char_tokenizer):
    with pytest.raises(
        DatasetError,
        match=r"row 0: the prompt is \d+ tokens, longer than "
        r"data.max_prompt_tokens=20",
    ):
        load_prompts("builtin:synthetic", "prompt", "answer", char_tokenizer, 20)


# files

ROWS = [{"question": f"q{i} " + "x" * i, "solution": i % 7, "extra": True} for i in range(10)]


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_file_batches_walk_a_fresh_shuffle_each_epoch(tmp_path, kind):
    writer = write_parquet if kind == "parquet" else write_jsonl
    path = writer(tmp_path / f"data.{kind}", ROWS)
    data = load_prompts(str(path), "question", "solution", ByteEncoder(), 64, seed=11)
    assert len(data) == 10
    epochs = [
        [r.row for step in range(5 * e, 5 * e + 5) for r in data.batch(step, 2)] for e in range(3)
    ]
    for order in epochs:
        assert sorted(order) == list(range(10))
    assert (
        len({tuple(o) for o in epochs}) == 3
    )  # 3 equal shuffles of 10 would be a 1 in 10**13 event
    for r in data.batch(7, 4):
        assert r.prompt == ROWS[r.row]["question"]
        assert r.answer == str(r.row % 7)
        assert r.prompt_ids == tuple(r.prompt.encode())
    # a batch larger than the dataset wraps into the next epoch's order
    assert sorted(r.row for r in data.batch(0, 20)) == sorted(list(range(10)) * 2)
    same = load_prompts(str(path), "question", "solution", ByteEncoder(), 64, seed=11)
    assert same.batch(3, 4) == data.batch(3, 4)
    other = load_prompts(str(path), "question", "solution", ByteEncoder(), 64, seed=12)
    assert [r.row for r in other.batch(0, 10)] != epochs[0]


def test_jsonl_skips_blank_lines_and_names_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b"}\n')
    with pytest.raises(
        DatasetError,
        match=r"d.jsonl: row 1 \(line 3\) has no 'answer' field; "
        r"fields present: prompt",
    ):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 8)
    path.write_text('{"prompt": "a", "answer": "1"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"row 1 \(line 2\) is not valid JSON"):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 8)


# errors


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(
        DatasetError, match=re.escape(f"dataset file {tmp_path / 'no.parquet'} does not exist")
    ):
        load_prompts(str(tmp_path / "no.parquet"), "prompt", "answer", ByteEncoder(), 8)
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    with pytest.raises(DatasetError, match=r"unsupported file type '.csv'"):
        load_prompts(str(tmp_path / "d.csv"), "prompt", "answer", ByteEncoder(), 8)
    with pytest.raises(DatasetError, match=r"unknown built-in dataset 'builtin:gsm'"):
        load_prompts("builtin:gsm", "prompt", "answer", ByteEncoder(), 8)


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DatasetError, match=r"bad.parquet is not a readable Parquet file"):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 8)


def test_missing_column_lists_the_columns_present(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [{"prompt": "a", "label": "1"}])
    with pytest.raises(
        DatasetError,
        match=r"d.parquet has no answer column 'answer' "
        r"\(data.answer_key\); columns present: prompt, label",
    ):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 8)


@pytest.mark.parametrize(
    "bad, message", [(None, "is null"), ("  ", "is empty"), ([1, 2], "is list")]
)
def test_bad_answer_names_the_row(tmp_path, bad, message):
    rows = [
        {"prompt": "a", "answer": "1"},
        {"prompt": "b", "answer": "2"},
        {"prompt": "c", "answer": bad},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(
        DatasetError,
        match=rf"d.jsonl: row 2 \(line 3\): the answer 'answer' "
        rf"{message}",
    ):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 8)


def test_null_answer_in_parquet_names_the_row(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [{"p": "a", "a": "1"}, {"p": "b", "a": None}])
    with pytest.raises(DatasetError, match=r"d.parquet: row 1: the answer 'a' is null"):
        load_prompts(str(path), "p", "a", ByteEncoder(), 8)


def test_long_prompt_gives_length_and_limit(tmp_path):
    rows = [{"prompt": "short", "answer": "1"}, {"prompt": "x" * 13, "answer": "2"}]
    path = write_parquet(tmp_path / "d.parquet", rows)
    with pytest.raises(
        DatasetError,
        match=r"d.parquet: row 1: the prompt is 13 tokens, longer "
        r"than data.max_prompt_tokens=12",
    ):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 12)
    assert len(load_prompts(str(path), "prompt", "answer", ByteEncoder(), 13)) == 2


def test_empty_datasets(tmp_path):
    empty = pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())})
    pq.write_table(empty, tmp_path / "e.parquet")
    (tmp_path / "e.jsonl").write_text("\n")
    for name in ("e.parquet", "e.jsonl"):
        with pytest.raises(SparrowError, match=rf"{name} has no rows"):
            load_prompts(str(tmp_path / name), "prompt", "answer", ByteEncoder(), 8)


def test_bad_arguments(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}])
    with pytest.raises(DatasetError, match="split must be one of train, eval"):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 8, split="test")
    with pytest.raises(DatasetError, match="max_prompt_tokens must be an integer >= 1"):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 0)
    data = load_prompts(str(path), "prompt", "answer", ByteEncoder(), 8)
    with pytest.raises(DatasetError, match="step must be an integer >= 0"):
        data.batch(-1, 2)
    with pytest.raises(DatasetError, match="prompts_per_step must be an integer >= 1"):
        data.batch(0, 0)


def test_prompt_without_tokens_names_the_row(tmp_path, char_tokenizer):
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "abc", "answer": "1"}, {"prompt": "!!!", "answer": "2"}]
    )
    with pytest.raises(DatasetError, match=r"d.jsonl: row 1: the prompt encodes to no tokens"):
        load_prompts(str(path), "prompt", "answer", char_tokenizer, 8)


def test_a_prompt_that_fills_the_context_is_named_with_the_right_advice(tmp_path):
    from sparrow.data.datasets import PromptTooLongError

    rows = [{"prompt": "x" * 15, "answer": "1"}, {"prompt": "x" * 16, "answer": "2"}]
    path = write_parquet(tmp_path / "d.parquet", rows)
    # 15 tokens leave one to generate in a context of 16; 16 leave none
    with pytest.raises(
        PromptTooLongError,
        match=r"d.parquet: row 1: the prompt is 16 tokens but "
        r"the model's context is 16 tokens",
    ) as err:
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 100, max_context=16)
    assert "shorten or drop that row" in str(err.value)
    assert "max_prompt_tokens" not in str(err.value)  # lowering it would not help
    assert isinstance(err.value, DatasetError)
    assert len(load_prompts(str(path), "prompt", "answer", ByteEncoder(), 100, max_context=17)) == 2
    # a built-in task's rows are checked as they are made
    with pytest.raises(PromptTooLongError, match="builtin:synthetic: row 0"):
        load_prompts("builtin:synthetic", "prompt", "answer", ByteEncoder(), 10_000, max_context=8)
