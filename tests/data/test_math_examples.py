"""The shipped math set: the files are what the generator makes, every answer is what its
expression computes from the numbers in the problem, test problems are never trained on, and
`builtin:math-train` reads as a community-layout dataset the math reward scores.

python -m pytest tests/data/test_math_examples.py -q
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

import pyarrow.parquet as pq
import pytest

from sparrow.data.datasets import DatasetError, load_prompts
from sparrow.data.math_examples import SPLITS, make_rows
from sparrow.data.shipped import DATASETS_DIR, shipped_names
from sparrow.model import load_tokenizer

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> Fraction:
    """+, -, *, / and brackets over integers, exactly."""

    def walk(node):
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node.op, ast.Div):
            return walk(node.left) / walk(node.right)
        return OPERATORS[type(node.op)](walk(node.left), walk(node.right))

    return walk(ast.parse(expression, mode="eval").body)


@pytest.mark.parametrize("split", list(SPLITS))
def test_the_shipped_file_is_what_the_generator_makes(split):
    shipped = pq.read_table(DATASETS_DIR / f"math-{split}.parquet").to_pylist()
    assert shipped == make_rows(split) and len(shipped) == SPLITS[split]
    assert (DATASETS_DIR / f"math-{split}.parquet").stat().st_size < 100_000


@pytest.mark.parametrize("split", list(SPLITS))
def test_every_answer_is_its_expression_over_the_problems_numbers(split):
    for row in make_rows(split):
        text = row["prompt"][0]["content"]
        info = row["extra_info"]
        value = evaluate(info["expression"])
        assert (
            value.denominator == 1 and str(value.numerator) == row["reward_model"]["ground_truth"]
        )
        # the expression's numbers come from the text (bar the constants of its formula)
        numbers = set(re.findall(r"-?\d+", text))
        for number in re.findall(r"\d+", info["expression"]):
            assert number in {"1", "2", "100"} or number in numbers or f"-{number}" in numbers, (
                text,
                info["expression"],
            )
        assert text.endswith("within \\boxed{}.")
        assert row["data_source"] in ("sparrow/arithmetic", "sparrow/algebra")


def test_splits_are_disjoint_deterministic_and_cover_both_sources():
    train, test = make_rows("train"), make_rows("test")
    prompts = {r["prompt"][0]["content"] for r in train}
    assert len(prompts) == len(train)
    assert not prompts & {r["prompt"][0]["content"] for r in test}
    assert (
        make_rows("train", 20, seed=3) == make_rows("train", 20, seed=3) != make_rows("train", 20)
    )
    assert {r["data_source"] for r in test} == {"sparrow/arithmetic", "sparrow/algebra"}


def test_builtin_names_read_the_shipped_files(qwen3_checkpoint):
    from sparrow.data.chat import chat_renderer

    assert {"builtin:math-train", "builtin:math-test"} <= set(shipped_names())
    tokenizer = load_tokenizer(qwen3_checkpoint)
    chat = chat_renderer(qwen3_checkpoint, "builtin:qwen3", enable_thinking=False)
    data = load_prompts(
        "builtin:math-test", "prompt", "answer", tokenizer, 1024, split="eval", chat=chat
    )
    assert len(data) == 100 and not data.endless
    row = data.row(0)
    first = make_rows("test")[0]
    assert row.answer == first["reward_model"]["ground_truth"]
    assert row.data_source == first["data_source"]
    assert row.prompt.startswith("<|im_start|>user\n" + first["prompt"][0]["content"])
    with pytest.raises(DatasetError, match="builtin:math-tests.*builtin:math-test"):
        load_prompts("builtin:math-tests", "prompt", "answer", tokenizer, 1024)


def test_the_math_reward_scores_a_boxed_ground_truth():
    from sparrow.data.rewards import REWARD_FUNCTIONS

    math = REWARD_FUNCTIONS.get("math")
    rows = make_rows("test")[:12]
    for row in rows:
        answer = row["reward_model"]["ground_truth"]
        assert math(f"so it is \\boxed{{{answer}}}", answer) == 1.0
        assert math(f"so it is \\boxed{{{int(answer) + 1}}}", answer) == 0.0
