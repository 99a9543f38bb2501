"""The synthetic lookup_sum task: deterministic, and its answers follow from the prompt alone."""

import re

import pytest

from sparrow.data.synthetic import ALPHABET, make_examples
from sparrow.errors import SparrowError


def _solve(prompt: str) -> str:
    defs_line, sum_line = prompt.strip().split("\n")
    values = dict(item.split("=") for item in defs_line.removeprefix("def ").split())
    return str(sum(int(values[name]) for name in sum_line.removeprefix("sum ").split()) % 10)


def test_answers_follow_from_the_prompt():
    for ex in make_examples("lookup_sum", 50, seed=3):
        assert ex.answer == _solve(ex.prompt)
        assert ex.completion.endswith(f"Answer: {ex.answer}")


def test_chain_of_thought_lines_look_up_and_accumulate():
    ex = make_examples("lookup_sum", 1, seed=1)[0]
    values = dict(item.split("=") for item in ex.prompt.split("\n")[0].removeprefix("def ").split())
    total = 0
    for line in ex.completion.split("\n")[:-1]:
        name, value, running = re.fullmatch(r"(\w\w)=(\d) s(\d)", line).groups()
        assert values[name] == value
        total = (total + int(value)) % 10
        assert int(running) == total


def test_same_seed_same_examples_and_alphabet_covers_text():
    a = make_examples("lookup_sum", 5, seed=7)
    assert a == make_examples("lookup_sum", 5, seed=7)
    assert a != make_examples("lookup_sum", 5, seed=8)
    assert set("".join(e.prompt + e.completion for e in a)) <= set(ALPHABET)


def test_sizes_and_errors():
    ex = make_examples("lookup_sum", 1, seed=0, num_defs=6, num_terms=3)[0]
    assert len(ex.prompt.split("\n")[0].split()) == 7 and ex.completion.count("\n") == 3
    with pytest.raises(SparrowError, match="known: lookup_sum"):
        make_examples("nope", 1, seed=0)
    with pytest.raises(SparrowError, match="num_terms"):
        make_examples("lookup_sum", 1, seed=0, num_defs=2, num_terms=3)


def _follow(prompt: str) -> tuple[str, list[str]]:
    defs_line, from_line = prompt.strip().split("\n")
    targets = dict(item.split("=") for item in defs_line.removeprefix("def ").split())
    _, start, _, hops = from_line.split()
    path = [start]
    for _ in range(int(hops)):
        path.append(targets[path[-1]])
    return path[-1], path


def test_pointer_chase_answer_is_where_the_hops_land():
    for ex in make_examples("pointer_chase", 50, seed=5):
        answer, path = _follow(ex.prompt)
        assert ex.answer == answer
        lines = ex.completion.split("\n")
        assert lines[:-1] == [f"{a}={b}" for a, b in zip(path, path[1:])]
        assert lines[-1] == f"Answer: {answer}"
        assert set(ex.prompt + ex.completion) <= set(ALPHABET)


def test_pointer_chase_sizes():
    ex = make_examples("pointer_chase", 1, seed=0, num_defs=5, num_hops=2)[0]
    assert len(ex.prompt.split("\n")[0].split()) == 6 and ex.completion.count("\n") == 2
    with pytest.raises(SparrowError, match="num_hops"):
        make_examples("pointer_chase", 1, seed=0, num_defs=3, num_hops=3)
