"""Code datasets (sparrow/data/code_datasets.py): TACO and CodeContests rows from JSONL
and Parquet, the `code:` dataset spec, and the project's sample set, whose reference
solutions must score 1.0 with the code reward.
Run: `python -m pytest tests/data/test_code_datasets.py -q`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.data.code_datasets import SAMPLE_PATH, parse_code_spec, read_code_file
from sparrow.data.code_reward import parse_tests
from sparrow.data.datasets import DatasetError, load_prompts
from sparrow.data.reward_runner import score_completions


class CharEncoder:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_the_sample_set_loads_and_its_reference_solutions_score_one():
    rows = [json.loads(line) for line in SAMPLE_PATH.read_text().splitlines()]
    prompts, answers = read_code_file(SAMPLE_PATH)
    assert len(prompts) == len(rows) == 10
    assert sum(parse_tests(a).fn_name is not None for a in answers) == 4
    solutions = [f"```python\n{json.loads(row['solutions'])[0]}```" for row in rows]
    batch = score_completions("code", solutions, answers, timeout_s=60.0, workers=2)
    assert batch.rewards == [1.0] * 10
    assert score_completions("code", ["```python\nprint(3)\n```"], answers[:1]).rewards == [1 / 3]


def test_the_code_spec_loads_through_load_prompts_with_a_time_limit():
    data = load_prompts("code:sample:time_limit_s=3", "prompt", "answer", CharEncoder(), 1024)
    assert len(data) == 10
    row = data.batch(0, 1)[0]
    assert "```python" in row.prompt and parse_tests(row.answer).time_limit_s == 3.0
    assert parse_code_spec("code:/data/taco.parquet") == (Path("/data/taco.parquet"), None)
    for bad in ("code:", "code:sample:time_limit_s=0", "code:/nope.parquet", "code:x.csv"):
        with pytest.raises(DatasetError):
            load_prompts(bad, "prompt", "answer", CharEncoder(), 1024)


def test_taco_and_code_contests_rows_from_parquet(tmp_path):
    path = tmp_path / "mixed.parquet"
    taco = {
        "question": "Add.",
        "input_output": json.dumps({"inputs": ["1 2"], "outputs": ["3"]}),
        "starter_code": "",
        "description": None,
        "public_tests": None,
        "private_tests": None,
    }
    contest = {
        "question": None,
        "input_output": None,
        "starter_code": None,
        "description": "Double it.",
        "public_tests": {"input": ["2\n"], "output": ["4\n"]},
        "private_tests": {"input": ["5\n"], "output": ["10\n"]},
    }
    pq.write_table(pa.Table.from_pylist([taco, contest]), path)
    prompts, answers = read_code_file(path)
    assert prompts[0].startswith("Add.") and prompts[1].startswith("Double it.")
    assert json.loads(answers[1]) == {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"]}
    program = "```python\nprint(2 * int(input()))\n```"
    assert score_completions("code", [program], [answers[1]], workers=1).rewards == [1.0]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"input_output": json.dumps({"inputs": ["1"], "outputs": ["1"]})}, "no problem text"),
        ({"question": "q"}, "no tests"),
        ({"question": "q", "input_output": "{not json"}, "not JSON"),
        (
            {"question": "q", "input_output": json.dumps({"inputs": ["1"], "outputs": []})},
            "equal length",
        ),
    ],
)
def test_a_bad_row_is_one_error_naming_the_row(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    good = {"question": "q", "input_output": json.dumps({"inputs": ["1"], "outputs": ["1"]})}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=f"row 1: .*{message}"):
        read_code_file(path)
