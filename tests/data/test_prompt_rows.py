"""The community RL layout (chat-message prompts, reward_model.ground_truth, data_source,
extra_info) read as it is, beside plain columns; errors name the file, row and field.

python -m pytest tests/data/test_prompt_rows.py -q
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.data.chat import chat_renderer
from sparrow.data.datasets import DatasetError, load_prompts
from sparrow.data.prompt_rows import read_prompt_rows
from sparrow.model.builtin import resolve_model_path


class ByteEncoder:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


def verl_row(question: str, answer: str, source: str = "openai/gsm8k", index: int = 0) -> dict:
    """A row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index},
    }


def write(path, rows):
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_the_community_layout_is_read_as_it_is(tmp_path, suffix):
    rows = [verl_row("What is 2+2?", "4"), verl_row("3*3?", "9", "aime", index=1)]
    read = read_prompt_rows(write(tmp_path / f"d{suffix}", rows), "prompt", "answer")
    assert [r.prompt for r in read] == [(("user", "What is 2+2?"),), (("user", "3*3?"),)]
    assert [r.answer for r in read] == ["4", "9"]
    assert [r.data_source for r in read] == ["openai/gsm8k", "aime"]
    assert [json.loads(r.extra_info) for r in read] == [
        {"index": 0, "split": "train"},
        {"index": 1, "split": "train"},
    ]


def test_a_dotted_answer_key_and_structured_ground_truth(tmp_path):
    tests = {"inputs": ["1\n"], "outputs": ["2\n"]}
    rows = [{"prompt": "add one", "reward_model": {"ground_truth": tests}, "meta": {"gt": 7}}]
    path = write(tmp_path / "d.jsonl", rows)
    [row] = read_prompt_rows(path, "prompt", "answer")
    assert json.loads(row.answer) == tests  # code tests travel as their JSON text
    assert (row.data_source, row.extra_info) == ("", "")
    [row] = read_prompt_rows(path, "prompt", "meta.gt")
    assert row.answer == "7"


def test_plain_columns_keep_working_and_carry_no_metadata(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"q": "a", "a": 1}, {"q": "b", "a": "x"}])
    data = load_prompts(str(path), "q", "a", ByteEncoder(), 8)
    assert [(r.prompt, r.answer, r.data_source, r.extra_info) for r in data.batch(0, 2)] in (
        [("a", "1", "", ""), ("b", "x", "", "")],
        [("b", "x", "", ""), ("a", "1", "", "")],
    )


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([], r"row 1 \(line 2\): the prompt 'prompt' is an empty list of chat messages"),
        (["hi"], r"row 1 \(line 2\): prompt\[0\] is str, expected a chat message"),
        ([{"role": "user"}], r"row 1 \(line 2\): prompt\[0\].content is missing, expected text"),
        ([{"role": "user", "content": 3}], r"row 1 \(line 2\): prompt\[0\].content is int"),
    ],
)
def test_bad_messages_name_the_file_row_and_field(tmp_path, prompt, message):
    bad = verl_row("x", "1")
    bad["prompt"] = prompt
    path = write(tmp_path / "d.jsonl", [verl_row("ok", "1"), bad])
    with pytest.raises(DatasetError, match=r"d.jsonl: " + message):
        read_prompt_rows(path, "prompt", "answer")


def test_bad_nested_fields_name_the_row(tmp_path):
    bad = verl_row("x", "1")
    bad["reward_model"] = {"style": "rule"}
    path = write(tmp_path / "d.parquet", [verl_row("ok", "1"), bad])
    with pytest.raises(
        DatasetError, match=r"d.parquet: row 1: the answer 'reward_model.ground_truth' is null"
    ):
        read_prompt_rows(path, "prompt", "answer")
    path = write(tmp_path / "e.jsonl", [bad])
    with pytest.raises(DatasetError, match=r"row 0 \(line 1\): reward_model has no field"):
        read_prompt_rows(path, "prompt", "answer")
    for field, value, expected in (
        ("extra_info", [1], "'extra_info' is list, expected a dict"),
        ("data_source", 3, "'data_source' is int, expected text"),
    ):
        row = verl_row("x", "1")
        row[field] = value
        with pytest.raises(DatasetError, match=r"row 0 \(line 1\): " + expected):
            read_prompt_rows(write(tmp_path / "f.jsonl", [row]), "prompt", "answer")


def test_messages_need_a_chat_template(tmp_path):
    path = write(tmp_path / "d.jsonl", [verl_row("What is 2+2?", "4")])
    with pytest.raises(DatasetError, match=r"d.jsonl: row 0: the prompt is a list of chat"):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 64)
    tiny = resolve_model_path("builtin:tiny")
    with pytest.raises(DatasetError, match=r"row 0: .*no chat template .*has none"):
        load_prompts(str(path), "prompt", "answer", ByteEncoder(), 64, chat=chat_renderer(tiny))


def test_messages_are_rendered_and_carry_their_source(tmp_path):
    rows = [verl_row("what is two", "4", "gsm8k", index=5)]
    path = write(tmp_path / "d.parquet", rows)
    chat = chat_renderer(resolve_model_path("builtin:tiny"), "builtin:plain", False)
    [row] = load_prompts(str(path), "prompt", "answer", ByteEncoder(), 64, chat=chat).batch(0, 1)
    assert row.prompt == "user: what is two\nassistant:\nthink: none\n"
    assert row.prompt_ids == tuple(row.prompt.encode())
    assert (row.answer, row.data_source, json.loads(row.extra_info)["index"]) == ("4", "gsm8k", 5)
