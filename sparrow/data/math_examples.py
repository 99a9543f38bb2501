"""A small math set in the community layout: arithmetic and algebra word problems with known
integer answers, made from a seed.

    python -m sparrow.data.math_examples --out sparrow/assets/datasets   # the shipped files
    rows = make_rows("train", count=400, seed=0)     # dicts in the community layout

Each row is what verl's preprocessors write: `prompt` one user message ending in the
instruction to box the answer, `reward_model.ground_truth` the answer, `data_source`
`sparrow/arithmetic` or `sparrow/algebra`, `ability` math, and `extra_info` with the split,
index, template and the expression that computes the answer from the numbers in the text
(tests/data/test_math_examples.py evaluates it). The rows of a split depend only on (split,
count, seed); the test split is made first and train skips its problems, so no test problem
is trained on. The shipped files (sparrow/assets/datasets/math-train.parquet, 400 rows, and
math-test.parquet, 100 rows) are read as `builtin:math-train` and `builtin:math-test`
(sparrow/data/shipped.py) and scored by data.reward=math.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
SPLITS = {"test": 100, "train": 400}  # made in this order: train avoids the test problems
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jon")
ITEMS = ("apple", "marble", "pencil", "sticker", "card", "book", "shell", "coin")

# a template draws its numbers and returns (source, template, problem, answer, expression)
Problem = tuple[str, str, str, int, str]


def _shopping(rng: random.Random) -> Problem:
    name, friend = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a, b = rng.randint(5, 60), rng.randint(2, 40)
    c = rng.randint(1, a + b - 1)
    text = (
        f"{name} has {a} {item}s, gets {b} more from a shop and then gives {c} to {friend}. "
        f"How many {item}s does {name} have now?"
    )
    return "sparrow/arithmetic", "shopping", text, a + b - c, f"{a} + {b} - {c}"


def _boxes(rng: random.Random) -> Problem:
    item = rng.choice(ITEMS)
    a, b = rng.randint(3, 25), rng.randint(2, 15)
    text = f"A box holds {a} {item}s. How many {item}s are there in {b} full boxes?"
    return "sparrow/arithmetic", "boxes", text, a * b, f"{a} * {b}"


def _sharing(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    each, friends = rng.randint(2, 20), rng.randint(2, 12)
    total = each * friends
    text = (
        f"{name} shares {total} {item}s equally among {friends} friends. "
        f"How many {item}s does each friend get?"
    )
    return "sparrow/arithmetic", "sharing", text, each, f"{total} / {friends}"


def _change(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    count, price = rng.randint(2, 9), rng.randint(2, 11)
    bill = rng.choice([bill for bill in (20, 50, 100) if bill > count * price])
    text = (
        f"{name} buys {count} {item}s at {price} dollars each and pays with a {bill}-dollar "
        f"bill. How many dollars of change does {name} get?"
    )
    return "sparrow/arithmetic", "change", text, bill - count * price, f"{bill} - {count} * {price}"


def _discount(rng: random.Random) -> Problem:
    price, percent = 20 * rng.randint(1, 15), rng.choice((10, 15, 20, 25, 30, 40, 50))
    text = (
        f"A jacket costs {price} dollars and is sold at {percent}% off. "
        f"What is the sale price in dollars?"
    )
    answer = price * (100 - percent) // 100
    return "sparrow/arithmetic", "discount", text, answer, f"{price} * (100 - {percent}) / 100"


def _linear(rng: random.Random) -> Problem:
    x, a, b = rng.randint(-12, 15), rng.randint(2, 9), rng.randint(1, 30)
    c = a * x + b
    text = f"Solve for x: {a}x + {b} = {c}."
    return "sparrow/algebra", "linear", text, x, f"({c} - {b}) / {a}"


def _bracket(rng: random.Random) -> Problem:
    x, a, b = rng.randint(-10, 20), rng.randint(2, 8), rng.randint(1, 12)
    c = a * (x - b)
    text = f"Solve for x: {a}(x - {b}) = {c}."
    return "sparrow/algebra", "bracket", text, x, f"{c} / {a} + {b}"


def _sum_difference(rng: random.Random) -> Problem:
    small = rng.randint(1, 50)
    large = small + rng.randint(1, 40)
    total, difference = large + small, large - small
    text = (
        f"The sum of two numbers is {total} and their difference is {difference}. "
        f"What is the larger number?"
    )
    return "sparrow/algebra", "sum_difference", text, large, f"({total} + {difference}) / 2"


def _ages(rng: random.Random) -> Problem:
    name, friend = rng.sample(NAMES, 2)
    young, times, years = rng.randint(2, 15), rng.randint(2, 4), rng.randint(2, 10)
    total = times * young + young + 2 * years
    text = (
        f"{name} is {times} times as old as {friend}. In {years} years the sum of their ages "
        f"will be {total}. How old is {name} now?"
    )
    expression = f"{times} * ({total} - 2 * {years}) / ({times} + 1)"
    return "sparrow/algebra", "ages", text, times * young, expression


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    _shopping,
    _boxes,
    _sharing,
    _change,
    _discount,
    _linear,
    _bracket,
    _sum_difference,
    _ages,
)


def _problems(split: str, count: int, seed: int, skip: set[str]) -> list[Problem]:
    rng = random.Random(f"sparrow-math:{seed}:{split}")
    problems: list[Problem] = []
    seen = set(skip)
    while len(problems) < count:
        problem = rng.choice(TEMPLATES)(rng)
        if problem[2] not in seen:
            seen.add(problem[2])
            problems.append(problem)
    return problems


def make_rows(split: str, count: int | None = None, seed: int = 0) -> list[dict]:
    """`count` rows (default: the shipped size) of a split in the community layout."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    skip = (
        set() if split == "test" else {p[2] for p in _problems("test", SPLITS["test"], seed, set())}
    )
    problems = _problems(split, SPLITS[split] if count is None else count, seed, skip)
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": f"{text} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {
                "split": split,
                "index": index,
                "template": template,
                "expression": expression,
            },
        }
        for index, (source, template, text, answer, expression) in enumerate(problems)
    ]


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for math-<split>.parquet")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for split in SPLITS:
        path = write_parquet(make_rows(split, seed=args.seed), args.out / f"math-{split}.parquet")
        print(f"{path}: {SPLITS[split]} rows, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
