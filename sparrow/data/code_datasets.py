"""Code problems (TACO / APPS and CodeContests rows) as prompts with their tests as answers.

    from sparrow.data.code_datasets import read_code_file, SAMPLE_PATH
    prompts, answers = read_code_file(SAMPLE_PATH)          # answers: tests JSON for "code"
    # as a dataset spec: data.train=code:/data/taco.parquet data.reward=code
    #                    data.train=code:/data/taco.jsonl:time_limit_s=4

Rows (Parquet or JSONL) in either form:
- TACO / APPS: `question`, `input_output` (a JSON string or object with `inputs`, `outputs`
  and optional `fn_name`), optional `starter_code` (appended to the prompt);
- CodeContests: `description`, with `public_tests` and `private_tests` (each {input: [...],
  output: [...]}); `generated_tests` are left out (hundreds per row, slow to run each step).
The prompt is the problem, its starter code, and one line asking for a Python program (reading
stdin, or defining fn_name) in a ```python block. The answer is the JSON the code reward reads:
{"inputs", "outputs", "fn_name"?, "time_limit_s"?}; `time_limit_s=<seconds>` in the spec sets
every row's per-test limit (else the reward's default). A row without a problem or tests is a
DatasetError naming the file and row. The project's sample set (SAMPLE_PATH, spec
`code:sample`): ten short problems in TACO form with a reference solution each.
Tests: tests/data/test_code_datasets.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from sparrow.data.datasets import DatasetError

SAMPLE_PATH = Path(__file__).resolve().parents[1] / "assets" / "code" / "sample.jsonl"
SPEC_PREFIX = "code:"
STDIN_INSTRUCTION = (
    "Write a Python 3 program that reads the input from standard input and "
    "prints the answer. Give the program in one ```python block."
)
CALL_INSTRUCTION = (
    "Write a Python 3 function {name} that returns the answer. Give the code in "
    "one ```python block."
)
_COLUMNS = (
    "question",
    "description",
    "input_output",
    "starter_code",
    "public_tests",
    "private_tests",
)


def parse_code_spec(spec: str) -> tuple[Path, float | None]:
    """(path, time_limit_s) of "code:<path>[:time_limit_s=<seconds>]"; "code:sample" is the
    project's sample set."""
    rest = spec.removeprefix(SPEC_PREFIX)
    time_limit = None
    head, sep, option = rest.rpartition(":")
    if sep and option.startswith("time_limit_s="):
        try:
            time_limit = float(option.partition("=")[2])
        except ValueError:
            time_limit = -1.0
        if not time_limit > 0:
            raise DatasetError(f"dataset {spec!r}: time_limit_s must be a number > 0")
        rest = head
    if not rest:
        raise DatasetError(f"dataset {spec!r} names no file; use code:<path>.parquet or .jsonl")
    return (SAMPLE_PATH if rest == "sample" else Path(rest).expanduser()), time_limit


def read_code_file(path: Path, time_limit_s: float | None = None) -> tuple[list[str], list[str]]:
    """(prompts, answers) of a TACO / CodeContests file; every row checked."""
    if path.suffix not in (".parquet", ".jsonl"):
        raise DatasetError(f"code dataset {path}: use a .parquet or .jsonl file")
    if not path.is_file():
        raise DatasetError(f"code dataset file {path} does not exist")
    rows = _parquet_rows(path) if path.suffix == ".parquet" else _jsonl_rows(path)
    if not rows:
        raise DatasetError(f"code dataset {path} has no rows")
    prompts, answers = [], []
    for index, row in enumerate(rows):
        prompt, tests = code_row(row, f"code dataset {path}: row {index}")
        if time_limit_s is not None:
            tests["time_limit_s"] = time_limit_s
        prompts.append(prompt)
        answers.append(json.dumps(tests))
    return prompts, answers


def code_row(row: dict, where: str) -> tuple[str, dict]:
    """(prompt, tests) of one row; DatasetError starting with `where` if it has neither form."""
    problem = row.get("question") or row.get("description")
    if not isinstance(problem, str) or not problem.strip():
        raise DatasetError(f"{where}: no problem text (question or description)")
    if row.get("input_output") not in (None, ""):
        tests = _taco_tests(row["input_output"], where)
    elif row.get("public_tests") or row.get("private_tests"):
        tests = _contest_tests(row, where)
    else:
        raise DatasetError(f"{where}: no tests (input_output, or public_tests/private_tests)")
    parts = [problem.strip()]
    if isinstance(row.get("starter_code"), str) and row["starter_code"].strip():
        parts.append(row["starter_code"].rstrip())
    parts.append(
        CALL_INSTRUCTION.format(name=tests["fn_name"])
        if tests.get("fn_name")
        else STDIN_INSTRUCTION
    )
    return "\n\n".join(parts), tests


def _taco_tests(value, where: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}: input_output is not JSON: {err.msg}") from None
    if not isinstance(value, dict):
        raise DatasetError(f"{where}: input_output must be an object with inputs and outputs")
    inputs, outputs = value.get("inputs"), value.get("outputs")
    _check_pairs(inputs, outputs, where)
    tests = {"inputs": inputs, "outputs": outputs}
    if value.get("fn_name"):
        tests["fn_name"] = value["fn_name"]
    return tests


def _contest_tests(row: dict, where: str) -> dict:
    inputs, outputs = [], []
    for key in ("public_tests", "private_tests"):
        group = row.get(key) or {}
        inputs += list(group.get("input") or [])
        outputs += list(group.get("output") or [])
    _check_pairs(inputs, outputs, where)
    return {"inputs": inputs, "outputs": outputs}


def _check_pairs(inputs, outputs, where: str) -> None:
    if (
        not isinstance(inputs, list)
        or not isinstance(outputs, list)
        or not inputs
        or len(inputs) != len(outputs)
    ):
        raise DatasetError(f"{where}: the tests need non-empty inputs and outputs of equal length")


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        columns = [name for name in _COLUMNS if name in names]
        return pq.read_table(path, columns=columns).to_pylist()
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(f"code dataset {path} is not a readable Parquet file: {err}") from None


def _jsonl_rows(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"code dataset {path}: line {number} is not JSON: {err.msg}"
            ) from None
        if not isinstance(row, dict):
            raise DatasetError(f"code dataset {path}: line {number} is not a JSON object")
        rows.append(row)
    return rows
